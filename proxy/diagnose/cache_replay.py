"""The prefix-cache signal of a window: captured vs available vs reuse ceiling (pure).

**Prefix cache, captured vs available.** *Captured* is Σ cached / Σ prompt tokens as the workers
reported them. *Available* replays the window's requests, in dispatch order, through one LRU cache
of the whole fleet's KV capacity (Σ ``max_total_tokens``), keyed by the chained block hashes routing
computed: a request's hit is its longest prefix of blocks already in that cache. Blocks grow with
position as ``routing/prefix_key.py`` lays them out, and each weighs its own token length. A
request's blocks are touched last-to-first, so parents are more recent than children and evicted
after them — a radix tree evicts leaves first, and the cached set stays prefix-closed. The *reuse
ceiling* is the same replay with no capacity bound: all the reuse the workload offers in the window.
Per request, available and ceiling are floored at what the worker actually reported — a hit that
happened was by definition available (a cache warm from before the window, or a fleet that beats a
shared LRU, cannot make available fall below captured). Estimated tokens are converted to the
worker's count by the ratio of reported to estimated prompt tokens. Cost O(Σ blocks) per
computation. The LRU always holds the most recent blocks that fit, so available grows with
capacity and never exceeds the ceiling. The cache model (``routing/prefix_index.FleetCache``) and the conversion
(``reuse.available_tokens``) are shared with the live counter
``radixgate_routing_available_cached_tokens_total``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from proxy.diagnose.reuse import available_tokens
from proxy.diagnose.window import RequestRecord, SnapshotSample
from proxy.routing.prefix_index import FleetCache
from proxy.routing.prefix_key import prefix_tokens


@dataclass(frozen=True, slots=True)
class CacheSignal:
    captured: float | None = None
    available: float | None = None
    reuse_ceiling: float | None = None
    # Fleet KV capacity the replay used; None = unknown, so available is the unbounded replay.
    capacity_tokens: int | None = None
    reporting_requests: int = 0
    prompt_tokens: int = 0
    # No worker reported cached tokens: captured is what the routing decisions expected to hit
    # (exact where KV events gave it) and available is counted in the proxy's own token estimate.
    estimated: bool = False


def replay_matched_blocks(records: Sequence[RequestRecord], capacity_tokens: int | None) -> list[int]:
    """Blocks each record (in the given order) would find in one shared LRU of that capacity."""
    cache = FleetCache(capacity_tokens)
    return [cache.add(r.block_hashes, r.block_tokens) for r in records]


def per_worker_matched_blocks(records: Sequence[RequestRecord], capacity_tokens: int | None,
                              resets: Mapping[str, Sequence[float]] | None = None,
                              dp_sizes: Mapping[str, int] | None = None, workers: Iterable[str] = ()) -> list[int]:
    """Blocks each record would find in its own worker's cache: one LRU per worker, holding an
    equal share of the fleet's KV, fed only the requests routed there (in order), and emptied at
    each of that worker's ``resets`` (clock times: ``CacheResets.by_worker``).

    A worker of several data-parallel ranks (``dp_sizes``) is that many caches, each with its
    share of the worker's KV: a record goes to the rank radixgate named, else to the next rank in
    turn, as SGLang's default controller (round robin) sends a request that names none. Modelled
    as one cache, a worker whose controller spread a prefix's requests over its ranks read 67%
    captured where its engines had 46% (GPU run 68). ``workers``: the fleet's workers besides
    those the records went to (each takes its share of the KV)."""
    urls = set(workers) | {r.worker for r in records}
    share = capacity_tokens // len(urls) if capacity_tokens is not None and urls else None
    caches = RankCaches(share, dp_sizes or {})
    pending = {url: sorted(times) for url, times in (resets or {}).items()}
    out = []
    for r in records:
        times = pending.get(r.worker)
        if times and r.order_key >= times[0]:
            while times and r.order_key >= times[0]:
                times.pop(0)
            caches.empty(r.worker)  # emptied since its last request
        n = caches.ranks(r.worker)
        # a rank named beyond the worker's count (it changed) takes the turn's rank without moving it
        rank = r.dp_rank if r.dp_rank is not None and r.dp_rank < n else caches.next_rank(r.worker, r.dp_rank is None)
        out.append(caches.cache(r.worker, rank).add(r.block_hashes, r.block_tokens))
    return out


class RankCaches:
    """A cache per worker, per rank of a worker of several DP ranks (``dp_sizes``), each rank
    ``share // ranks`` of the worker's KV, made when first used; and each worker's next rank in
    turn, as SGLang's default controller (round robin) sends a request that names none."""

    def __init__(self, share: int | None, dp_sizes: Mapping[str, int]) -> None:
        self.share, self.sizes = share, dp_sizes
        self._caches: dict[tuple[str, int], FleetCache] = {}
        self._turn: dict[str, int] = {}

    def ranks(self, url: str) -> int:
        return max(1, self.sizes.get(url, 1))

    def next_rank(self, url: str, advance: bool = True) -> int:
        rank = self._turn.get(url, 0)
        if advance:
            self._turn[url] = (rank + 1) % self.ranks(url)
        return rank

    def cache(self, url: str, rank: int) -> FleetCache:
        cache = self._caches.get((url, rank))
        if cache is None:
            n = self.ranks(url)
            cache = self._caches[(url, rank)] = FleetCache(self.share // n if self.share is not None else None)
        return cache

    def empty(self, url: str) -> None:
        for key in [k for k in self._caches if k[0] == url]:
            del self._caches[key]


def unplaced(record: RequestRecord, dp_sizes: Mapping[str, int]) -> bool:
    """Whether the record went to a worker of several DP ranks without radixgate naming one: the
    routing decision's prediction (the worker as one cache) does not say what its rank held."""
    return record.dp_rank is None and dp_sizes.get(record.worker, 1) > 1


@dataclass(frozen=True, slots=True)
class CacheResets:
    """When the window's snapshots show workers' caches emptied (a new generation: a restart, a
    flush the scraper saw, ``/flush_cache`` through radixgate): ``fleet`` the last sample at
    which every worker's was (None: never in the window), ``by_worker`` each worker's times.
    Replaying requests from before a reset as if their prefixes were still cached after it made
    the estimated capture read 96% where the engines, flushed between two GPU phases, had 75%."""

    fleet: float | None = None
    by_worker: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def since_fleet(self, records: Sequence[RequestRecord]) -> list[RequestRecord]:
        """The records that reached the caches as they are now (all, without a fleet reset)."""
        t = self.fleet
        return list(records) if t is None else [r for r in records if r.order_key >= t]


def cache_resets(samples: Sequence[SnapshotSample]) -> CacheResets:
    by_worker: dict[str, list[float]] = {}
    fleet = None
    for before, after in pairwise(samples):
        was = {w.url: w.generation for w in before.workers}
        bumped = [w.url for w in after.workers if w.url in was and w.generation > was[w.url]]
        for url in bumped:
            by_worker.setdefault(url, []).append(after.at)
        if bumped and len(bumped) == len(after.workers):
            fleet = after.at
    return CacheResets(fleet, {u: tuple(t) for u, t in by_worker.items()})


def cache_signal(records: Sequence[RequestRecord], capacity_tokens: int | None,
                 resets: CacheResets | None = None, dp_sizes: Mapping[str, int] | None = None) -> CacheSignal:
    """Captured, available and reuse ceiling as shares of prompt tokens, over the requests whose
    worker reported cached tokens; where none did, over every request, from the routing
    decisions' own predictions (``estimated``). Only the requests since the last fleet-wide
    cache reset count, and each worker's own cache model empties at its resets; a worker of
    several DP ranks (``dp_sizes``) is one cache per rank (``per_worker_matched_blocks``)."""
    resets = resets or CacheResets()
    sizes = dp_sizes or {}
    records = resets.since_fleet(records)
    replayed = sorted((r for r in records if r.timing.dispatched is not None), key=lambda r: r.order_key)
    at_capacity = replay_matched_blocks(replayed, capacity_tokens)
    unbounded = replay_matched_blocks(replayed, None)
    estimated = not any(r.cached_tokens is not None and r.prompt_tokens for r in replayed)
    own = per_worker_matched_blocks(replayed, capacity_tokens, resets.by_worker, sizes) if estimated else []
    captured = available = ceiling = 0.0
    prompt_total = reporting = 0
    for k, (r, m_cap, m_all) in enumerate(zip(replayed, at_capacity, unbounded, strict=True)):
        if estimated:
            if r.estimated_prompt_tokens <= 0:
                continue
            # What the worker it went to would have held: its own LRU of its share of the KV,
            # fed the requests routed to it (whatever the policy predicted), at least what the
            # decision predicted (exact where KV events gave it; not where a rank it did not
            # name took it); in the worker's tokens.
            prompt = r.prompt_tokens or r.estimated_prompt_tokens
            predicted = 0 if unplaced(r, sizes) else r.predicted_cached_tokens or 0
            cached = round(max(prefix_tokens(own[k], r.block_tokens), predicted) * prompt / r.estimated_prompt_tokens)
        elif r.prompt_tokens is None or r.cached_tokens is None or r.prompt_tokens <= 0:
            continue
        else:
            prompt, cached = r.prompt_tokens, r.cached_tokens
        units = {"block_tokens": r.block_tokens, "n_blocks": len(r.block_hashes),
                 "estimated_prompt": r.estimated_prompt_tokens, "reported_prompt": prompt,
                 "reported_cached": cached}
        captured += float(min(prompt, max(0, cached)))
        available += available_tokens(m_cap, **units)
        ceiling += available_tokens(m_all, **units)
        prompt_total += prompt
        reporting += 1
    if not reporting:
        return CacheSignal(capacity_tokens=capacity_tokens)
    return CacheSignal(
        captured=captured / prompt_total,
        available=available / prompt_total,
        reuse_ceiling=ceiling / prompt_total,
        capacity_tokens=capacity_tokens,
        reporting_requests=reporting,
        prompt_tokens=prompt_total,
        estimated=estimated,
    )


def fleet_capacity_tokens(samples: Sequence[SnapshotSample]) -> int | None:
    """Σ max_total_tokens over the workers of the latest sample; None if any is unknown."""
    if not samples or not samples[-1].workers:
        return None
    sizes = [w.max_total_tokens for w in samples[-1].workers]
    if any(s is None or s <= 0 for s in sizes):
        return None
    return sum(s for s in sizes if s is not None)
