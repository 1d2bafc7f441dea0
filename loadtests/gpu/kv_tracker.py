"""KV cache events for the GPU engine shim, from what its engine's block manager holds.

transformers' continuous batching keeps a hash table of its complete, cached blocks
(``BlockManager._hash_to_id``; a block's hash is ``compute_hash(parent_hash, tokens)``) but
publishes no events. The shim knows every prompt it submitted, so it can compute each prompt
block's hash with the engine's own function (``BlockChains``) and, by diffing the table between
two looks (``KvTracker.diff``), publish what SGLang's ``--kv-events-config`` would: ``BlockStored``
(hash, parent hash, the block's token ids, block size) for a block that appeared, ``BlockRemoved``
for one that went, ``AllBlocksCleared`` after a flush. Blocks of generated tokens are not
prompts the shim knows and are left out (the proxy's index matches prompts). Pure: no torch,
no sockets, so the tests drive it with a stand-in table.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Event = list[Any]


def engine_hash(compute_hash: Callable[..., int], group_id: int = 0) -> Callable[[int | None, list[int]], int]:
    """The engine's block hash as ``(parent hash, tokens) -> hash``. Releases differ: some hash
    ``(parent, tokens)``, later ones ``(parent, tokens, group_id)`` (the layer group; a model of
    full-attention layers only has group 0). A wrong guess names no block the engine holds, and
    the stream would say nothing was ever stored."""
    params = [q for q in inspect.signature(compute_hash).parameters.values()
              if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
    if len(params) >= 3:
        return lambda parent, tokens: compute_hash(parent, tokens, group_id)
    return compute_hash


class BlockChains:
    """hash -> (parent hash, token ids, depth) of the complete blocks of recent prompts (bounded)."""

    def __init__(self, compute_hash: Callable[[int | None, list[int]], int], block_size: int,
                 capacity: int = 200_000) -> None:
        self.compute_hash, self.block_size, self.capacity = compute_hash, block_size, capacity
        self._blocks: OrderedDict[int, tuple[int | None, list[int], int]] = OrderedDict()

    def add_prompt(self, ids: Sequence[int]) -> None:
        parent: int | None = None
        for depth, start in enumerate(range(0, len(ids) - self.block_size + 1, self.block_size)):
            tokens = list(ids[start:start + self.block_size])
            h = self.compute_hash(parent, tokens)
            self._blocks[h] = (parent, tokens, depth)
            self._blocks.move_to_end(h)
            parent = h
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def get(self, h: int) -> tuple[int | None, list[int], int] | None:
        return self._blocks.get(h)


class KvTracker:
    """What changed in the engine's table since the last look, as SGLang's events."""

    def __init__(self, chains: BlockChains) -> None:
        self.chains = chains
        self.published: set[int] = set()
        # Engine blocks no chain of ours names (generated tokens, or a hash we compute wrongly:
        # the shim logs it when they are all there is).
        self.unknown = 0

    def diff(self, present: Iterable[int]) -> list[Event]:
        now = set(present)
        self.unknown = sum(1 for h in now if self.chains.get(h) is None)
        gone = [h for h in self.published if h not in now]
        events: list[Event] = [["BlockRemoved", gone]] if gone else []
        self.published.difference_update(gone)
        new = [(known[2], h, known[0], known[1]) for h in now
               if h not in self.published and (known := self.chains.get(h)) is not None]
        # parents before children, so a subscriber can chain every block it is told of
        for _, h, parent, tokens in sorted(new, key=lambda n: n[0]):
            events.append(["BlockStored", [h], parent, tokens, self.chains.block_size, None])
            self.published.add(h)
        return events

    def cleared(self) -> list[Event]:
        self.published.clear()
        return [["AllBlocksCleared"]]
