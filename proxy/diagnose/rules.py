"""Rules: pure functions from ``Signals`` to findings, and from findings to one verdict.

Each rule reads a few signals, compares them with a threshold from ``RuleParams`` and, when it
fires, returns a ``Finding`` with its evidence (signal, value, threshold), the levers to pull
(SGLang flags or radixgate settings) and a confidence in 0..1. A rule whose evidence is unknown
stays silent (or fires with lowered confidence where noted) — it never assumes a value.

| rule | fires when | kind | levers |
|---|---|---|---|
| cache_routing | captured ≪ available (gap ≥ capture_gap and captured/available ≤ capture_ratio) | tune | routing policy; page size; routing.dp_ranks where workers run DP ranks it does not name; KV memory |
| cache_capacity | reuse ceiling - available ≥ capacity_gap (fleet KV too small for the working set) | tune | --mem-fraction-static, --max-total-tokens, replicas |
| admission | requests queue (engine queue, worker queue time or our admission wait) while KV usage < kv_headroom; with free batch slots only where the wait costs latency (queue time ≥ queue_wait_fraction x SLO, or the SLO missed) and is ≥ queue_tail_share of the TTFT p95; confidence halved as the queue concentrates on one worker | tune | --max-running-requests, --schedule-conservativeness |
| idle_gaps | GPU idle share ≥ idle_gap_share while there is demand | tune | scheduler / host stall levers |
| prefill_tail | TTFT p95 > SLO, p95/p50 ≥ tail_spread, decode flat, the tail is queueing | tune | --chunked-prefill-size, --schedule-policy, replicas |
| prefill_stall | the median request's worst token gap ≥ prefill_stall_ratio × ITL p10 and ≥ p10 + prefill_stall_s, with big prefills (uncached p95 ≥ prefill_heavy_tokens) | tune | --enable-mixed-chunk, --chunked-prefill-size, PD disaggregation |
| decode_jitter | ITL p95/p50 ≥ jittery_decode with GPU idle ≤ small_idle_share, and no prefill stall | tune | GPU profiling (kernel / memory bandwidth) |
| proxy_overhead | our share of TTFT ≥ proxy_overhead_share | tune | radixgate routing settings |
| ceiling | TTFT p95 > SLO, saturated, no tune rule fired, the cache figure (measured or estimated) as good as allowed | at_ceiling | model swap or hardware |
| latency_floor | TTFT p95 > SLO, the engines *report* no queue and spare capacity, the prompts' unloaded TTFT p95 (estimated) > SLO too and the fastest tenth of the biggest prompts' TTFTs as well, no tune rule fired | at_ceiling | model swap, faster GPU, tensor parallel |
| load_bound | (no tune finding, not saturated) TTFT p95 > SLO, ≥ load_bound_ratio x the same prompts' unloaded TTFT p95 estimated by the shadow replay's model (where its fit gives none, the fastest tenth of the biggest prompts' TTFTs, measured), which is within the SLO | tune | replicas, admission.per_worker_limit |
| overload | TTFT p95 > SLO and the median TTFT of the window's last third of requests ≥ overload_growth × its first third's and ≥ overload_min_s above it, the last third ≥ overload_still_growing of that rise above the middle third's unless clients gave up (the queue still grows: arrivals outrun the fleet; a closed loop's early burst plateaus) | tune | replicas, admission.queue_size / queue_timeout_s |
| mixed_page_sizes | the pool's workers report different KV page sizes | tune | one --page-size |
| hot_prefix | one prefix's share of requests, per worker that served it, ≥ hot_prefix_share / workers, its TTFT p95 > SLO | tune | spill sooner (cache_aware balance_abs_threshold, ttft work_weight / tie_rel), routing.policy ttft, replicas |
| missing_signals | no cached tokens, or no queue / batch state, reported, or KV event streams routing does not read (unconfirmed / failed) | (added to any verdict) | --enable-cache-report, --enable-metrics, KV events; routing.tokenizer, the engine's publisher |

The tune rules live by topic: ``rules_cache.py`` (cache_routing, cache_capacity, mixed_page_sizes,
hot_prefix) and ``rules_latency.py`` (the others); the ceiling rules, missing_signals and the
verdict here, since only the verdict decides when they run.

Verdict (a total function): fewer than ``min_requests`` successful requests (those cut short
with a TTFT known or bounded count: ``RequestRecord.ttft_evidence``) → ``insufficient_data``;
any tune finding → ``tune`` (levers of every tune finding, strongest first, capacity after a
routing switch the shadow replay predicts to cut the tail); a ceiling finding →
``at_ceiling``; SLO met → ``healthy`` ("as far as the signals show" when some are missing);
otherwise ``insufficient_data``: evidence first, a miss that no rule explains is never a ceiling.
"""

