"""Rules: pure functions from ``Signals`` to findings, and from findings to one verdict.

Each rule reads a few signals, compares them with a threshold from ``RuleParams`` and, when it
fires, returns a ``Finding`` with its evidence (signal, value, threshold), the levers to pull
(SGLang flags or radixgate settings) and a confidence in 0..1. A rule whose evidence is unknown
stays silent (or fires with lowered confidence where noted) — it never assumes a value.

| rule | fires when | kind | levers |
|---|---|---|---|
| cache_routing | captured ≪ available (gap ≥ capture_gap and captured/available ≤ capture_ratio) | tune | routing policy; page size; KV memory |
| cache_capacity | reuse ceiling - available ≥ capacity_gap (fleet KV too small for the working set) | tune | --mem-fraction-static, --max-total-tokens, replicas |
| admission | requests queue (engine queue, worker queue time or our admission wait) while KV usage < kv_headroom | tune | --max-running-requests, --schedule-conservativeness |
| idle_gaps | GPU idle share ≥ idle_gap_share while there is demand | tune | scheduler / host stall levers |
| prefill_tail | TTFT p95 > SLO, p95/p50 ≥ tail_spread, decode flat, the tail is queueing | tune | --chunked-prefill-size, --schedule-policy, replicas |
| prefill_stall | the median request's worst token gap ≥ prefill_stall_ratio × ITL p10 and ≥ p10 + prefill_stall_s, with big prefills (uncached p95 ≥ prefill_heavy_tokens) | tune | --enable-mixed-chunk, --chunked-prefill-size, PD disaggregation |
| decode_jitter | ITL p95/p50 ≥ jittery_decode with GPU idle ≤ small_idle_share, and no prefill stall | tune | GPU profiling (kernel / memory bandwidth) |
| proxy_overhead | our share of TTFT ≥ proxy_overhead_share | tune | radixgate routing settings |
| ceiling | TTFT p95 > SLO, saturated, no tune rule fired, the cache figure (measured or estimated) as good as allowed | at_ceiling | model swap or hardware |
| latency_floor | TTFT p95 > SLO, the engines *report* no queue and spare capacity, no tune rule fired | at_ceiling | model swap, faster GPU, tensor parallel |
| mixed_page_sizes | the pool's workers report different KV page sizes | tune | one --page-size |
| hot_prefix | one prefix's share of requests ≥ hot_prefix_share / workers, on fewer workers than it needs, its TTFT p95 > SLO | tune | spill sooner (routing.params), replicas |
| missing_signals | no cached tokens, or no queue / batch state, reported | (added to any verdict) | --enable-cache-report, --enable-metrics, KV events |

Verdict (a total function): fewer than ``min_requests`` successful requests → ``insufficient_data``;
any tune finding → ``tune`` (levers of every tune finding, strongest first); a ceiling finding →
``at_ceiling``; SLO met → ``healthy`` ("as far as the signals show" when some are missing);
otherwise ``insufficient_data``: evidence first, a miss that no rule explains is never a ceiling.
"""

from __future__ import annotations

import math

from proxy.diagnose.findings import (
    AT_CEILING,
    HEALTHY,
    INSUFFICIENT,
    PREFIX_BLIND_POLICIES,
    TUNE,
    VERDICT_KINDS,
    Evidence,
    Finding,
    Lever,
    RuleParams,
    Verdict,
    confidence_label,
    ev,
)
from proxy.diagnose.shadow import ShadowResult
from proxy.diagnose.signals import Signals, ratio

# The types live in findings.py; importers of this module see them here too.
__all__ = [
    "AT_CEILING",
    "HEALTHY",
    "INSUFFICIENT",
    "PREFIX_BLIND_POLICIES",
    "TUNE",
    "VERDICT_KINDS",
    "Evidence",
    "Finding",
    "Lever",
    "RuleParams",
    "Verdict",
    "confidence_label",
    "ev",
    "evaluate",
    "verdict",
]


def _strength(value: float | None, threshold: float, *, above: bool = True) -> float:
    """0.6 at the threshold, rising to 1.0 once the value is twice as far past it."""
    if value is None or threshold <= 0:
        return 0.6
    margin = (value - threshold) / threshold if above else (threshold - value) / threshold
    return 0.6 + 0.4 * min(1.0, max(0.0, margin))


