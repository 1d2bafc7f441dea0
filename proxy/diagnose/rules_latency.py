"""Tune rules about latency and scheduling: admission, idle GPUs, the TTFT tail, decode stalls and
jitter, the proxy's own overhead (``rules.py`` lists every rule)."""

from __future__ import annotations

from proxy.diagnose.findings import TUNE, Evidence, Finding, Lever, RuleParams, ev
from proxy.diagnose.rule_common import (
    data_weight,
    queue_balance,
    queue_concentration,
    queue_waits,
    requests_queue,
    strength,
)
from proxy.diagnose.signals import Signals, ratio


def rule_admission(s: Signals, p: RuleParams) -> Finding | None:
    queueing, qev = requests_queue(s, p)
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
        # Free slots and free KV: the queue is the engine taking waiting prompts in turn, which is
        # a lever only where that wait costs latency (its queue time a share of the SLO, or the SLO
        # missed). Otherwise it fired on fleets meeting the SLO with a prompt or two in line per
        # worker (the hot-prefix scenario's spread runs: 0.89-0.93 with the SLO met).
        wait_limit = p.queue_wait_fraction * p.slo_ttft_p95_s
        waits = queue_waits(s)
        slow = s.latency.ttft.p95 is not None and s.latency.ttft.p95 > p.slo_ttft_p95_s
        if not slow and not any(w >= wait_limit for w in waits):
            return None
        # ...and only where that wait is much of the TTFT tail: admitting sooner saves at most the
        # wait. On the GPU fleet past its knee (run 22) it fired on a queue of one request per
        # engine, 0.6 s of a 4.1 s TTFT p95; the lever it named, pulled (twice the prefill budget
        # per step), gave 5.7 s against 3.8-4.5 s: the time was the batch, not the admission.
        tail = sum(waits) / s.latency.ttft.p95 if waits and s.latency.ttft.p95 else None
        if tail is not None and tail < p.queue_tail_share:
            return None
        cause = "schedule_conservativeness"
        summary = (f"requests queue while KV usage is {s.occupancy.token_usage_mean:.0%} and the batch has "
                   "free slots: the scheduler admits too conservatively")
        levers = (
            Lever("--schedule-conservativeness", "sglang", "lower it (e.g. 0.3) while usage stays < 0.9"),
            Lever("--max-prefill-tokens / --chunked-prefill-size", "sglang",
                  "raise so more waiting prompts enter each prefill batch"),
        )
    conf = data_weight(s, p) * strength(s.occupancy.token_usage_mean, p.kv_headroom, above=False)
    if s.occupancy.occupancy_mean is None:
        conf *= 0.7
    # An engine setting holds back every worker alike; a queue standing on one worker while the
    # others have none is where routing piled the load (a hot prefix pinned by cache_aware: 18
    # queued on one of 4 workers, 0 on the rest, fleet KV 4%), so the setting explains it less.
    balance = queue_balance(s)
    conf *= 0.5 + 0.5 * balance
    spread = () if queue_concentration(s) is None else (
        ev("queue balance over workers", balance, ">", 0.0,
           note="1 = even, 0 = one worker holds the whole queue; confidence x (0.5 + 0.5 x balance)"),)
    return Finding("admission", TUNE, cause, summary, conf, (*qev, usage, at_cap, *spread), levers)


def rule_overload(s: Signals, p: RuleParams) -> Finding | None:
    """Arrivals outrun what the fleet serves: the TTFT of the window's last third of requests is
    a multiple of its first third's, seconds apart, and the SLO is missed. Evidence that needs no
    engine report (the GPU fleet past its knee: 0.4 s early, 6-8 s late, its engines' batch caps
    far from full), and one no engine setting removes: every other finding only buys capacity by
    what it saves."""
    lat = s.latency
    over = ev("latency.ttft.p95_s", lat.ttft.p95, ">", p.slo_ttft_p95_s)
    early, late = lat.ttft_early_p50, lat.ttft_late_p50
    if early is None or late is None or not over.holds:
        return None
    grew = ev("ttft p50, last third / first third", ratio(late, early) if early > 0 else None, ">=", p.overload_growth)
    gap = ev("ttft p50, last third - first third (s)", late - early, ">=", p.overload_min_s)
    if not (grew.holds and gap.holds):
        return None
    # Still growing in the last third, not a plateau reached early: a closed loop's clients all
    # start at once, so its first third is the burst draining and the rest a standing queue as
    # long as the clients are many (CI: 32 clients on 8 batch slots, 0.16 s early, 0.72 s late,
    # the middle third as late). Unless the TTFTs are bounds: clients that gave up cap the late
    # thirds at their patience however long the queue grows. On the GPU fleet's committed runs
    # (clients' TTFTs by arrival), 62 of the 76 phases whose last third grew 2x still grew in it;
    # 14 had plateaued by the middle (0.62 -> 5.49 -> 4.79 s), left to load_bound (also capacity).
    mid = lat.ttft_mid_p50
    growing = ev("ttft p50, last third - middle third (s)", None if mid is None else late - mid, ">=",
                 p.overload_still_growing * (late - early),
                 note=f"{p.overload_still_growing} x the rise from the first third: the queue still grows")
    if lat.ttft_waited_out == 0 and not growing.holds:
        return None
    summary = (f"the queue grows through the window: median TTFT {early:.2f}s for the first third of requests, "
               f"{late:.2f}s for the last; arrivals exceed what the fleet serves")
    levers = (
        Lever("replicas", "model_or_hardware", "more workers (or faster ones) until TTFT stops growing"),
        Lever("admission.queue_size / admission.queue_timeout_s", "radixgate",
              "bound the proxy's queue so excess load is refused (503) instead of waiting without end"),
    )
    conf = data_weight(s, p) * strength(ratio(late, early), p.overload_growth)
    return Finding("overload", TUNE, "over_capacity", summary, conf, (over, grew, gap, growing), levers)