from __future__ import annotations

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
from proxy.diagnose.rule_common import data_weight, requests_queue, saturation, strength
from proxy.diagnose.rules_cache import (
    predicts_gain,
    rule_cache_capacity,
    rule_cache_routing,
    rule_hot_prefix,
    rule_mixed_page_sizes,
)
from proxy.diagnose.rules_latency import (
    rule_admission,
    rule_decode_jitter,
    rule_idle_gaps,
    rule_load_bound,
    rule_overload,
    rule_prefill_stall,
    rule_prefill_tail,
    rule_proxy_overhead,
)
from proxy.diagnose.signals import Signals

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


TUNE_RULES = (rule_cache_routing, rule_cache_capacity, rule_admission, rule_idle_gaps,
              rule_prefill_tail, rule_prefill_stall, rule_decode_jitter, rule_proxy_overhead, rule_mixed_page_sizes,
              rule_hot_prefix, rule_overload)


def rule_ceiling(s: Signals, p: RuleParams) -> Finding | None:
    """At the ceiling: saturated, cache and gaps as good as they get, SLO still missed."""
    over = ev("latency.ttft.p95_s", s.latency.ttft.p95, ">", p.slo_ttft_p95_s)
    saturated = ev("max(occupancy_mean, token_usage_mean)", saturation(s), ">=", p.saturation)
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
    conf = data_weight(s, p) * strength(s.latency.ttft.p95, p.slo_ttft_p95_s)
    if small.value is None:
        conf *= 0.8  # that part of the claim rests on absence of evidence
    if c.estimated:
        conf *= 0.8  # the cache figure is the proxy's estimate
    return Finding("ceiling", AT_CEILING, "saturated", summary, conf, (over, saturated, cache_ok, small), levers)


def rule_latency_floor(s: Signals, p: RuleParams) -> Finding | None:
    over = ev("latency.ttft.p95_s", s.latency.ttft.p95, ">", p.slo_ttft_p95_s)
    queueing, qev = requests_queue(s, p)
    saturated = ev("max(occupancy_mean, token_usage_mean)", saturation(s), "<", p.saturation)
    # Evidence first: "no queueing" only when the engine reported its queue (an engine without
    # metrics queues unseen: on the GPU fleet that read as a floor at 7 s TTFT p95 against 0.2 s idle).
    if s.latency.worker_queue.p95 is None or s.occupancy.queued_mean is None or saturated.value is None:
        return None
    # ...and a floor only where these prompts miss the SLO on idle engines too (the window's own
    # TTFT model): the GPU fleet at 6/s, 4.1 s p95 against 0.6 s p50, read as a floor with a
    # queue of one request per engine, its batches full of concurrent prefills.
    floor = ev("unloaded_ttft_p95_s (estimated)", s.unloaded_ttft_p95, ">", p.slo_ttft_p95_s,
               note="the shadow replay's TTFT model with nothing ahead or decoding")
    # The fit's intercept takes up load no feature explains, so it can put idle engines too high:
    # the fastest of the biggest prompts must have missed the SLO as well (measured).
    fastest = ev("latency.ttft_big_p10_s", s.latency.ttft_big_p10, ">", p.slo_ttft_p95_s,
                 note="TTFT p10 of the requests that brought the most prefill")
    if not (over.holds and not queueing and saturated.holds and floor.holds and fastest.holds):
        return None
    summary = (f"TTFT p95 {s.latency.ttft.p95:.2f}s misses the {p.slo_ttft_p95_s:g}s SLO with no queueing "
               "and spare capacity: prefill of these prompts on this model and GPU is the floor")
    levers = (
        Lever("model", "model_or_hardware", "a smaller model, or relax the SLO"),
        Lever("hardware", "model_or_hardware", "a faster GPU or tensor parallelism (--tp-size)"),
    )
    conf = 0.8 * data_weight(s, p) * strength(s.latency.ttft.p95, p.slo_ttft_p95_s)
    return Finding("latency_floor", AT_CEILING, "latency_floor", summary, conf,
                   (over, *qev, saturated, floor, fastest), levers)


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
    # Only the scraped queue: per-request queue times come in SGLang's meta_info alone, so OpenAI
    # traffic never has them whatever the engine's flags (the GPU fleet's chat phases, with /v1/loads
    # scraped, were told to set --enable-metrics).
    if s.occupancy.queued_mean is None:
        missing.append("queue and batch state")
        evidence.append(Evidence("engine queue / occupancy samples", None, "known", None, True,
                                 "no /metrics or /v1/loads from the workers"))
        levers.append(Lever("--enable-metrics", "sglang", "expose queue, running batch and KV usage"))
    if s.kv_doubted:
        # Their events are set up but routing cannot use them: most often the proxy tokenizes
        # differently from the engine (its blocks then never match), or the publisher stopped.
        missing.append(f"KV events routing can use ({len(s.kv_doubted)} of {max(s.workers, len(s.kv_doubted))} "
                       "workers' streams do not show what their engines prefilled)")
        evidence.append(Evidence("workers with an unconfirmed or failed KV event stream", float(len(s.kv_doubted)),
                                 ">", 0.0, True, ", ".join(s.kv_doubted)))
        levers.append(Lever("routing.tokenizer", "radixgate",
                            "the model's own tokenizer, so the proxy's token ids are the engine's"))
        levers.append(Lever("--kv-events-config", "sglang",
                            "check the engine's publisher and page size (GET /workers: kv_events.confirmation)"))
    if s.peer_requests:
        # Its peers' requests shared the engines' caches and queues: the window's cache capture,
        # available reuse and shadow replays are of this replica's requests alone (on the GPU fleet
        # a replica's shadow replay of its quarter read 34% where the fleet captured 74%).
        fleet = s.window.requests + s.peer_requests
        missing.append(f"the rest of the fleet's traffic (this replica routed {s.window.requests} of the "
                       f"~{fleet} requests in the window, its peers the rest)")
        evidence.append(Evidence("requests the peer replicas routed in the window", float(s.peer_requests),
                                 ">", 0.0, True, f"{s.window.requests / fleet:.0%} of the fleet's were this replica's"))
        levers.append(Lever("diagnose.fleet_view", "radixgate",
                            "true on every replica: each tells the others its finished requests, so every "
                            "replica's diagnosis reads the fleet's traffic"))
    if not missing:
        return None
    summary = "the workers do not report " + " or ".join(missing) + ": findings that need them cannot fire"
    return Finding("missing_signals", INSUFFICIENT, "missing_signals", summary, 1.0, tuple(evidence), tuple(levers))