def _data_weight(s: Signals, p: RuleParams) -> float:
    return 0.5 + 0.5 * min(1.0, s.window.ok / max(1, 4 * p.min_requests))


def _requests_queue(s: Signals, p: RuleParams) -> tuple[bool, list[Evidence]]:
    """Requests queue: a standing engine queue, a long reported queue time, or a long admission wait."""
    wait_limit = p.queue_wait_fraction * p.slo_ttft_p95_s
    evidence = [
        ev("occupancy.queued_mean", s.occupancy.queued_mean, ">=", p.standing_queue),
        ev("latency.worker_queue.p95_s", s.latency.worker_queue.p95, ">=", wait_limit),
        ev("latency.admission_wait.p95_s", s.latency.admission_wait.p95, ">=", wait_limit),
    ]
    return any(e.holds for e in evidence), evidence


def _saturation(s: Signals) -> float | None:
    known = [v for v in (s.occupancy.occupancy_mean, s.occupancy.token_usage_mean) if v is not None]
    return max(known) if known else None


# -- the rules -------------------------------------------------------------------------------


def rule_cache_routing(s: Signals, p: RuleParams) -> Finding | None:
    c = s.cache
    if c.captured is None or c.available is None or c.reporting_requests < p.min_cache_reports:
        return None
    gap = c.available - c.captured
    evidence = [
        ev("cache.available", c.available, ">=", p.min_available),
        ev("cache.available - cache.captured", gap, ">=", p.capture_gap),
        ev("cache.captured / cache.available", c.captured / c.available if c.available else None,
           "<=", p.capture_ratio),
    ]
    if not all(e.holds for e in evidence):
        return None
    mismatched = [ps for ps in s.page_sizes if ps > 1 and any(bt % ps for bt in s.block_tokens)]
    blind = [pol for pol in s.policies if pol in PREFIX_BLIND_POLICIES]
    kv_full = ev("occupancy.token_usage_mean", s.occupancy.token_usage_mean, ">=", p.saturation)
    evidence.append(kv_full)
    head = f"workers captured {c.captured:.0%} of prompt tokens from cache against {c.available:.0%} available"
    if c.estimated:
        head += " (estimated by the proxy: the workers report no cached tokens)"
    levers: list[Lever] = []
    if blind or not s.policies:
        cause = "routing"
        summary = (f"{head}: the routing policy ({', '.join(blind) or 'unknown'}) spreads shared prefixes "
                   "over every worker, so each cache holds every prefix and keeps none")
        levers.append(Lever("routing.policy", "radixgate",
                            "switch to a prefix-affinity policy (cache_aware or the cost-based policy)"))
    elif mismatched:
        cause = "page_size_mismatch"
        summary = f"{head}: the worker page size does not line up with radixgate's hash block"
    elif kv_full.holds:
        cause = "cache_eviction"
        summary = f"{head} with affinity routing on and KV usage high: worker caches evict under memory pressure"
        levers.append(Lever("--mem-fraction-static / --max-total-tokens", "sglang",
                            "raise the KV pool so routed prefixes survive until reuse"))
    else:
        cause = "routing"
        summary = (f"{head} with affinity routing ({', '.join(s.policies)}): it balances away from the "
                   "worker that holds the prefix")
        levers.append(Lever("routing.params (load-balance threshold, prefix index size)", "radixgate",
                            "let affinity win more often; size the prefix index to the worker KV pool"))
    if mismatched:
        levers.append(Lever("--page-size / radixgate hash block size", "sglang",
                            f"make the hash block ({', '.join(map(str, s.block_tokens))} tokens) a multiple "
                            f"of the worker page size ({', '.join(map(str, mismatched))})"))
        evidence.append(Evidence("worker page_size", float(mismatched[0]), "does not divide",
                                 float(s.block_tokens[0]), True, "hash block tokens"))
    best = _best_shadow(s)
    if best is not None and cause == "routing":
        current = max((r.captured for r in s.shadow if r.policy in s.policies), default=None)
        # Replayed on this window's traffic (shadow.py): the alternative to switch to, and by how much.
        summary += (f"; replayed on this traffic, {best.policy} would capture {best.captured:.0%}"
                    + (f" against {current:.0%} for {', '.join(s.policies)}" if current is not None else ""))
        evidence.append(ev(f"shadow[{best.policy}].captured", best.captured, ">", current))
        levers.insert(0, Lever("routing.policy", "radixgate",
                               f"{best.policy}: it captured {best.captured:.0%} in the shadow replay of this window"))
    conf = _data_weight(s, p) * _strength(c.captured / c.available, p.capture_ratio, above=False)
    return Finding("cache_routing", TUNE, cause, summary, conf, tuple(evidence), tuple(levers))


