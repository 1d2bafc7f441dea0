"""The ``ttft`` policy's parameters (``routing.params`` when ``routing.policy`` is ttft), each with
its default and, where a measurement chose it, the measurement (``ttft_cost.py`` uses them)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config import ConfigError
from proxy.routing.prefix_index import DEFAULT_CAPACITY_TOKENS


@dataclass(frozen=True)
class TtftParams:
    # Model prior (Llama-3.1-8B on one H100, roughly), refined online.
    prior_base_s: float = 0.02
    prior_prefill_tokens_per_s: float = 12_000.0
    prior_decode_s_per_running: float = 0.0003
    # Forgetting factor of the fleet fit (effective memory ~ 1 / (1 - f) requests).
    forgetting: float = 0.995
    # EWMA weight of one observation in a worker's speed factor; 0 = off (the default). On the GPU
    # fleet (4 engines on one H200, text, minimal reports, 4.5 req/s) 0.05 starved workers: one
    # drew a high factor early, was then avoided, and never got the traffic that would correct it
    # (2 of 112 requests to one engine, 47 to another; 0 and 5 with work_weight 10). Off, the
    # same trace spread 30/24/30/28 at the same p95. Turn it on only for a fleet of unequal GPUs.
    factor_alpha: float = 0.0
    # Weight of the prefill this request adds to the chosen worker (0 = greedy TTFT).
    work_weight: float = 3.0
    # Score per request already running there: the decode slowdown a TTFT fit cannot see.
    decode_balance_s: float = 0.01
    # Scores within max(tie_abs_s, tie_rel * best) of the best are tied.
    tie_rel: float = 0.1
    tie_abs_s: float = 0.005
    # Among tied workers with equal matches (the hash is over the prompt's first ``key_blocks``
    # blocks, so independent proxies agree on it):
    #   "rendezvous" = the rendezvous-hash order; for a cold prompt (no worker holds more than
    #     ``cold_blocks`` blocks of it) the first of its first ``cold_choices`` (0 = all) workers
    #     whose count of recent cold placements is within ``cold_slack`` of the fewest among them;
    #   "hash" = the rendezvous-hash winner, always;
    #   "recent" = the fewest recent picks, then the least recently picked (one proxy's most even
    #     spread, but independent proxies place a new prefix each on its own worker).
    tie_break: str = "rendezvous"
    key_blocks: int = 16
    cold_blocks: int = 1
    # 0 = every tied worker: 8 groups x 128 on 4 workers all stay whole (91% with 2 choices), unique
    # prompts at concurrency 1 spread 1.00x the mean (1.04). 2 suits proxies that share nothing
    # and no peers: two choices keep them agreeing on where a new group goes (150 x 5 behind 4
    # such proxies: p95 0.35 s with 2, 0.73 with all).
    cold_choices: int = 0
    # 0: the least used of the choices. 1 keeps more new groups on their first choice; on
    # shared_prefix @128 (before holds) it was no better over 32 seeds (p95 0.145 vs 0.150 s;
    # better on 12 of the first 16 seeds, on 7 of the next 16) and split more of 8 groups.
    cold_slack: float = 0.0
    # For a cold prompt, scores within this many of its own prefill times of the best also tie,
    # so the cold spread above decides among idle-ish workers whose scores differ by noise
    # (unique prompts at concurrency 1: max/mean 1.05 instead of 1.19 with cold_slack 1).
    cold_tie_prefills: float = 0.5
    # A prompt whose prefix the workers' KV events report evicted everywhere goes back to the
    # worker our index placed it on, as the approximate index would send it (its cost is the
    # recompute, exact), rather than anew by load (TtftCost._evicted_homes). Off: it helped in
    # bench_routing's LRU pools (1.18x -> 1.01x the approximate index's p95), not on the GPU
    # fleet where the engines evict (runs 121-124, 15 cells: 1.10x, the events alone 1.09x).
    evicted_home: bool = False
    token_usage_limit: float = 0.95
    # Our own in-flight requests above which a worker counts as saturated; 0 = off.
    max_in_flight: int = 0
    # KV tokens assumed for a worker that has not reported max_total_tokens yet.
    default_capacity_tokens: int = DEFAULT_CAPACITY_TOKENS
    # Hold a request at the proxy while the prefix it would reuse on the chosen worker is still
    # being prefilled there by an earlier streamed request (ours or a peer's), if that part is at
    # least this many tokens (0 = never hold). 256..2048 gave the same p95 on shared_prefix.
    hold_tokens: int = 512
    # Leave a prefix's holder only for a worker whose pending prefill + running batch is below
    # (1 - spill_guard) of the holder's; 0 = off. Past the GPU fleet's knee a proxy whose fit had
    # learned an earlier loaded phase spilled 19, then 36 of 150 followers between equally busy
    # engines (reuse 75% -> 67% -> 54%, TTFT p95 6.6 -> 4.9 -> 11.8 s; run 23): its fit had put
    # TTFT on the queue terms, so recomputing a prefix elsewhere looked cheap. The simulator shows
    # the same on a second round (8 seeds, 6/s, token ids: reuse down to 56-69% in 7 of 8; with
    # the guard 64-75%, TTFT p95 lower in each of the 7; the first round and 4.5/s unchanged).
    spill_guard: float = 0.5
    # Past the fleet's mean, whatever the fit says: a follower leaves its prefix's holder when the
    # holder's outstanding requests pass the mean over the healthy workers by two standard
    # deviations of a count at that mean (at least 4) and by this ratio, for the best-scored
    # worker at or under the mean (smg 1.13.0's spill gate, cache_aware ``gate: mean``); 0 = off.
    # The fit keeps followers home past the knee (spill_guard 0 changes nothing there); this gate
    # is the valve for an engine the group draw overloaded. On the GPU fleet (four engines on one
    # H200; run 64, ids, 6/s, three rounds) it never fired: no engine's count passed it (p95 0.93x
    # the rule without it, inside the rounds' spread). In the simulator, on that fleet (fleet_sim,
    # 6/s ids seeds 15-40, text 15-24, ids 4.5/s 15-22) it fired in 9 of 44 phases, TTFT p95
    # 0.45-0.99x there, never worse; with an H200 per engine (fleet_sim --own-gpus, ids, seeds
    # 15-26), where an engine left behind is GPU time lost, 0.89x / 0.65x / 0.96x the rule without
    # it at 9 / 12 (the knee) / 15 req/s, where smg's own rule read 0.90x / 0.71x / 1.10x. On since
    # 2026-12-04 (not yet measured on engines with a GPU each: docs/gpu-fleet.md).
    spill_over_mean: float = 1.5
    # A spill (this gate's, or the fit's past spill_guard) goes only to a worker whose KV pool holds
    # the prompt beside the prefixes placed there and still requested, within this share of the
    # pool (the rest for the requests' own tokens); 0 = no such check. Measured: ttft_cost._has_room.
    spill_room: float = 0.9
    # Learn a cost per request waiting for its first token on a worker (ttft_model's c5, prior 0):
    # on the GPU fleet's engines five cache hits waiting cost ~2 s where their tokens say ~0.1 s
    # (a step there reads at most the pool's size of resident KV: the hits wait for running
    # requests to end). False = the feature is always 0 (the fit before it).
    waiting_requests: bool = True
    # Count our own requests on a worker from our books, the scrape standing only for the other
    # senders' (ttft_estimate.PendingWork._ahead_own_exact): a 0.5-s scrape still counts ours that
    # have had their first token, and one proxy routed by it was 1.23x the p95 of the same proxy
    # without scrapes at the H100 fleet's knee (simulated, 8 seeds, engines reporting as SGLang;
    # 1.09x reporting as the GPU shim; docs/routing.md). False = the
    # scrape's queue and batch as they are, ours since it added (before 2026-12-06).
    own_exact: bool = True
    # Hold the fit's cost of a request's own uncached token at least at its cost of an unseen token
    # ahead (ttft_model.py). Why: after a loaded phase the fit puts TTFT on its queue terms and the
    # own-token cost on its floor, so recomputing a prefix elsewhere looks cheaper than the prefill
    # queued on its holder, often that very prefix still being prefilled (GPU run 43, chat, 6/s:
    # rounds 2-3 spilled 4 and 6 followers early in the round, reuse 75% -> 71%, p50 0.86 ->
    # 1.5 s; at the rounds' ends the own-token cost at its floor, an unseen token ahead 9-16x it).
    # On the GPU fleet against the rule without it: 0.62x (run 25), 1.02x (run 27), 0.97x (run 38,
    # no spill in either). In the simulator (fleet_sim --rates 6 --seed 1 --seeds 4 --rounds 3,
    # ids and text) first rounds identical, later rounds TTFT p95 0.65-1.04x with reuse kept
    # (67-69% -> 71-74% where the rule without it lost it); seeds 5-12 (ids): later rounds p95
    # geometric mean 0.90x (0.69-1.37x, 14 of 16 at or under 1.0x), p50 0.77x, reuse 75-76%
    # against 68-73%; at 4.5/s identical. As the default on run 43's cell (GPU run 44): 1.03x,
    # neither rule spilled there.
    own_at_least_ahead: bool = True
    # Place a new group where the groups already placed since the worker's cache last started empty
    # bring the least traffic (their decayed request counts, ``ttft_popularity.py``), before the
    # fewest outstanding: a proxy that has seen a system prompt before knows how busy it keeps its
    # engine. On the GPU fleet (runs 33-35, seed 9, three rounds each) TTFT p95 0.74x / 1.03x / 0.88x
    # the rule without it (text 4.5/s, ids 6/s, text with full reports 6/s), as the simulator said
    # (~0.9x at the knee, even past it); the figures: ttft_popularity.py.
    popularity: bool = True
    # Estimate how long a request would wait on each worker for room in its KV pool, from the
    # contexts in flight there (``ttft_kv.py``), as a feature of the TTFT fit (coefficient prior 1),
    # and let a follower leave a holder with no room for a worker with room, while the pools
    # together hold what is in flight. Off: on the GPU fleet (runs 40-42, 6 req/s past the knee,
    # token ids and text) TTFT p95 0.67x / 1.08x / 1.37x the rule without it, reuse 2-4 points
    # lower (the fleet-wide gate came after, for the spills seen there). In the simulator on pools
    # that hold about eight of the workload's prefixes (24k tokens) it is 0.85x the default's p95 at
    # the knee over twelve traces, 1.04x past it, on roomy pools 0.97-1.09x past the knee, and with
    # a GPU per engine 0.68x / 0.92x at 12 / 15 req/s: the lead candidate for the default, not yet
    # run on the GPU in that form (docs/gpu-fleet.md, "Room in the KV pool").
    kv_wait: bool = False
    # How ``kv_wait`` counts what a worker's requests hold: "contexts", each request's context
    # whole, as transformers' scheduler budgets a step's KV reads (the GPU fleet's engine); or
    # "blocks", a prefix shared by several requests once, as SGLang's radix cache and vLLM's
    # blocks store it. Counted whole on SGLang-style simulated workers (bench_routing
    # shared_prefix, 60k-token pools, 32 req/s) it split groups that had room (91% -> 71% whole).
    kv_wait_counts: str = "contexts"
    # Bound on remembered in-flight requests per worker (protects against missed completions).
    max_tracked_per_worker: int = 4096

    def validate(self) -> None:
        checks = {
            "prior_base_s": self.prior_base_s >= 0,
            "prior_prefill_tokens_per_s": self.prior_prefill_tokens_per_s > 0,
            "prior_decode_s_per_running": self.prior_decode_s_per_running >= 0,
            "forgetting": 0.5 <= self.forgetting <= 1,
            "factor_alpha": 0 <= self.factor_alpha <= 1,
            "work_weight": self.work_weight >= 0,
            "decode_balance_s": self.decode_balance_s >= 0,
            "tie_rel": self.tie_rel >= 0,
            "tie_abs_s": self.tie_abs_s >= 0,
            "token_usage_limit": 0 < self.token_usage_limit <= 1,
            "max_in_flight": self.max_in_flight >= 0,
            "hold_tokens": self.hold_tokens >= 0,
            "default_capacity_tokens": self.default_capacity_tokens > 0,
            "max_tracked_per_worker": self.max_tracked_per_worker > 0,
            "spill_guard": 0 <= self.spill_guard < 1,
            "spill_over_mean": self.spill_over_mean == 0 or self.spill_over_mean >= 1,
            "spill_room": 0 <= self.spill_room <= 1,
            "tie_break": self.tie_break in ("hash", "recent", "rendezvous"),
            "kv_wait_counts": self.kv_wait_counts in ("contexts", "blocks"),
            "key_blocks": self.key_blocks >= 1,
            "cold_blocks": self.cold_blocks >= 0,
            "cold_slack": self.cold_slack >= 0,
            "cold_choices": self.cold_choices >= 0,
            "cold_tie_prefills": self.cold_tie_prefills >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"routing.params.{name}: out of range ({getattr(self, name)!r})")