def rule_load_bound(s: Signals, p: RuleParams) -> Finding | None:
    """The SLO is missed by load, not by the prompts: the window's own TTFT model (the shadow
    replay's fit) puts these prompts on idle engines well inside the SLO, and the measured p95 is
    a multiple of that. The engines may show it as a queue or not at all (a batch of concurrent
    prefills sharing each step: on the GPU fleet past its knee, TTFT p95 4.1 s with an engine queue
    of one request, 20% of the GPU idle, the prompts ~0.5 s unloaded), and no setting the signals
    point at removes it. Checked only when no other tune rule fired and the fleet is not saturated
    (``rules.evaluate``): a cause with a lever of its own comes first."""
    over = ev("latency.ttft.p95_s", s.latency.ttft.p95, ">", p.slo_ttft_p95_s)
    # Where the window's fit cannot separate a prompt's own cost from the load (loaded throughout),
    # the fastest of the biggest prompts stands for it, measured: the biggest prompts set the idle
    # p95, and load only adds to what each took, so it errs high, against calling the tail load.
    idle: float | None
    if s.unloaded_ttft_p95 is not None:
        idle, name, note = (s.unloaded_ttft_p95, "unloaded_ttft_p95_s (estimated)",
                            "the shadow replay's TTFT model with nothing ahead or decoding")
    else:
        idle, name, note = (s.latency.ttft_big_p10, "latency.ttft_big_p10_s",
                            "no unloaded estimate; TTFT p10 of the requests that brought the most prefill")
    unloaded = ev(name, idle, "<=", p.slo_ttft_p95_s, note=note)
    if not (over.holds and unloaded.holds):
        return None
    assert s.latency.ttft.p95 is not None and idle is not None  # the evidence holds
    load = ratio(s.latency.ttft.p95, idle) if idle > 0 else None
    grown = ev(f"ttft.p95 / {name.split(' ')[0]}", load, ">=", p.load_bound_ratio)
    if not grown.holds:
        return None
    how = "estimated" if s.unloaded_ttft_p95 is not None else "the fastest of the biggest prompts, measured"
    summary = (f"TTFT p95 {s.latency.ttft.p95:.2f}s against ~{idle:.2f}s for the same prompts "
               f"on idle engines ({how}): the time goes to the load each engine carries, the requests "
               "queued or batched ahead, more than the fleet serves within the SLO")
    levers = (
        Lever("replicas", "model_or_hardware", "more workers (or faster ones) until the per-worker load is "
              "under the rate that meets the SLO"),
        Lever("admission.per_worker_limit / admission.queue_size", "radixgate",
              "cap what each worker is given, so excess load waits or is refused at the proxy, visibly"),
    )
    # A model fitted on the window, not a reading: never as sure as a measured cause.
    conf = 0.8 * data_weight(s, p) * strength(load, p.load_bound_ratio)
    return Finding("load_bound", TUNE, "over_capacity", summary, conf, (over, unloaded, grown), levers)


def rule_idle_gaps(s: Signals, p: RuleParams) -> Finding | None:
    idle = ev("gpu.idle_share", s.gpu.idle_share, ">=", p.idle_gap_share,
              note="" if s.gpu.available else f"unknown: {s.gpu.reason}")
    queueing, qev = requests_queue(s, p)
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
    conf = data_weight(s, p) * strength(s.gpu.idle_share, p.idle_gap_share)
    return Finding("idle_gaps", TUNE, "scheduling_stall", summary, conf, (idle, *qev, busy), levers)


def rule_prefill_tail(s: Signals, p: RuleParams) -> Finding | None:
    lat = s.latency
    over = ev("latency.ttft.p95_s", lat.ttft.p95, ">", p.slo_ttft_p95_s)
    spread = ev("latency.ttft.p95 / p50", lat.ttft.spread, ">=", p.tail_spread)
    flat = ev("latency.itl.p95 / p50", lat.itl_jitter, "<=", p.flat_decode_jitter)
    waits = queue_waits(s)
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
    conf = data_weight(s, p) * strength(lat.ttft.spread, p.tail_spread)
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
        # The trade, measured on the GPU fleet (loadtests/results/gpu-fleet-lever-3): half the
        # prefill budget per step cut the worst decode stall ~20% and raised TTFT p95 1.38x.
        Lever("--chunked-prefill-size", "sglang", "then lower it: each chunk bounds how long a decode step waits, "
              "and prefill takes more steps: TTFT rises"),
        Lever("prefill/decode disaggregation", "fleet", "move long prefills off the decode workers"),
    )
    conf = 0.75 * data_weight(s, p) * strength(ratio(lat.itl_max.p50, lat.itl_floor), p.prefill_stall_ratio)
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
    conf = 0.8 * data_weight(s, p) * strength(s.latency.itl_jitter, p.jittery_decode)
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
    conf = data_weight(s, p) * strength(s.latency.proxy_overhead_share, p.proxy_overhead_share)
    return Finding("proxy_overhead", TUNE, "proxy_overhead", summary, conf, (share,), levers)