def _best_shadow(s: Signals) -> ShadowResult | None:
    """The shadow policy that captured most, if it is not the one in use."""
    if not s.shadow:
        return None
    best = max(s.shadow, key=lambda r: r.captured)
    return None if best.policy in s.policies else best


def rule_cache_capacity(s: Signals, p: RuleParams) -> Finding | None:
    c = s.cache
    if c.capacity_tokens is None or c.available is None or c.reuse_ceiling is None:
        return None
    if c.reporting_requests < p.min_cache_reports:
        return None
    evidence = [
        ev("cache.reuse_ceiling", c.reuse_ceiling, ">=", p.min_available),
        ev("cache.reuse_ceiling - cache.available", c.reuse_ceiling - c.available, ">=", p.capacity_gap,
           note=f"fleet KV capacity {c.capacity_tokens} tokens"),
    ]
    if not all(e.holds for e in evidence):
        return None
    summary = (f"the workload reuses {c.reuse_ceiling:.0%} of its prompt tokens but a fleet cache of "
               f"{c.capacity_tokens} tokens can hold only enough for {c.available:.0%}: the KV pool is "
               "too small for the working set")
    levers = (
        Lever("--mem-fraction-static", "sglang", "raise it (more GPU memory for the KV pool)"),
        Lever("--max-total-tokens", "sglang", "remove or raise the cap on the KV pool"),
        Lever("replicas", "fleet", "add workers: with affinity routing total cache grows with the fleet"),
    )
    conf = _data_weight(s, p) * _strength(c.reuse_ceiling - c.available, p.capacity_gap)
    return Finding("cache_capacity", TUNE, "cache_capacity", summary, conf, tuple(evidence), levers)


def rule_admission(s: Signals, p: RuleParams) -> Finding | None:
    queueing, qev = _requests_queue(s, p)
    usage = ev("occupancy.token_usage_mean", s.occupancy.token_usage_mean, "<", p.kv_headroom)
    if not (queueing and usage.holds):
        return None
    at_cap = ev("occupancy.occupancy_mean", s.occupancy.occupancy_mean, ">=", p.running_at_cap)
    if at_cap.holds:
        cause = "max_running_requests"
        summary = (f"requests queue while the batch is full at max_running_requests and KV usage is only "
                   f"{s.occupancy.token_usage_mean:.0%}: the batch-size cap, not memory, is the limit")
        levers: tuple[Lever, ...] = (
            Lever("--max-running-requests", "sglang", "raise it until KV usage nears saturation"),
        )
    else:
        cause = "schedule_conservativeness"
        summary = (f"requests queue while KV usage is {s.occupancy.token_usage_mean:.0%} and the batch has "
                   "free slots: the scheduler admits too conservatively")
        levers = (
            Lever("--schedule-conservativeness", "sglang", "lower it (e.g. 0.3) while usage stays < 0.9"),
            Lever("--max-prefill-tokens / --chunked-prefill-size", "sglang",
                  "raise so more waiting prompts enter each prefill batch"),
        )
    conf = _data_weight(s, p) * _strength(s.occupancy.token_usage_mean, p.kv_headroom, above=False)
    if s.occupancy.occupancy_mean is None:
        conf *= 0.7
    return Finding("admission", TUNE, cause, summary, conf, (*qev, usage, at_cap), levers)


