"""Per worker, which prefix blocks it probably holds in its KV cache.

Rule:
  * One bounded LRU per worker of chained block hashes (see ``prefix_key``), each block weighted
    by its length in tokens; the capacity is the worker's KV pool (``max_total_tokens``, or a
    default until the worker has been scraped). Total tokens never exceed the capacity.
  * Fed by routing decisions: ``record`` touches every block of the routed prompt, tail first and
    head last, so the head is the most recent and eviction takes tails first — as SGLang's radix
    cache evicts leaves first. The set of blocks held therefore stays prefix-closed, and
    ``match`` finds the longest held prefix by binary search. A block is stamped with the index's
    touch counter when it is inserted and whenever a finished request confirms it (restamping on
    every routing decision would cost the decision path a Python loop per block).
  * Each block is *predicted* when a decision put it there and *confirmed* once a request that
    contains it finished on that worker (the worker prefilled it, so it held it).
  * Corrected by what workers report. A request whose reported ``cached_tokens`` fall short of
    the confirmed blocks it matched shows that the worker had evicted block k (the first one
    not reported) while we still listed it. The worker evicts least recently used first, so
    everything we last touched before block k (as stamped when the request was routed) is gone
    there too: those entries are evicted here, oldest first (by stamp, which can only be older
    than the true last use, so the correction errs on keeping). The blocks of the finished request
    itself stay, confirmed: the worker has just prefilled them. Only confirmed blocks count as
    evidence, so a burst of requests sharing a prefix still being prefilled is not mistaken for
    an eviction. This keeps the index in step with a worker whose cache turns over faster than
    our own traffic explains (decode tokens, other proxies), without forgetting more than it
    must: a forgotten prefix scatters its next requests across workers.
  * Reset when the worker's snapshot ``generation`` changes (restart, cache flush); dropped when
    the worker leaves.

Complexity: ``match`` O(log blocks) dict lookups; ``record`` O(blocks of the prompt); memory about
130 bytes per block held (8 workers x 500k tokens in 16-token blocks: ~30 MB of Python heap).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from proxy.routing.base import WorkerSnapshot
from proxy.routing.prefix_key import block_sizes, blocks_within, prefix_tokens

# Capacity assumed before a worker reports its KV pool size (Llama-3-8B on one H100, as llm-d).
DEFAULT_CAPACITY_TOKENS = 500_000

# A cached-tokens report this far under the prediction (a share of it) is estimate error, not an
# eviction (``WorkerIndex.correct``).
EVICTION_SLACK = 0.10

# A block's entry packs (last touch, tokens, confirmed) into one int.
_CONFIRMED = 1
_TOUCH_SHIFT = 33  # tokens take bits 1..32
_LOW = (1 << _TOUCH_SHIFT) - 1


@dataclass(frozen=True, slots=True)
class Match:
    """How much of a prompt one worker probably holds, in leading blocks."""

    blocks: int = 0
    # Leading blocks confirmed by a finished request (a subset of ``blocks``).
    confirmed: int = 0


class WorkerIndex:
    """The bounded LRU of one worker."""

    __slots__ = ("_blocks", "_touches", "capacity", "generation", "kv_tokens", "tokens")

    def __init__(self, kv_tokens: int, generation: int = 0) -> None:
        # block hash -> (last touch << 33) | (tokens << 1) | confirmed; order = recency, oldest first.
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._touches = 0
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

    def last_touches(self, hashes: Sequence[int]) -> tuple[int, ...]:
        """When each of these (held) blocks was last touched: evidence for ``correct``."""
        blocks = self._blocks
        return tuple(blocks[h] >> _TOUCH_SHIFT for h in hashes)

    def record(
        self, hashes: Sequence[int], block_tokens: int, *, confirmed: bool = False, held: int | None = None
    ) -> None:
        """Touch every block of a routed (or finished, ``confirmed``) prompt, tail first.

        ``held``: leading blocks already held (``match(hashes).blocks``) if the caller knows.
        """
        blocks = self._blocks
        if held is None:
            held = _longest(hashes, blocks.__contains__)
        self._touches += 1
        stamp = self._touches << _TOUCH_SHIFT
        flag = _CONFIRMED if confirmed else 0
        tail = hashes[held:]
        holes = any(map(blocks.__contains__, tail))
        if holes:  # blocks held beyond a missing one (a hash collision): go one by one
            head: Sequence[int] = hashes
        else:
            head = hashes[:held]
            sizes = block_sizes(block_tokens, len(hashes))[held:]
            # Oldest first: the tail's last block, ..., its first; then the held head, block 0 last.
            blocks.update(zip(reversed(tail), [stamp | (size << 1) | flag for size in reversed(sizes)], strict=True))
            self.tokens += sum(sizes)
        if confirmed or holes:
            # Off the decision path (or a prompt with holes): restamp and confirm one by one.
            pop = blocks.pop
            for i in range(len(head) - 1, -1, -1):
                h = head[i]
                entry = pop(h, None)
                if entry is None:
                    size = block_sizes(block_tokens, i + 1)[i]
                    self.tokens += size
                    blocks[h] = stamp | (size << 1) | flag
                else:
                    blocks[h] = stamp | (entry & _LOW) | flag
        else:
            # On the decision path: only move the held head to the recent end (C-level loop); its
            # stamps keep the last confirmation, an older time, so a correction errs on keeping.
            deque(map(blocks.move_to_end, reversed(head)), maxlen=0)
        if self.tokens > self.capacity:
            self._evict()

    def correct(self, block_tokens: int, touches: Sequence[int], cached_tokens: int) -> bool:
        """A request matched ``len(touches)`` confirmed blocks, last touched at ``touches`` before
        it was routed, and the worker reported ``cached_tokens``. Returns True on eviction evidence.
        """
        confirmed = len(touches)
        if confirmed == 0:
            return False
        predicted = prefix_tokens(confirmed, block_tokens)
        # Slack: a block (the worker rounds to pages), or EVICTION_SLACK of the prediction where
        # more. A text prompt's tokens are estimated, and its prefix's share of them can differ
        # from the prompt's: on the simulated GPU fleet (text, 6/s) every eviction read at one
        # block's slack was a report 3-5% short (1,951 of 2,048 tokens), and forgetting what
        # was older split 4-5 of 32 groups over two engines (token ids: none).
        slack = max(predicted - prefix_tokens(confirmed - 1, block_tokens), EVICTION_SLACK * predicted)
        if cached_tokens >= predicted - slack:
            return False
        first_missing = blocks_within(cached_tokens, block_tokens, confirmed)
        cutoff = touches[first_missing]
        blocks = self._blocks
        while blocks:
            key = next(iter(blocks))
            entry = blocks[key]
            if entry >> _TOUCH_SHIFT > cutoff:
                break
            del blocks[key]
            self.tokens -= (entry & _LOW) >> 1
        return True

    def resize(self, kv_tokens: int) -> None:
        kv_tokens = max(1, kv_tokens)
        if kv_tokens != self.kv_tokens:
            self.kv_tokens = self.capacity = kv_tokens
            self._evict()

    def _evict(self) -> None:
        blocks, tokens, capacity = self._blocks, self.tokens, self.capacity
        popitem = blocks.popitem
        while tokens > capacity and blocks:
            tokens -= (popitem(False)[1] & _LOW) >> 1
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

    def last_touches(self, url: str, hashes: Sequence[int]) -> tuple[int, ...]:
        index = self._workers.get(url)
        return index.last_touches(hashes) if index is not None else ()

    def complete(
        self, url: str, hashes: Sequence[int], block_tokens: int, *, touches: Sequence[int], cached_tokens: int | None
    ) -> bool:
        """A request finished on ``url``: correct by its report, then confirm its blocks.

        ``touches``: ``last_touches`` of the confirmed blocks it matched, taken when it was routed.
        Returns True when the report showed an eviction we had not predicted.
        """
        index = self._workers.get(url)
        if index is None:
            return False
        evicted = cached_tokens is not None and index.correct(block_tokens, touches, cached_tokens)
        index.record(hashes, block_tokens, confirmed=True)
        return evicted

    def urls(self) -> list[str]:
        return list(self._workers)

    def __contains__(self, url: str) -> bool:
        return url in self._workers


class FleetCache:
    """One LRU of the whole fleet's KV capacity: the prefix hits a perfect router could capture.

    The one model of "available reuse" (``diagnose/reuse.py`` says how its readers use it): block
    hashes bounded by tokens, each block weighing its own length; a prompt's hit is its longest
    prefix of blocks held; then its blocks are touched last-to-first, so parents are more recent
    than children and evicted after them (a radix tree evicts leaves first; the held set stays
    prefix-closed). ``capacity_tokens`` None = unbounded (the reuse ceiling). O(blocks) per prompt.
    """

    def __init__(self, capacity_tokens: int | None) -> None:
        self.capacity = capacity_tokens
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._used = 0

    def resize(self, capacity_tokens: int | None) -> None:
        self.capacity = capacity_tokens
        self._evict()

    def matched(self, hashes: Sequence[int]) -> int:
        """Blocks of this prompt's prefix the cache holds."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def add(self, hashes: Sequence[int], block_tokens: int) -> int:
        """Blocks this prompt finds held; then it joins the cache."""
        found = self.matched(hashes)
        blocks = self._blocks
        for h, size in zip(reversed(hashes), reversed(block_sizes(block_tokens, len(hashes))), strict=True):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = size
                self._used += size
        self._evict()
        return found

    def observe(self, hashes: Sequence[int], block_tokens: int, prompt_tokens: int) -> int:
        """Available cached tokens for this prompt (at most the prompt); then the prompt joins the cache."""
        return min(prefix_tokens(self.add(hashes, block_tokens), block_tokens), prompt_tokens)

    def _evict(self) -> None:
        if self.capacity is not None:
            while self._used > self.capacity and self._blocks:
                _, weight = self._blocks.popitem(last=False)
                self._used -= weight
