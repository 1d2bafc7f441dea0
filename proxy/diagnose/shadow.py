"""Shadow policies: what the other routing policies would have captured on the window's traffic.

The window's requests (at most ``MAX_REQUESTS`` of the newest, in dispatch order) are replayed
through each policy's own pure ``select`` against a model of the fleet: one LRU cache per worker
holding an equal share of the fleet's KV (``FleetCache``, the model "available" uses), and per
worker the requests still in flight (each ends when the real one did). A worker of several
data-parallel ranks is a cache per rank, as the window's own placements are modelled
(``cache_replay.per_worker_matched_blocks``), and a replayed request reaches the rank this proxy
would send it to: the one ``routing.dp_ranks`` names when it is on (``dp_rank.RankBook``), else
the worker's next rank in turn. Modelled as one cache per worker, the policies' replays were
credited with hits the ranks never give while the window's own placements were not, so on a
fleet of DP workers any alternative policy could look better than the one running. The policy hears back as
the pipeline would tell it (``on_complete`` with the cached tokens the model gave and the request's
real TTFT). Reported per policy: the share of prompt tokens it would have found cached, its
spread (max / mean requests per worker) and its predicted TTFT p95 (``shadow_ttft.py``: a model
fitted on the window's own requests, also run on their real placements for comparison). No engine
signal is needed, so it also works where the workers report nothing.

Cost: O(requests x policies) decisions, each the policy's own cost (tens of µs for ``ttft``):
~50 ms for 300 requests and 3 policies, and the TTFT model's fit and runs 10-20 ms more
(``loadtests/bench_diagnosis.py``: 85-163 ms per diagnosis, was 75-144), computed with the
diagnosis (in its thread when ``diagnose.refresh_s`` > 0).
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from proxy.diagnose import shadow_ttft
from proxy.diagnose.cache_replay import RankCaches, per_worker_matched_blocks
from proxy.diagnose.window import RequestRecord
from proxy.routing.base import Completion, RouteRequest, WorkerSnapshot
from proxy.routing.dp_rank import RankBook, affinity_key
from proxy.routing.prefix_key import prefix_tokens
from proxy.routing.registry import build_named

# Policies that decide on what a window record keeps (block hashes, token estimates, load):
# cache_aware matches the prompt's characters, which the window does not keep, so it is not replayed.
SHADOW_POLICIES = ("ttft", "least_load", "round_robin")
MAX_REQUESTS = 300


@dataclass(frozen=True, slots=True)
class ShadowResult:
    policy: str
    captured: float  # predicted cached share of prompt tokens
    imbalance: float  # max / mean requests per worker
    requests: int
    # Predicted TTFT p95 (dispatch to first token) under this policy, and the same model on the
    # window's own placements (to compare with: the model's error cancels); None = no fit.
    ttft_p95: float | None = None
    as_placed_ttft_p95: float | None = None


@dataclass(frozen=True, slots=True)
class Replay:
    results: tuple[ShadowResult, ...] = ()
    # The window's TTFT model at no load (nothing ahead, nothing decoding) for the window's own
    # prompts as placed, p95: what these prompts cost an idle engine. None = no fit. Far under the
    # measured p95, the time went to load; over the SLO, the prompts alone miss it (a floor).
    unloaded_ttft_p95: float | None = None


def replay(records: Sequence[RequestRecord], workers: Sequence[str], capacity_tokens: int | None,
           policies: Sequence[str] = SHADOW_POLICIES, dp_sizes: Mapping[str, int] | None = None,
           dp_ranks: bool = False) -> Replay:
    """``dp_sizes``: workers of several DP ranks, a cache per rank in the window's own placements
    and in the policies' replays; ``dp_ranks``: whether this proxy names the rank
    (``routing.dp_ranks``), which the replays then do as it would."""
    window = sorted((r for r in records if r.ok and r.block_hashes and r.timing.dispatched is not None
                     and r.estimated_prompt_tokens > 0), key=lambda r: r.order_key)[-MAX_REQUESTS:]
    urls = sorted(set(workers) | {r.worker for r in window})
    if not window or not urls:
        return Replay()
    share = capacity_tokens // len(urls) if capacity_tokens is not None else None
    runs = [_one(name, window, urls, share, dp_sizes or {}, dp_ranks) for name in policies]
    own = _as_placed(window, urls, capacity_tokens, dp_sizes)
    timed = [(p, t) for p, r in zip(own, window, strict=True) if (t := r.timing.upstream_ttft) is not None]
    model = shadow_ttft.fit([p for p, _ in timed], [t for _, t in timed])
    if model is None:
        return Replay(tuple(result for result, _ in runs))
    as_placed = round(shadow_ttft.p95(model.ttfts(own)), 6)
    unloaded = round(shadow_ttft.p95([model.predict((p.uncached, 0.0, 0.0)) for p in own]), 6)
    # Zero: the fit gave the load's terms all of the TTFT, none to a prompt's own tokens (a window
    # loaded throughout: on the H100 fleet at its knee, run 78's text phase), so it cannot say what
    # an idle engine takes; an estimate of 0 s would hide the load it measured.
    return Replay(tuple(dataclasses.replace(result, ttft_p95=round(shadow_ttft.p95(model.ttfts(placed)), 6),
                                            as_placed_ttft_p95=as_placed) for result, placed in runs),
                  unloaded if unloaded > 0 else None)


def _decode_s(r: RequestRecord) -> float:
    t = r.timing
    return max(0.0, t.done - t.first_token) if t.done is not None and t.first_token is not None else 0.0


def _as_placed(window: Sequence[RequestRecord], urls: Sequence[str], capacity_tokens: int | None,
               dp_sizes: Mapping[str, int] | None) -> list[shadow_ttft.Placed]:
    """The window's own placements, each with the cache the per-worker (per-rank) model gives it."""
    out = []
    for r, matched in zip(window, per_worker_matched_blocks(window, capacity_tokens, dp_sizes=dp_sizes, workers=urls),
                          strict=True):
        cached = min(r.estimated_prompt_tokens, prefix_tokens(matched, r.block_tokens))
        out.append(shadow_ttft.Placed(r.order_key, r.worker, float(r.estimated_prompt_tokens - cached), _decode_s(r)))
    return out