def rule_idle_gaps(s: Signals, p: RuleParams) -> Finding | None:
    idle = ev("gpu.idle_share", s.gpu.idle_share, ">=", p.idle_gap_share,
              note="" if s.gpu.available else f"unknown: {s.gpu.reason}")
    queueing, qev = _requests_queue(s, p)
    busy = ev("occupancy.occupancy_mean", s.occupancy.occupancy_mean, ">=", 0.5)
    if not (idle.holds and (queueing or busy.holds)):
        return None
    summary = (f"GPUs sat idle {s.gpu.idle_share:.0%} of the time while work was waiting or running: "
               "a scheduling or data-loading stall between forward passes")
    levers = (
        Lever("--stream-interval", "sglang", "raise it so detokenising and streaming cost fewer host cycles"),
        Lever("--schedule-policy", "sglang", "fcfs (lpm's prefix matching costs CPU when many wait)"),
        Lever("host CPU / tokenizer", "profiling", "check the host is not the bottleneck (py-spy on the scheduler)"),
    )
    conf = _data_weight(s, p) * _strength(s.gpu.idle_share, p.idle_gap_share)
    return Finding("idle_gaps", TUNE, "scheduling_stall", summary, conf, (idle, *qev, busy), levers)


def rule_prefill_tail(s: Signals, p: RuleParams) -> Finding | None:
    lat = s.latency
    over = ev("latency.ttft.p95_s", lat.ttft.p95, ">", p.slo_ttft_p95_s)
    spread = ev("latency.ttft.p95 / p50", lat.ttft.spread, ">=", p.tail_spread)
    flat = ev("latency.itl.p95 / p50", lat.itl_jitter, "<=", p.flat_decode_jitter)
    waits = [d.p95 for d in (lat.worker_queue, lat.admission_wait) if d.p95 is not None]
    queue_p95 = sum(waits) if waits else None
    share = ev("(worker_queue + admission_wait).p95 / ttft.p95",
               queue_p95 / lat.ttft.p95 if queue_p95 is not None and lat.ttft.p95 else None,
               ">=", p.queue_tail_share)
    if not (over.holds and spread.holds and (flat.holds or lat.itl_jitter is None)):
        return None
    if not share.holds and queue_p95 is not None:
        return None
    summary = (f"TTFT p95 {lat.ttft.p95:.2f}s is {lat.ttft.spread:.1f}x its p50 while decode is flat: "
               "the tail is requests waiting for admission behind long prefills")
    levers = (
        Lever("--chunked-prefill-size", "sglang", "lower it so long prompts interleave with the queue"),
        Lever("--schedule-policy", "sglang", "lpm for shared prefixes, or shortest-prefill-first"),
        Lever("replicas", "fleet", "add workers if the queue persists at the best chunk size"),
    )
    conf = _data_weight(s, p) * _strength(lat.ttft.spread, p.tail_spread)
    if queue_p95 is None:
        conf *= 0.6  # no queue-time report: the tail is inferred from shape alone
    return Finding("prefill_tail", TUNE, "queue_admission_tail", summary, conf,
                   (over, spread, flat, share), levers)


def _prefill_stall_evidence(s: Signals, p: RuleParams) -> list[Evidence]:
    lat = s.latency
    floor, worst = lat.itl_floor, lat.itl_max.p50
    return [
        ev("latency.itl_max.p50 / itl.p10", ratio(worst, floor), ">=", p.prefill_stall_ratio),
        ev("latency.itl_max.p50 - itl.p10 (s)", None if worst is None or floor is None else worst - floor,
           ">=", p.prefill_stall_s),
        ev("latency.uncached_tokens.p95", lat.uncached_tokens_p95, ">=", p.prefill_heavy_tokens),
    ]


def rule_prefill_stall(s: Signals, p: RuleParams) -> Finding | None:
    """Decode steps that wait behind prefill chunks: the slow tail of the ITL, not the middle."""
    evidence = _prefill_stall_evidence(s, p)
    if not all(e.holds for e in evidence):
        return None
    lat = s.latency
    assert lat.itl_max.p50 is not None and lat.itl_floor is not None  # the evidence holds
    summary = (f"decode steps stall behind prefill: the median request's worst token gap is "
               f"{lat.itl_max.p50 * 1000:.0f} ms against {lat.itl_floor * 1000:.0f} ms for a step without "
               f"prefill, while prompts bring up to {lat.uncached_tokens_p95:.0f} uncached tokens")
    levers = (
        Lever("--enable-mixed-chunk", "sglang", "run decodes in the same batch as prefill chunks"),
        Lever("--chunked-prefill-size", "sglang", "then lower it: each chunk bounds how long a decode step waits"),
        Lever("prefill/decode disaggregation", "fleet", "move long prefills off the decode workers"),
    )
    conf = 0.75 * _data_weight(s, p) * _strength(ratio(lat.itl_max.p50, lat.itl_floor), p.prefill_stall_ratio)
    return Finding("prefill_stall", TUNE, "prefill_interference", summary, conf, tuple(evidence), levers)


