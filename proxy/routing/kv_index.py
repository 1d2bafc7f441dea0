"""One worker's KV cache as its engine's events describe it: exact, in tokens (pure).

The engine names a block by its own hash, which the proxy cannot recompute (``kv_events``). So
each stored block gets a key of ours, chained over token ids exactly as a request's own keys are
(``chain_keys``): ``key[0] = xxh3_64(tokens of block 0, seed=ROOT)``, ``key[i] =
xxh3_64(tokens of block i, seed=key[i-1])``, one key per engine block (``block_size`` tokens).
A block whose parent we never saw (stored before we subscribed, or in a batch we lost) cannot be
chained and is left out: the index then under-counts, which costs a recompute, never a wrong
promise. ``BlockRemoved`` finds our key through the engine's hash.

A request's match on the worker is its leading full blocks held there, counted as the engine
matches (it stops at the first block it lacks): ``match``. It also says whether that first missing
block is one the engine reported removed (``evicted``): a block the events never mentioned may be
one the engine is storing right now (its event not here yet, while the answer's first token may
be), so only a reported removal is evidence that a prefix routing believes cached is gone.

Bounded: at most ``max_blocks`` blocks per worker (an engine's pool holds fewer; a worker that
claims more is ignored past the cap and counted in ``refused``).

Cost: ``chain_keys`` hashes each full block once (one xxh3 over its 4-byte token ids; ~0.3 µs a
block), a match is one dict lookup per matched block, an event one dict update per block.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

import xxhash

from proxy.workers.kv_events import BlockHash, Cleared, Event, Removed, Stored

ROOT = xxhash.xxh3_64_intdigest(b"radixgate kv-events v1")
# The hierarchical cache also reports host-memory and disk tiers; only GPU blocks skip prefill.
GPU_MEDIA = (None, "GPU", "gpu")


def chain_keys(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None) -> list[int]:
    """Our key of each full ``block_size``-token block of ``token_ids``, in order."""
    ids = token_ids if isinstance(token_ids, array) and token_ids.typecode == "I" else array("I", token_ids)
    view = memoryview(ids).cast("B")
    step = block_size * ids.itemsize
    n = len(ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    keys, key = [], ROOT
    for i in range(n):
        key = xxhash.xxh3_64_intdigest(view[i * step:(i + 1) * step], seed=key)
        keys.append(key)
    return keys


# The last prompt's keys: a decision matches one prompt against every worker's table (same page
# size), so its keys are hashed once, not once per worker. Held by reference, so identity is exact.
_last: tuple[Sequence[int] | None, int, list[int]] = (None, 0, [])


def _keys_of(token_ids: Sequence[int], block_size: int) -> list[int]:
    global _last
    ids, size, keys = _last
    if ids is token_ids and size == block_size:
        return keys
    keys = chain_keys(token_ids, block_size)
    _last = (token_ids, block_size, keys)
    return keys


class Match(NamedTuple):
    tokens: int
    # The first block past the match was removed by the engine (or its cache cleared).
    evicted: bool


# A stream that has stored nothing has no block size yet: a prompt this long spans at least one
# page of any engine's (SGLang's and vLLM's page sizes are 1-64).
UNKNOWN_BLOCK_SIZE = 128

# Keys of removed blocks remembered (what says "evicted" rather than "not stored yet").
REMOVED_MEMORY = 1 << 16


class EngineBlocks:
    def __init__(self, max_blocks: int = 1 << 20) -> None:
        self.max_blocks = max_blocks
        self.block_size: int | None = None
        self._key_of: dict[BlockHash, int] = {}
        self._held: dict[int, int] = {}  # our key -> how many engine blocks carry it
        self._removed: OrderedDict[int, None] = OrderedDict()
        self._cleared = False  # since a clear, anything absent counts as evicted
        self.orphans = 0  # stored blocks left out: their parent was never seen
        self.refused = 0  # stored blocks left out: over max_blocks
        self.clears = 0

    def __len__(self) -> int:
        return len(self._key_of)

    def apply(self, event: Event) -> None:
        if isinstance(event, Stored):
            self._store(event)
        elif isinstance(event, Removed):
            if event.medium in GPU_MEDIA:
                for h in event.hashes:
                    self._drop(h)
        elif isinstance(event, Cleared):
            self.clear()

    def clear(self) -> None:
        self._key_of.clear()
        self._held.clear()
        self._removed.clear()
        self._cleared = True
        self.clears += 1

    def _store(self, event: Stored) -> None:
        if event.medium not in GPU_MEDIA:
            return
        if self.block_size != event.block_size:
            # One page size per engine: a new one means a new engine behind this address.
            if self._key_of:
                self.clear()
            self.block_size = event.block_size
        if event.parent is None:
            key = ROOT
        elif event.parent in self._key_of:
            key = self._key_of[event.parent]
        else:
            self.orphans += len(event.hashes)
            return
        if event.scoped:
            # Under an adapter, a salt or multimodal inputs: kept (a later BlockRemoved names them)
            # where no lookup by tokens alone can reach them, and so neither can their children.
            key = xxhash.xxh3_64_intdigest(b"scoped", seed=key)
        ids = event.token_ids if isinstance(event.token_ids, array) else array("I", event.token_ids)
        view = memoryview(ids).cast("B")
        step = event.block_size * ids.itemsize
        for i, h in enumerate(event.hashes):
            chunk = view[i * step:(i + 1) * step]
            key = xxhash.xxh3_64_intdigest(chunk, seed=key)
            if h in self._key_of:
                continue  # stored twice (at-least-once delivery): already counted
            if len(self._key_of) >= self.max_blocks:
                self.refused += len(event.hashes) - i
                return
            self._key_of[h] = key
            self._held[key] = self._held.get(key, 0) + 1
            self._removed.pop(key, None)

    def _drop(self, h: BlockHash) -> None:
        key = self._key_of.pop(h, None)
        if key is None:
            return
        left = self._held[key] - 1
        if left:
            self._held[key] = left
            return
        del self._held[key]
        self._removed[key] = None
        if len(self._removed) > REMOVED_MEMORY:
            self._removed.popitem(last=False)

    def matched_blocks(self, keys: Sequence[int]) -> int:
        """Leading ``keys`` (from ``chain_keys`` at this engine's block size) held here."""
        held = self._held
        for i, key in enumerate(keys):
            if key not in held:
                return i
        return len(keys)

    def match(self, token_ids: Sequence[int]) -> Match:
        if self.block_size is None:
            return Match(0, self._cleared)
        keys = _keys_of(token_ids, self.block_size)
        n = self.matched_blocks(keys)
        evicted = n < len(keys) and (self._cleared or keys[n] in self._removed)
        return Match(n * self.block_size, evicted)

    def matched_tokens(self, token_ids: Sequence[int]) -> int:
        return self.match(token_ids).tokens

    def seen(self, token_ids: Sequence[int]) -> bool | None:
        """Whether the events ever told of this prompt's leading block (held, or removed since);
        None where the prompt is shorter than one block (nothing to tell). ``kv_trust`` asks it
        of prompts the engine has prefilled."""
        size = self.block_size or UNKNOWN_BLOCK_SIZE  # nothing stored yet: its pages are at most this
        if len(token_ids) < size:
            return None
        if self.block_size is None:
            return False
        key = _keys_of(token_ids, self.block_size)[0]
        return key in self._held or key in self._removed
