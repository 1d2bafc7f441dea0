"""ttft (default): send each request where its estimated time to first token is smallest.

Model, per healthy worker w, for a request of P prompt tokens:
    cached_w    = tokens of the longest prefix w probably holds (``PrefixIndex``; token ids
                  exact, text estimated at ``chars_per_token``), at most P
    pending_w   = prefill tokens queued ahead of it: max(own, engine) where
                    own    = uncached tokens of our in-flight requests on w that the engine does
                             not yet count as running (the newest ``in_flight - running`` of
                             them; all of them before the first scrape)
                    engine = scraped ``waiting_uncached_tokens`` (else ``queued`` x the mean
                             uncached size of our requests) -- also covers other proxies' traffic
    spt_w       = seconds per prefill token, learned online: after each request, the sample
                  (observed TTFT - decode term at decision) / (pending + uncached at decision),
                  EWMA-smoothed (weight ``rate_alpha``) per worker and fleet-wide; a new worker
                  starts from the fleet estimate, the fleet from ``prior_prefill_tokens_per_s``.
                  Samples with less than ``min_sample_tokens`` of work are skipped (fixed
                  overheads would dominate them).
    decode_w    = ``decode_s_per_running`` x running requests (scraped, else our in-flight):
                  the decode steps a new prefill is interleaved with.
    ttft_w      = (pending_w + P - cached_w) x spt_w + decode_w
    score_w     = ttft_w + ``work_weight`` x (P - cached_w) x spt_w
The second term charges the prefill this request adds to the worker, which delays every later
request there: greedy TTFT alone would send a follow-up of a prefix still being prefilled on its
holder to an idle worker and pay that prefix twice. With it, reuse wins unless the holder's queue
costs more than recomputing the prefix elsewhere (``work_weight`` 0 = greedy TTFT).
Pick the smallest score among workers that are not saturated; scores within
``max(tie_abs_s, tie_rel x best)`` of the best count as tied, and among those the longest prefix
match wins (affinity), then the least recently picked worker (so unique prompts spread evenly
even at concurrency 1, never "first in the list"). Saturated: stale snapshot, ``token_usage >=
token_usage_limit``, every running slot taken with a queue behind it, or our own
``in_flight >= max_in_flight`` (0 = off; admission normally bounds it). If every worker is
saturated the smallest score among all wins.

Branches: ``affinity`` (chose the longest match, > 0), ``spill`` (a worker holding more of the
prefix was passed over for load or saturation), ``balance`` (no worker holds any of it),
``saturated`` (every worker saturated), ``only`` (one healthy worker).

The routed prompt is recorded in the chosen worker's index; ``on_complete`` confirms it there,
corrects the index by the reported ``cached_tokens`` and updates the rate. The policy keeps our
in-flight requests per worker, so the pipeline must call ``on_complete`` once per ``select``
(``ok=False`` on failure); a per-worker cap bounds the table if it does not.

Complexity: per decision O(W log B) index lookups + O(B) to record the prompt (B = blocks of
the prompt, ~224 for 32k tokens) + O(W + requests behind the scrape) for pending work.

When to choose it: the default. Shared prefixes of any size, uneven prompt lengths, bursts.
Params (``TtftParams``) and defaults below.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config import ConfigError
from proxy.routing.base import Completion, Decision, NoWorkerAvailable, RouteRequest, WorkerSnapshot, healthy
from proxy.routing.prefix_index import DEFAULT_CAPACITY_TOKENS, PrefixIndex
from proxy.routing.prefix_key import prefix_tokens
from proxy.routing.registry import PolicySpec


@dataclass(frozen=True)
class TtftParams:
    # Prefill rate assumed before any TTFT is observed (Llama-3.1-8B on one H100, roughly).
    prior_prefill_tokens_per_s: float = 12_000.0
    # EWMA weight of one new seconds-per-token sample.
    rate_alpha: float = 0.1
    # Learn only from requests with at least this much prefill work ahead of their first token.
    min_sample_tokens: int = 256
    # TTFT added per request running on the worker (decode steps interleaved with prefill).
    decode_s_per_running: float = 0.0003
    # Weight of the prefill this request adds to the chosen worker (0 = greedy TTFT).
    work_weight: float = 1.0
    # Estimates within max(tie_abs_s, tie_rel * best) of the best are tied.
    tie_rel: float = 0.1
    tie_abs_s: float = 0.005
    token_usage_limit: float = 0.95
    # Our own in-flight requests above which a worker counts as saturated; 0 = off.
    max_in_flight: int = 0
    # KV tokens assumed for a worker that has not reported max_total_tokens yet.
    default_capacity_tokens: int = DEFAULT_CAPACITY_TOKENS
    # Bound on remembered in-flight requests per worker (protects against missed completions).
    max_tracked_per_worker: int = 4096

    def validate(self) -> None:
        checks = {
            "prior_prefill_tokens_per_s": self.prior_prefill_tokens_per_s > 0,
            "rate_alpha": 0 < self.rate_alpha <= 1,
            "min_sample_tokens": self.min_sample_tokens >= 0,
            "decode_s_per_running": self.decode_s_per_running >= 0,
            "work_weight": self.work_weight >= 0,
            "tie_rel": self.tie_rel >= 0,
            "tie_abs_s": self.tie_abs_s >= 0,
            "token_usage_limit": 0 < self.token_usage_limit <= 1,
            "max_in_flight": self.max_in_flight >= 0,
            "default_capacity_tokens": self.default_capacity_tokens > 0,
            "max_tracked_per_worker": self.max_tracked_per_worker > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"routing.params.{name}: out of range ({getattr(self, name)!r})")


@dataclass(frozen=True, slots=True)
class _InFlight:
    request: RouteRequest
    url: str
    uncached: int
    pending: int
    decode_s: float
    confirmed_blocks: int


@dataclass(frozen=True, slots=True)
class Estimate:
    """One worker's TTFT estimate for one request (exposed for tests and explanations)."""

    url: str
    ttft_s: float
    score: float
    matched_blocks: int
    confirmed_blocks: int
    uncached: int
    pending: int
    decode_s: float
    saturated: bool