def rule_decode_jitter(s: Signals, p: RuleParams) -> Finding | None:
    if all(e.holds for e in _prefill_stall_evidence(s, p)):
        return None  # the jitter has a cause the prefill_stall rule names
    jitter = ev("latency.itl.p95 / p50", s.latency.itl_jitter, ">=", p.jittery_decode)
    small = ev("gpu.idle_share", s.gpu.idle_share, "<=", p.small_idle_share,
               note="" if s.gpu.available else f"unknown: {s.gpu.reason}")
    if not (jitter.holds and small.holds):
        return None
    summary = (f"decode is jittery (ITL p95 {s.latency.itl_jitter:.1f}x p50) while the GPU is rarely idle: "
               "kernel- or memory-bandwidth-bound steps, a GPU-profiling question")
    levers = (
        Lever("nsys / torch profiler on decode steps", "profiling", "find the slow kernels or HBM stalls"),
        Lever("--attention-backend / --cuda-graph-max-bs", "sglang", "try another backend; cover the batch"),
    )
    conf = 0.8 * _data_weight(s, p) * _strength(s.latency.itl_jitter, p.jittery_decode)
    return Finding("decode_jitter", TUNE, "kernel_or_bandwidth", summary, conf, (jitter, small), levers)


def rule_proxy_overhead(s: Signals, p: RuleParams) -> Finding | None:
    share = ev("latency.proxy_overhead_share", s.latency.proxy_overhead_share, ">=", p.proxy_overhead_share)
    if not share.holds:
        return None
    summary = f"radixgate itself takes {s.latency.proxy_overhead_share:.0%} of TTFT before dispatch"
    levers = (
        Lever("routing.max_blocks", "radixgate", "hash fewer blocks per prompt"),
        Lever("routing.policy", "radixgate", "a cheaper policy, or fewer workers per decision"),
    )
    conf = _data_weight(s, p) * _strength(s.latency.proxy_overhead_share, p.proxy_overhead_share)
    return Finding("proxy_overhead", TUNE, "proxy_overhead", summary, conf, (share,), levers)


def rule_hot_prefix(s: Signals, p: RuleParams) -> Finding | None:
    """One shared prefix (a global system prompt) carries more requests than one worker can
    prefill, but affinity keeps it on too few workers: its own requests queue there."""
    hot, n = s.hot_prefix, s.workers
    if hot is None or n < 2:
        return None
    needed = math.ceil(hot.share * n)
    share = ev("hot_prefix.share x workers", hot.share * n, ">=", p.hot_prefix_share)
    spread = ev("hot_prefix.workers", float(hot.workers), "<", float(needed))
    slow = ev("hot_prefix.ttft_p95_s", hot.ttft_p95, ">", p.slo_ttft_p95_s)
    if not (share.holds and spread.holds and slow.holds):
        return None
    summary = (f"one shared prefix carries {hot.share:.0%} of requests (about {needed} workers' share) but ran on "
               f"{hot.workers}: its requests queue there (their TTFT p95 {hot.ttft_p95:.2f}s)")
    levers = (
        Lever("routing.params (work_weight, tie_rel)", "radixgate",
              "let the hot prefix spill to more workers sooner; its prefill is cheaper than the queue"),
        Lever("replicas", "fleet", "more workers for the prefix that needs them"),
    )
    conf = _data_weight(s, p) * _strength(hot.ttft_p95, p.slo_ttft_p95_s)
    return Finding("hot_prefix", TUNE, "hot_prefix", summary, conf, (share, spread, slow), levers)