def evaluate(s: Signals, p: RuleParams) -> list[Finding]:
    """Every tune finding that fires; only when none did, the first of: the ceiling (saturated),
    load (the tail is load on unsaturated engines: more of them), the latency floor."""
    tune = [f for rule in TUNE_RULES if (f := rule(s, p)) is not None]
    if tune:
        # Strongest first, except that capacity comes after a routing switch the shadow replay
        # predicts to cut the tail: the free lever before the one that costs GPUs (round robin past
        # capacity: the queue grows because it recomputes what the switch would have cached).
        switch = any(predicts_gain(f) for f in tune)
        return sorted(tune, key=lambda f: (switch and f.cause == "over_capacity", -f.confidence))
    found = rule_ceiling(s, p) or rule_load_bound(s, p) or rule_latency_floor(s, p)
    return [found] if found else []


def verdict(s: Signals, p: RuleParams) -> Verdict:
    ttft_p95 = s.latency.ttft.p95
    slo_met = None if ttft_p95 is None else ttft_p95 <= p.slo_ttft_p95_s

    def make(kind: str, summary: str, conf: float, findings: list[Finding]) -> Verdict:
        levers: list[Lever] = []
        for f in findings:
            levers.extend(lv for lv in f.levers if lv not in levers)
        return Verdict(kind, summary, round(conf, 3), tuple(levers), tuple(findings),
                       p.slo_ttft_p95_s, ttft_p95, slo_met)

    if s.window.ok + s.window.cut_short < p.min_requests:
        return make(INSUFFICIENT, f"{s.window.ok} successful requests in the window"
                    + (f" and {s.window.cut_short} cut short" if s.window.cut_short else "")
                    + (f" (the peer replicas routed {s.peer_requests} more)" if s.peer_requests else "")
                    + f"; need {p.min_requests}", 1.0, [])
    findings = evaluate(s, p)
    blind = rule_missing_signals(s, p)
    extra = [blind] if blind is not None else []
    if findings and findings[0].kind == TUNE:
        causes = ", ".join(dict.fromkeys(f.cause for f in findings))
        return make(TUNE, f"tune: {causes} — {findings[0].summary}", findings[0].confidence, findings + extra)
    if findings:
        return make(AT_CEILING, findings[0].summary, findings[0].confidence, findings + extra)
    if slo_met is not False:
        margin = 1.0 if ttft_p95 is None else strength(ttft_p95, p.slo_ttft_p95_s, above=False)
        if blind is not None:
            return make(HEALTHY, f"healthy as far as the signals show: SLO met, no rule fired; {blind.summary}",
                        0.6 * data_weight(s, p) * margin, extra)
        return make(HEALTHY, "healthy: SLO met and no rule fired; nothing to change",
                    data_weight(s, p) * margin, [])
    # Evidence first: a missed SLO that no rule explains is not a hardware ceiling.
    if blind is not None:
        return make(INSUFFICIENT, f"SLO missed and the signals cannot say why: {blind.summary}", 0.5, extra)
    return make(INSUFFICIENT, "SLO missed and no rule explains it from the signals the workers report", 0.3, [])