class TtftCost:
    name = "ttft"

    def __init__(self, params: TtftParams) -> None:
        self.params = params
        self.index = PrefixIndex(params.default_capacity_tokens)
        self._fleet_spt = 1.0 / params.prior_prefill_tokens_per_s
        self._spt: dict[str, float] = {}
        self._mean_uncached = 1024.0
        # url -> {id(request): _InFlight}, in dispatch order.
        self._in_flight: dict[str, dict[int, _InFlight]] = {}
        self._last_pick: dict[str, int] = {}
        self._decisions = 0

    # -- model ---------------------------------------------------------------------------------

    def seconds_per_token(self, url: str) -> float:
        return self._spt.get(url, self._fleet_spt)

    def pending_prefill(self, worker: WorkerSnapshot) -> int:
        own = self._in_flight.get(worker.url, {})
        behind = len(own) - worker.running if worker.running is not None else len(own)
        own_pending = 0
        if behind > 0:
            for n, entry in enumerate(reversed(own.values())):
                if n >= behind:
                    break
                own_pending += entry.uncached
        if worker.waiting_uncached_tokens is not None:
            engine = worker.waiting_uncached_tokens
        else:
            engine = int((worker.queued or 0) * self._mean_uncached)
        return max(own_pending, engine)

    def saturated(self, worker: WorkerSnapshot) -> bool:
        p = self.params
        if worker.stale:
            return True
        if worker.token_usage is not None and worker.token_usage >= p.token_usage_limit:
            return True
        if p.max_in_flight and worker.in_flight >= p.max_in_flight:
            return True
        return bool(
            worker.max_running_requests
            and worker.running is not None
            and worker.running >= worker.max_running_requests
            and (worker.queued or 0) > 0
        )

    def estimate(self, request: RouteRequest, worker: WorkerSnapshot) -> Estimate:
        match = self.index.match(worker.url, request.block_hashes)
        cached = min(prefix_tokens(match.blocks, request.block_tokens), request.prompt_tokens)
        uncached = request.prompt_tokens - cached
        pending = self.pending_prefill(worker)
        running = worker.running if worker.running is not None else len(self._in_flight.get(worker.url, {}))
        decode_s = self.params.decode_s_per_running * running
        spt = self.seconds_per_token(worker.url)
        ttft = (pending + uncached) * spt + decode_s
        score = ttft + self.params.work_weight * uncached * spt
        return Estimate(
            worker.url, ttft, score, match.blocks, match.confirmed, uncached, pending, decode_s, self.saturated(worker)
        )

    # -- Policy --------------------------------------------------------------------------------

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        self.index.sync(workers)
        estimates = [self.estimate(request, w) for w in candidates]
        pool = [e for e in estimates if not e.saturated] or estimates
        best = min(e.score for e in pool)
        margin = max(self.params.tie_abs_s, self.params.tie_rel * best)
        tied = [e for e in pool if e.score <= best + margin]
        chosen = min(tied, key=lambda e: (-e.matched_blocks, self._last_pick.get(e.url, -1)))
        longest = max(e.matched_blocks for e in estimates)
        if len(candidates) == 1:
            branch = "only"
        elif all(e.saturated for e in estimates):
            branch = "saturated"
        elif longest == 0:
            branch = "balance"
        elif chosen.matched_blocks == longest:
            branch = "affinity"
        else:
            branch = "spill"
        self._remember(request, chosen)
        return Decision(
            chosen.url,
            branch,
            matched_blocks=chosen.matched_blocks,
            reason=f"ttft={chosen.ttft_s * 1e3:.1f}ms pending={chosen.pending} uncached={chosen.uncached}",
        )

    def _remember(self, request: RouteRequest, chosen: Estimate) -> None:
        self._decisions += 1
        self._last_pick[chosen.url] = self._decisions
        self.index.record(chosen.url, request.block_hashes, request.block_tokens)
        key = id(request)
        for table in self._in_flight.values():
            table.pop(key, None)  # a retry of the same request routes it again
        table = self._in_flight.setdefault(chosen.url, {})
        table[key] = _InFlight(
            request, chosen.url, chosen.uncached, chosen.pending, chosen.decode_s, chosen.confirmed_blocks
        )
        if len(table) > self.params.max_tracked_per_worker:
            del table[next(iter(table))]

    def on_complete(self, completion: Completion) -> None:
        entry = self._in_flight.get(completion.worker, {}).pop(id(completion.request), None)
        if entry is None or entry.request is not completion.request or not completion.ok:
            return
        request = completion.request
        self.index.complete(
            completion.worker,
            request.block_hashes,
            request.block_tokens,
            confirmed_blocks=entry.confirmed_blocks,
            cached_tokens=self._reported_cached(completion),
        )
        uncached = entry.uncached
        if completion.cached_tokens is not None and completion.prompt_tokens:
            # Reported tokens may count differently from our estimate: keep our units.
            share = 1.0 - min(completion.cached_tokens, completion.prompt_tokens) / completion.prompt_tokens
            uncached = round(request.prompt_tokens * share)
        a = self.params.rate_alpha
        self._mean_uncached += a * (uncached - self._mean_uncached)
        work = entry.pending + uncached
        if completion.ttft is None or work < max(1, self.params.min_sample_tokens):
            return
        sample = max(completion.ttft - entry.decode_s, 1e-6) / work
        own = self._spt.get(completion.worker, self._fleet_spt)
        self._spt[completion.worker] = own + a * (sample - own)
        self._fleet_spt += a * (sample - self._fleet_spt)

    @staticmethod
    def _reported_cached(completion: Completion) -> int | None:
        """Reported cached tokens, rescaled to our token estimate of the prompt."""
        if completion.cached_tokens is None:
            return None
        if not completion.prompt_tokens:
            return completion.cached_tokens
        scale = completion.request.prompt_tokens / completion.prompt_tokens
        return round(completion.cached_tokens * scale)

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        self.index.sync(workers, drop_missing=True)
        present = {w.url for w in workers}
        for table in (self._in_flight, self._spt, self._last_pick):
            for url in [u for u in table if u not in present]:
                del table[url]


def _factory(params: TtftParams, rng: random.Random) -> TtftCost:
    return TtftCost(params)


SPEC = PolicySpec("ttft", TtftParams, _factory)