def rule_mixed_page_sizes(s: Signals, p: RuleParams) -> Finding | None:
    """Workers of one pool with different KV page sizes: radixgate's hash block must be a multiple
    of all of them (their least common multiple), so prefix matches are only as fine as the coarsest
    combination, and the same prompt pages differently on each worker."""
    sizes = sorted({ps for ps in s.page_sizes if ps > 0})
    if len(sizes) < 2:
        return None
    evidence = (Evidence("distinct worker page sizes", float(len(sizes)), ">=", 2.0, True,
                         ", ".join(map(str, sizes))),)
    levers = (Lever("--page-size", "sglang", f"one page size across the pool (now {', '.join(map(str, sizes))})"),)
    summary = f"the workers run different KV page sizes ({', '.join(map(str, sizes))}): one pool, one --page-size"
    return Finding("mixed_page_sizes", TUNE, "page_size_mismatch", summary, 0.9 * _data_weight(s, p), evidence, levers)


TUNE_RULES = (rule_cache_routing, rule_cache_capacity, rule_admission, rule_idle_gaps,
              rule_prefill_tail, rule_prefill_stall, rule_decode_jitter, rule_proxy_overhead, rule_mixed_page_sizes,
              rule_hot_prefix)


def rule_ceiling(s: Signals, p: RuleParams) -> Finding | None:
    """At the ceiling: saturated, cache and gaps as good as they get, SLO still missed."""
    over = ev("latency.ttft.p95_s", s.latency.ttft.p95, ">", p.slo_ttft_p95_s)
    saturated = ev("max(occupancy_mean, token_usage_mean)", _saturation(s), ">=", p.saturation)
    small = ev("gpu.idle_share", s.gpu.idle_share, "<=", p.small_idle_share,
               note="" if s.gpu.available else f"unknown: {s.gpu.reason}")
    c = s.cache
    cache_ok = ev("cache.available - cache.captured",
                  None if c.available is None or c.captured is None else c.available - c.captured,
                  "<", p.capture_gap)
    # Evidence first: "buy hardware" only when the cache figure is known to be as good as it gets.
    if not (over.holds and saturated.holds and cache_ok.holds):
        return None
    summary = (f"TTFT p95 {s.latency.ttft.p95:.2f}s misses the {p.slo_ttft_p95_s:g}s SLO with the fleet "
               "saturated, the cache capturing what the workload allows and no tunable stall: the runtime "
               "is at its ceiling on this hardware")
    levers = (
        Lever("model", "model_or_hardware", "a smaller or quantized model, or speculative decoding"),
        Lever("hardware", "model_or_hardware", "more replicas, or faster GPUs / tensor parallelism"),
    )
    conf = _data_weight(s, p) * _strength(s.latency.ttft.p95, p.slo_ttft_p95_s)
    if small.value is None:
        conf *= 0.8  # that part of the claim rests on absence of evidence
    if c.estimated:
        conf *= 0.8  # the cache figure is the proxy's estimate
    return Finding("ceiling", AT_CEILING, "saturated", summary, conf, (over, saturated, cache_ok, small), levers)


def rule_latency_floor(s: Signals, p: RuleParams) -> Finding | None:
    over = ev("latency.ttft.p95_s", s.latency.ttft.p95, ">", p.slo_ttft_p95_s)
    queueing, qev = _requests_queue(s, p)
    saturated = ev("max(occupancy_mean, token_usage_mean)", _saturation(s), "<", p.saturation)
    # Evidence first: "no queueing" only when the engine reported its queue (an engine without
    # metrics queues unseen: on the GPU fleet that read as a floor at 7 s TTFT p95 against 0.2 s idle).
    if s.latency.worker_queue.p95 is None or s.occupancy.queued_mean is None or saturated.value is None:
        return None
    if not (over.holds and not queueing and saturated.holds):
        return None
    summary = (f"TTFT p95 {s.latency.ttft.p95:.2f}s misses the {p.slo_ttft_p95_s:g}s SLO with no queueing "
               "and spare capacity: prefill of these prompts on this model and GPU is the floor")
    levers = (
        Lever("model", "model_or_hardware", "a smaller model, or relax the SLO"),
        Lever("hardware", "model_or_hardware", "a faster GPU or tensor parallelism (--tp-size)"),
    )
    conf = 0.8 * _data_weight(s, p) * _strength(s.latency.ttft.p95, p.slo_ttft_p95_s)
    return Finding("latency_floor", AT_CEILING, "latency_floor", summary, conf, (over, *qev, saturated), levers)