class _RankedCaches(RankCaches):
    """One policy's replay of the fleet's caches (``cache_replay.RankCaches``), with the requests
    in flight per rank: a request goes to the rank the proxy would name (``routing.dp_ranks``,
    ``named``), else to the worker's next in turn."""

    def __init__(self, share: int | None, dp_sizes: Mapping[str, int], named: bool) -> None:
        super().__init__(share, dp_sizes)
        self.named = named
        self.in_flight: Counter[tuple[str, int]] = Counter()
        self.book = RankBook()

    def place(self, url: str, route: RouteRequest) -> tuple[str, int]:
        n = self.ranks(url)
        if n == 1:
            return url, 0
        if self.named:
            return url, self.book.place(url, affinity_key(route), n, [self.in_flight[(url, k)] for k in range(n)])
        return url, self.next_rank(url)


def _one(name: str, window: Sequence[RequestRecord], urls: Sequence[str],
         share: int | None, dp_sizes: Mapping[str, int],
         dp_ranks: bool) -> tuple[ShadowResult, list[shadow_ttft.Placed]]:
    policy = build_named(name, {}, rng=random.Random(0))
    snaps = [WorkerSnapshot(u) for u in urls]
    policy.on_worker_change(snaps)
    fleet = _RankedCaches(share, dp_sizes, dp_ranks)
    in_flight = dict.fromkeys(urls, 0)
    ends: list[tuple[float, int, tuple[str, int], RouteRequest, int, float | None]] = []
    picks = dict.fromkeys(urls, 0)
    cached_total = prompt_total = 0
    placed: list[shadow_ttft.Placed] = []
    for k, r in enumerate(window):
        start = r.order_key
        while ends and ends[0][0] <= start:
            _, _, (url, rank), route, cached, ttft = heapq.heappop(ends)
            in_flight[url] -= 1
            fleet.in_flight[(url, rank)] -= 1
            policy.on_complete(Completion(url, route, True, route.prompt_tokens, cached, ttft))
        route = RouteRequest(model="", block_hashes=r.block_hashes, block_tokens=r.block_tokens,
                             prompt_tokens=r.estimated_prompt_tokens, held=True)
        decision = policy.select(route, [WorkerSnapshot(u, in_flight=in_flight[u]) for u in urls])
        url = decision.worker if decision.worker in in_flight else urls[0]
        where = fleet.place(url, route)
        matched = fleet.cache(*where).add(r.block_hashes, r.block_tokens)
        cached = min(route.prompt_tokens, prefix_tokens(matched, r.block_tokens))
        cached_total += cached
        prompt_total += route.prompt_tokens
        placed.append(shadow_ttft.Placed(start, url, float(route.prompt_tokens - cached), _decode_s(r)))
        picks[url] += 1
        in_flight[url] += 1
        fleet.in_flight[where] += 1
        done = r.timing.done if r.timing.done is not None else start
        heapq.heappush(ends, (done, k, where, route, cached, r.timing.ttft))
    mean = len(window) / len(urls)
    return ShadowResult(name, cached_total / max(1, prompt_total), max(picks.values()) / mean, len(window)), placed
