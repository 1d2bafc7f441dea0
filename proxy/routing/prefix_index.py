"""Per worker, which prefix blocks it probably holds in its KV cache.

Rule:
  * One bounded LRU per worker of chained block hashes (see ``prefix_key``), each block weighted
    by its length in tokens; the capacity is the worker's KV pool (``max_total_tokens``, or a
    default until the worker has been scraped). Total tokens never exceed the capacity.
  * Fed by routing decisions: ``record`` touches every block of the routed prompt, tail first and
    head last, so the head is the most recent and eviction takes tails first — as SGLang's radix
    cache evicts leaves first. The set of blocks held therefore stays prefix-closed, and
    ``match`` finds the longest held prefix by binary search.
  * Each block is *predicted* when a decision put it there and *confirmed* once a request that
    contains it finished on that worker (the worker prefilled it, so it held it).
  * Corrected by what workers report. When a request's reported ``cached_tokens`` fall short of
    the confirmed blocks it matched at decision time, the worker evicted blocks we still list:
    it keeps less of our traffic than we assumed (its KV pool also holds decode tokens and other
    proxies' traffic). The capacity then shrinks multiplicatively (x``SHRINK``, evicting the
    oldest entries) and each confirmed prediction recovers part of the gap to the KV pool
    (AIMD, as TCP). Only confirmed blocks count as evidence, so a burst of requests sharing a
    prefix that is still being prefilled is not mistaken for an eviction. The blocks of the
    finished request itself stay: the worker has just prefilled them.
  * Reset when the worker's snapshot ``generation`` changes (restart, cache flush); dropped when
    the worker leaves.

Complexity: ``match`` O(log blocks) dict lookups; ``record`` O(blocks of the prompt); memory about
200 bytes per block held (8 workers x 500k tokens in 16-token blocks ~ 50 MB worst case).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.routing.base import WorkerSnapshot
from proxy.routing.prefix_key import block_sizes, prefix_tokens

# Capacity assumed before a worker reports its KV pool size (Llama-3-8B on one H100, as llm-d).
DEFAULT_CAPACITY_TOKENS = 500_000
# The learned capacity never falls below this share of the KV pool.
MIN_CAPACITY_FRACTION = 0.05
# Share of the gap to the KV pool recovered per confirmed prediction.
CAPACITY_RECOVERY = 0.05

# On eviction evidence the capacity is multiplied by this.
SHRINK = 0.7

# A block's entry packs (tokens, confirmed) into one small int.
_CONFIRMED = 1


@dataclass(frozen=True, slots=True)
class Match:
    """How much of a prompt one worker probably holds, in leading blocks."""

    blocks: int = 0
    # Leading blocks confirmed by a finished request (a subset of ``blocks``).
    confirmed: int = 0


class WorkerIndex:
    """The bounded LRU of one worker."""

    __slots__ = ("_blocks", "capacity", "generation", "kv_tokens", "tokens")

    def __init__(self, kv_tokens: int, generation: int = 0) -> None:
        # block hash -> (tokens << 1) | confirmed; order = recency, oldest first.
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self.kv_tokens = max(1, kv_tokens)
        self.capacity = self.kv_tokens
        self.tokens = 0
        self.generation = generation

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def match(self, hashes: Sequence[int]) -> Match:
        blocks = self._blocks
        held = _longest(hashes, blocks.__contains__)
        confirmed = _longest(hashes[:held], lambda h: bool(blocks[h] & _CONFIRMED))
        return Match(held, confirmed)

    def record(
        self, hashes: Sequence[int], block_tokens: int, *, confirmed: bool = False, held: int | None = None
    ) -> None:
        """Touch every block of a routed (or finished, ``confirmed``) prompt, tail first.

        ``held``: leading blocks already held (``match(hashes).blocks``) if the caller knows.
        """
        blocks = self._blocks
        if held is None:
            held = _longest(hashes, blocks.__contains__)
        flag = _CONFIRMED if confirmed else 0
        tail = hashes[held:]
        if any(map(blocks.__contains__, tail)):
            self._record_one_by_one(hashes, block_tokens, flag)
        else:
            head = hashes[:held]
            if flag:
                for h in head:
                    blocks[h] |= _CONFIRMED
            sizes = block_sizes(block_tokens, len(hashes))[held:]
            # Oldest first: the tail's last block, ..., its first; then the held head, block 0 last.
            blocks.update(zip(reversed(tail), [(size << 1) | flag for size in reversed(sizes)], strict=True))
            self.tokens += sum(sizes)
            deque(map(blocks.move_to_end, reversed(head)), maxlen=0)
        if self.tokens > self.capacity:
            self._evict()

    def _record_one_by_one(self, hashes: Sequence[int], block_tokens: int, flag: int) -> None:
        blocks = self._blocks
        sizes = block_sizes(block_tokens, len(hashes))
        for i in range(len(hashes) - 1, -1, -1):
            h = hashes[i]
            entry = blocks.get(h)
            if entry is None:
                self.tokens += sizes[i]
                blocks[h] = (sizes[i] << 1) | flag
            else:
                blocks[h] = entry | flag
                blocks.move_to_end(h)

    def correct(self, block_tokens: int, confirmed_blocks: int, cached_tokens: int) -> None:
        """Learn from a finished request that matched ``confirmed_blocks`` confirmed blocks."""
        if confirmed_blocks <= 0:
            return
        predicted = prefix_tokens(confirmed_blocks, block_tokens)
        # One block of slack: token counts are estimates and the worker rounds to pages.
        slack = predicted - prefix_tokens(confirmed_blocks - 1, block_tokens)
        if cached_tokens + slack >= predicted:
            self.capacity += int((self.kv_tokens - self.capacity) * CAPACITY_RECOVERY)
        else:
            floor = max(1, int(self.kv_tokens * MIN_CAPACITY_FRACTION))
            self.capacity = max(floor, int(self.capacity * SHRINK))
            self._evict()

    def resize(self, kv_tokens: int) -> None:
        kv_tokens = max(1, kv_tokens)
        if kv_tokens != self.kv_tokens:
            self.capacity = max(1, self.capacity * kv_tokens // self.kv_tokens)
            self.kv_tokens = kv_tokens
            self._evict()

    def _evict(self) -> None:
        blocks, tokens, capacity = self._blocks, self.tokens, self.capacity
        popitem = blocks.popitem
        while tokens > capacity and blocks:
            tokens -= popitem(False)[1] >> 1
        self.tokens = tokens


def _longest(hashes: Sequence[int], held: Callable[[int], bool]) -> int:
    """Largest k with ``held(hashes[k-1])``, assuming the held set is prefix-closed."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if held(hashes[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class PrefixIndex:
    """The ``WorkerIndex`` of every known worker, kept in step with worker snapshots."""

    def __init__(self, default_capacity_tokens: int = DEFAULT_CAPACITY_TOKENS) -> None:
        self.default_capacity_tokens = default_capacity_tokens
        self._workers: dict[str, WorkerIndex] = {}

    def sync(self, workers: Sequence[WorkerSnapshot], *, drop_missing: bool = False) -> None:
        """Reset on a new generation, resize on a new KV size, and (optionally) drop the gone."""
        for w in workers:
            kv = w.max_total_tokens or self.default_capacity_tokens
            index = self._workers.get(w.url)
            if index is None or index.generation != w.generation:
                self._workers[w.url] = WorkerIndex(kv, w.generation)
            elif index.kv_tokens != kv:
                index.resize(kv)
        if drop_missing:
            present = {w.url for w in workers}
            for url in [u for u in self._workers if u not in present]:
                del self._workers[url]

    def worker(self, url: str) -> WorkerIndex:
        index = self._workers.get(url)
        if index is None:
            index = self._workers[url] = WorkerIndex(self.default_capacity_tokens)
        return index

    def held(self, url: str, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` that ``url`` probably holds (``match(...).blocks``)."""
        index = self._workers.get(url)
        return _longest(hashes, index._blocks.__contains__) if index is not None else 0

    def confirmed(self, url: str, hashes: Sequence[int], held: int) -> int:
        """Leading blocks confirmed, among the first ``held`` (known to be held)."""
        index = self._workers.get(url)
        if index is None or held <= 0:
            return 0
        blocks = index._blocks
        return _longest(hashes[:held], lambda h: bool(blocks[h] & _CONFIRMED))

    def match(self, url: str, hashes: Sequence[int]) -> Match:
        index = self._workers.get(url)
        return index.match(hashes) if index is not None else Match()

    def record(self, url: str, hashes: Sequence[int], block_tokens: int, *, held: int | None = None) -> None:
        self.worker(url).record(hashes, block_tokens, held=held)

    def complete(
        self, url: str, hashes: Sequence[int], block_tokens: int, *, confirmed_blocks: int, cached_tokens: int | None
    ) -> None:
        """A request finished on ``url``: correct by its report, then confirm its blocks."""
        index = self._workers.get(url)
        if index is None:
            return
        if cached_tokens is not None:
            index.correct(block_tokens, confirmed_blocks, cached_tokens)
        index.record(hashes, block_tokens, confirmed=True)

    def urls(self) -> list[str]:
        return list(self._workers)

    def __contains__(self, url: str) -> bool:
        return url in self._workers


class FleetCache:
    """One LRU of the whole fleet's KV capacity: the prefix hits a perfect router could capture.

    "Available" hit tokens of a request = what this single cache, fed every request in order,
    already holds of its prompt; comparing it with what workers report (captured) tells routing
    losses apart from workload limits.
    """

    def __init__(self, capacity_tokens: int) -> None:
        self._index = WorkerIndex(capacity_tokens)

    @property
    def capacity(self) -> int:
        return self._index.kv_tokens

    def resize(self, capacity_tokens: int) -> None:
        self._index.resize(capacity_tokens)

    def observe(self, hashes: Sequence[int], block_tokens: int, prompt_tokens: int) -> int:
        """Available cached tokens for this prompt; then the prompt joins the cache."""
        held = self._index.match(hashes).blocks
        self._index.record(hashes, block_tokens, held=held)
        return min(prefix_tokens(held, block_tokens), prompt_tokens)
