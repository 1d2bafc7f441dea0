"""Available reuse: the prefix hits one fleet-wide cache would have had. One model, its readers.

The model (``routing/prefix_index.FleetCache``): one LRU of block hashes bounded by the whole
fleet's KV capacity in tokens (Σ ``max_total_tokens``), keyed by the chained block hashes routing computed. A request's hit is its
longest prefix of blocks already in that cache; then its blocks are touched last-to-first, so
parents are more recent than children and evicted after them — a radix tree evicts leaves first,
and the cached set stays prefix-closed. Blocks grow with position as ``routing/prefix_key.py``
lays them out, and each weighs its own token length. Cost O(blocks) per request.

In the worker's units (``available_tokens``): the hit in our estimated tokens is rescaled by
reported / estimated prompt tokens, capped at the prompt, and floored at what the worker actually
reported — a hit that happened was by definition available.

Readers: ``cache_replay.cache_signal`` replays a diagnosis window through it (in dispatch order, at
capacity and unbounded); ``AvailableReuse`` feeds it every finished request as it finishes and
counts ``radixgate_routing_available_cached_tokens_total`` (App passes it to the pipeline as an
observer; the metrics module only holds the counter); the benchmarks' summary
(``loadtests/bench_summary.py``) feeds it a trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from proxy.routing.base import PINNED
from proxy.routing.prefix_index import DEFAULT_CAPACITY_TOKENS, FleetCache
from proxy.routing.prefix_key import prefix_tokens

if TYPE_CHECKING:
    from proxy.records import CompletedRequest
    from proxy.routing.base import WorkerSnapshot


def fleet_kv_tokens(snapshots: Sequence[WorkerSnapshot]) -> int:
    """The fleet's KV capacity: Σ each worker's ``max_total_tokens`` (an unknown one counts as the
    index's default capacity; no worker at all, as one)."""
    return sum(s.max_total_tokens or DEFAULT_CAPACITY_TOKENS for s in snapshots) or DEFAULT_CAPACITY_TOKENS


def available_tokens(matched_blocks: int, *, block_tokens: int, n_blocks: int, estimated_prompt: int,
                     reported_prompt: int, reported_cached: int) -> float:
    """A hit of ``matched_blocks`` in the worker's tokens (see the module docstring)."""
    estimated = max(estimated_prompt, prefix_tokens(n_blocks, block_tokens), 1)
    hit = float(min(reported_prompt, max(0, reported_cached)))
    return max(hit, min(reported_prompt, prefix_tokens(matched_blocks, block_tokens) * reported_prompt / estimated))


class AvailableReuse:
    """Every finished request with a cache report, in finishing order, through one ``SharedCache`` of
    the fleet's current capacity; ``count(policy, tokens)`` gets its available hit. O(blocks) per
    request on the loop, as the routing decision itself."""

    def __init__(self, capacity_tokens: Callable[[], int], count: Callable[[str, int], None]) -> None:
        self._capacity, self._count = capacity_tokens, count
        self._cache: FleetCache | None = None

    def observe(self, done: CompletedRequest) -> None:
        route, t = done.route, done.timing
        if (route is None or done.decision is None or done.decision.branch == PINNED or done.outcome != "ok"
                or t.cached_tokens is None
                or not t.prompt_tokens or not route.prompt_tokens):
            return  # the same requests the routing hit-rate counters count
        capacity = self._capacity()
        cache = self._cache
        if cache is None:
            cache = self._cache = FleetCache(capacity)
        elif capacity != cache.capacity:
            cache.resize(capacity)
        found = cache.add(route.block_hashes, route.block_tokens)
        self._count(done.policy, round(available_tokens(
            found, block_tokens=route.block_tokens, n_blocks=len(route.block_hashes),
            estimated_prompt=route.prompt_tokens, reported_prompt=t.prompt_tokens,
            reported_cached=t.cached_tokens)))