def rule_missing_signals(s: Signals, p: RuleParams) -> Finding | None:
    """What the engines do not report, and the flag that makes them: a diagnosis that cannot see
    a cause must say so rather than call the fleet healthy or at its ceiling."""
    evidence: list[Evidence] = []
    levers: list[Lever] = []
    missing: list[str] = []
    if s.cache.estimated or s.cache.captured is None:
        missing.append("cached tokens")
        evidence.append(Evidence("requests with cached_tokens reported", 0.0, "==", 0.0, True,
                                 "the cache figures are the proxy's estimate" if s.cache.estimated else "no figures"))
        levers.append(Lever("--enable-cache-report", "sglang",
                            "report cached_tokens on every answer (OpenAI usage included)"))
        levers.append(Lever("--kv-events-config + kv_events.endpoint", "sglang",
                            "publish the KV cache so radixgate routes and counts on what each engine holds"))
    if s.occupancy.queued_mean is None or s.latency.worker_queue.p95 is None:
        missing.append("queue and batch state")
        evidence.append(Evidence("engine queue / occupancy samples", None, "known", None, True,
                                 "no /metrics or /v1/loads from the workers"))
        levers.append(Lever("--enable-metrics", "sglang", "expose queue, running batch and KV usage"))
    if not missing:
        return None
    summary = "the workers do not report " + " or ".join(missing) + ": findings that need them cannot fire"
    return Finding("missing_signals", INSUFFICIENT, "missing_signals", summary, 1.0, tuple(evidence), tuple(levers))


def evaluate(s: Signals, p: RuleParams) -> list[Finding]:
    """Every tune finding that fires; the ceiling findings only when no tune finding fired."""
    tune = [f for rule in TUNE_RULES if (f := rule(s, p)) is not None]
    if tune:
        return sorted(tune, key=lambda f: -f.confidence)
    ceiling = rule_ceiling(s, p) or rule_latency_floor(s, p)
    return [ceiling] if ceiling else []


def verdict(s: Signals, p: RuleParams) -> Verdict:
    ttft_p95 = s.latency.ttft.p95
    slo_met = None if ttft_p95 is None else ttft_p95 <= p.slo_ttft_p95_s

    def make(kind: str, summary: str, conf: float, findings: list[Finding]) -> Verdict:
        levers: list[Lever] = []
        for f in findings:
            levers.extend(lv for lv in f.levers if lv not in levers)
        return Verdict(kind, summary, round(conf, 3), tuple(levers), tuple(findings),
                       p.slo_ttft_p95_s, ttft_p95, slo_met)

    if s.window.ok < p.min_requests:
        return make(INSUFFICIENT, f"{s.window.ok} successful requests in the window; need {p.min_requests}",
                    1.0, [])
    findings = evaluate(s, p)
    blind = rule_missing_signals(s, p)
    extra = [blind] if blind is not None else []
    if findings and findings[0].kind == TUNE:
        causes = ", ".join(dict.fromkeys(f.cause for f in findings))
        return make(TUNE, f"tune: {causes} — {findings[0].summary}", findings[0].confidence, findings + extra)
    if findings:
        return make(AT_CEILING, findings[0].summary, findings[0].confidence, findings + extra)
    if slo_met is not False:
        margin = 1.0 if ttft_p95 is None else _strength(ttft_p95, p.slo_ttft_p95_s, above=False)
        if blind is not None:
            return make(HEALTHY, f"healthy as far as the signals show: SLO met, no rule fired; {blind.summary}",
                        0.6 * _data_weight(s, p) * margin, extra)
        return make(HEALTHY, "healthy: SLO met and no rule fired; nothing to change",
                    _data_weight(s, p) * margin, [])
    # Evidence first: a missed SLO that no rule explains is not a hardware ceiling.
    if blind is not None:
        return make(INSUFFICIENT, f"SLO missed and the signals cannot say why: {blind.summary}", 0.5, extra)
    return make(INSUFFICIENT, "SLO missed and no rule explains it from the signals the workers report", 0.3, [])
