"""Each rule fires on its evidence and not otherwise; the verdict follows the findings."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proxy.diagnose import rules
from proxy.diagnose.rules import RuleParams
from proxy.diagnose.signals import Signals
from tests.unit.diagnose_builders import dist, gpu, healthy_signals


def with_(s: Signals, **parts: dict[str, Any] | Any) -> Signals:
    """Replace fields of the nested signal dataclasses: with_(s, cache={"captured": 0.1})."""
    changes = {}
    for name, value in parts.items():
        current = getattr(s, name)
        changes[name] = dataclasses.replace(current, **value) if isinstance(value, dict) else value
    return dataclasses.replace(s, **changes)


P = RuleParams()

CASES = [
    # (name, changes, rules that fire, verdict kind, cause of the first finding)
    ("a healthy fleet fires nothing", {}, set(), rules.HEALTHY, None),
    ("round robin leaving cache on the table is a routing problem",
     {"cache": {"captured": 0.20, "available": 0.70}, "policies": ("round_robin",)},
     {"cache_routing"}, rules.TUNE, "routing"),
    ("a small capture gap is not a finding",
     {"cache": {"captured": 0.60, "available": 0.70}, "policies": ("round_robin",)},
     set(), rules.HEALTHY, None),
    ("affinity routing with full KV loses its prefixes to eviction",
     {"cache": {"captured": 0.20, "available": 0.70}, "occupancy": {"token_usage_mean": 0.92}},
     {"cache_routing"}, rules.TUNE, "cache_eviction"),
    ("a page size that does not divide the hash block is named",
     {"cache": {"captured": 0.20, "available": 0.70}, "page_sizes": (64,)},
     {"cache_routing"}, rules.TUNE, "page_size_mismatch"),
    ("affinity routing that still misses points at its balance threshold",
     {"cache": {"captured": 0.20, "available": 0.70}},
     {"cache_routing"}, rules.TUNE, "routing"),
    ("affinity routing to workers whose DP ranks it does not name loses prefixes between the ranks",
     {"cache": {"captured": 0.20, "available": 0.70}, "dp_workers": 2},
     {"cache_routing"}, rules.TUNE, "dp_ranks"),
    ("with the ranks named, a miss is the routing's own again",
     {"cache": {"captured": 0.20, "available": 0.70}, "dp_workers": 2, "dp_ranks": True},
     {"cache_routing"}, rules.TUNE, "routing"),
    ("a working set larger than the fleet KV is a capacity problem",
     {"cache": {"captured": 0.38, "available": 0.40, "reuse_ceiling": 0.80}},
     {"cache_capacity"}, rules.TUNE, "cache_capacity"),
    ("capacity is not judged when the fleet KV size is unknown",
     {"cache": {"captured": 0.38, "available": 0.40, "reuse_ceiling": 0.80, "capacity_tokens": None}},
     set(), rules.HEALTHY, None),
    ("queueing with a full batch and empty KV means max_running_requests is too low",
     {"occupancy": {"queued_mean": 3.0, "token_usage_mean": 0.2, "occupancy_mean": 1.0}},
     {"admission"}, rules.TUNE, "max_running_requests"),
    ("queueing that costs latency with free slots and empty KV means admission is too conservative",
     {"occupancy": {"queued_mean": 3.0, "token_usage_mean": 0.3, "occupancy_mean": 0.5},
      "latency": {"worker_queue": dist(0.3, 0.8)}},
     {"admission"}, rules.TUNE, "schedule_conservativeness"),
    # The GPU fleet past its knee (run 22): the engine queue 0.6 s of a 4.1 s TTFT p95; pulling the
    # lever (twice the prefill budget) did not help.
    ("a queue that is a small part of the TTFT tail is not an admission problem",
     {"occupancy": {"queued_mean": 1.04, "token_usage_mean": 0.34, "occupancy_mean": 0.15},
      "latency": {"ttft": dist(0.6, 4.1), "worker_queue": dist(0.14, 0.6)}, "unloaded_ttft_p95": 0.5},
     {"load_bound"}, rules.TUNE, "over_capacity"),
    ("a prompt or two in line per worker with free slots, free KV and the SLO met is no finding",
     {"occupancy": {"queued_mean": 3.0, "token_usage_mean": 0.3, "occupancy_mean": 0.5}},
     set(), rules.HEALTHY, None),
    ("a long worker queue time alone also counts as queueing",
     {"occupancy": {"token_usage_mean": 0.3, "occupancy_mean": 1.0}, "latency": {"worker_queue": dist(0.2, 1.0)}},
     {"admission"}, rules.TUNE, "max_running_requests"),
    ("a momentary engine queue (under one request per worker) is not queueing",
     {"occupancy": {"queued_mean": 0.6, "queueing_share": 0.5, "token_usage_mean": 0.3, "occupancy_mean": 0.5}},
     set(), rules.HEALTHY, None),
    ("queueing with full KV is not an admission problem",
     {"occupancy": {"queued_mean": 3.0, "token_usage_mean": 0.9, "occupancy_mean": 0.7}},
     set(), rules.HEALTHY, None),
    ("a GPU idle while work runs is a scheduling stall",
     {"gpu": gpu(0.5), "occupancy": {"occupancy_mean": 0.6}},
     {"idle_gaps"}, rules.TUNE, "scheduling_stall"),
    ("a GPU idle with no demand is just low load",
     {"gpu": gpu(0.5), "occupancy": {"occupancy_mean": 0.05}},
     set(), rules.HEALTHY, None),
    ("a TTFT tail made of queueing with flat decode is queue admission",
     {"latency": {"ttft": dist(0.3, 3.0), "worker_queue": dist(0.05, 2.0), "itl": dist(0.02, 0.024)},
      "occupancy": {"token_usage_mean": 0.9}},
     {"prefill_tail"}, rules.TUNE, "queue_admission_tail"),
    ("a TTFT tail with jittery decode on a saturated fleet is the ceiling, not admission",
     {"latency": {"ttft": dist(0.3, 3.0), "worker_queue": dist(0.05, 2.0), "itl": dist(0.02, 0.05)},
      "occupancy": {"token_usage_mean": 0.9}},
     {"ceiling"}, rules.AT_CEILING, "saturated"),
    ("a TTFT tail inside the SLO is no finding",
     {"latency": {"ttft": dist(0.1, 1.0), "worker_queue": dist(0.01, 0.4), "itl": dist(0.02, 0.024)}},
     set(), rules.HEALTHY, None),
    ("jittery decode on a busy GPU is a profiling question",
     {"latency": {"itl": dist(0.02, 0.06)}, "gpu": gpu(0.05)},
     {"decode_jitter"}, rules.TUNE, "kernel_or_bandwidth"),
    ("decode steps stuck behind big prefills are a chunked-prefill question, not a kernel one",
     {"latency": {"itl": dist(0.02, 0.30), "itl_floor": 0.015, "itl_max": dist(0.35, 0.5),
                  "uncached_tokens_p95": 4096.0}, "gpu": gpu(0.05)},
     {"prefill_stall"}, rules.TUNE, "prefill_interference"),
    ("the same decode tail with small prefills is not blamed on prefill",
     {"latency": {"itl": dist(0.02, 0.30), "itl_floor": 0.015, "itl_max": dist(0.35, 0.5),
                  "uncached_tokens_p95": 200.0}, "gpu": gpu(0.05)},
     {"decode_jitter"}, rules.TUNE, "kernel_or_bandwidth"),
    ("a few milliseconds of spread is no prefill stall, however big the prompts",
     {"latency": {"itl": dist(0.006, 0.012), "itl_floor": 0.004, "itl_max": dist(0.03, 0.04),
                  "uncached_tokens_p95": 8192.0}},
     set(), rules.HEALTHY, None),
    ("jittery decode with unknown GPU idle is not claimed",
     {"latency": {"itl": dist(0.02, 0.06)}},
     set(), rules.HEALTHY, None),
    ("a slow proxy is flagged against itself",
     {"latency": {"proxy_overhead_share": 0.2}},
     {"proxy_overhead"}, rules.TUNE, "proxy_overhead"),
    ("saturated, caching well, SLO missed: at the ceiling",
     {"latency": {"ttft": dist(2.0, 3.0)}, "occupancy": {"occupancy_mean": 0.95, "token_usage_mean": 0.9},
      "gpu": gpu(0.05)},
     {"ceiling"}, rules.AT_CEILING, "saturated"),
    ("unsaturated and unqueued but over SLO, the prompts slow on idle engines too: the latency floor",
     {"latency": {"ttft": dist(2.5, 3.0), "ttft_big_p10": 2.4}, "unloaded_ttft_p95": 2.8},
     {"latency_floor"}, rules.AT_CEILING, "latency_floor"),
    ("a floor the fit sees but the fastest big prompts do not is not claimed",
     {"latency": {"ttft": dist(2.5, 3.0), "ttft_big_p10": 0.4}, "unloaded_ttft_p95": 2.8},
     set(), rules.INSUFFICIENT, None),
    # The GPU fleet past its knee (run 22, ids, full reports, 6/s): an engine queue of one request,
    # KV 33%, the batch 15% of its cap; read as a floor before the unloaded estimate.
    ("a TTFT tail the prompts do not explain on idle engines is load, not a floor",
     {"latency": {"ttft": dist(0.6, 4.1)}, "unloaded_ttft_p95": 0.5},
     {"load_bound"}, rules.TUNE, "over_capacity"),
    ("a tail of twice less than the load ratio is not called load",
     {"latency": {"ttft": dist(2.5, 3.0)}, "unloaded_ttft_p95": 1.8},
     set(), rules.INSUFFICIENT, None),
    ("without the unloaded estimate or the big prompts' TTFT, neither load nor a floor is claimed",
     {"latency": {"ttft": dist(2.5, 3.0)}},
     set(), rules.INSUFFICIENT, None),
    # The H100 fleet at its knee (run 78, text, minimal reports): the window's fit put all of TTFT on
    # the load (no idle estimate), p95 8.9 s where the fastest big prompts took 0.37 s.
    ("without the unloaded estimate, a tail far over the fastest big prompts' TTFT is load",
     {"latency": {"ttft": dist(2.8, 8.9), "ttft_big_p10": 0.37}},
     {"load_bound"}, rules.TUNE, "over_capacity"),
    ("...but not one within twice the fastest big prompts' TTFT",
     {"latency": {"ttft": dist(2.5, 3.0), "ttft_big_p10": 1.8}},
     set(), rules.INSUFFICIENT, None),
    ("load is not blamed when a cause with its own lever fired",
     {"latency": {"ttft": dist(0.6, 4.1)}, "unloaded_ttft_p95": 0.5,
      "cache": {"captured": 0.20, "available": 0.70}, "policies": ("round_robin",)},
     {"cache_routing"}, rules.TUNE, "routing"),
    ("workers of one pool with different page sizes are named",
     {"page_sizes": (16, 64)},
     {"mixed_page_sizes"}, rules.TUNE, "page_size_mismatch"),
    ("too few requests: insufficient data, whatever else",
     {"window": {"ok": 10, "requests": 10}, "cache": {"captured": 0.1, "available": 0.8},
      "policies": ("round_robin",)},
     set(), rules.INSUFFICIENT, None),
]


@pytest.mark.parametrize(("name", "changes", "fired", "kind", "cause"), CASES, ids=[c[0] for c in CASES])
def test_rules_fire_on_their_evidence_and_not_otherwise(name, changes, fired, kind, cause) -> None:
    s = with_(healthy_signals(), **changes)
    v = rules.verdict(s, P)
    assert {f.rule for f in v.findings} == fired
    assert v.kind == kind
    if cause is not None:
        assert v.findings[0].cause == cause
    for f in v.findings:
        assert 0.0 < f.confidence <= 1.0
        assert f.levers, "a finding names what to change"
        assert any(e.holds for e in f.evidence), "a finding carries the evidence that made it fire"


def test_each_tune_rule_alone_is_silent_on_a_healthy_fleet() -> None:
    s = healthy_signals()
    assert [r.__name__ for r in rules.TUNE_RULES if r(s, P) is not None] == []


def test_round_robin_verdict_names_the_routing_policy_setting() -> None:
    s = with_(healthy_signals(), cache={"captured": 0.2, "available": 0.7}, policies=("round_robin",))
    v = rules.verdict(s, P)
    assert v.levers[0].setting == "routing.policy"
    assert v.levers[0].where == "radixgate"


def test_dp_workers_name_the_dp_ranks_setting_and_a_blind_policy_gets_it_beside_the_switch() -> None:
    s = with_(healthy_signals(), cache={"captured": 0.2, "available": 0.7}, dp_workers=3)
    f = rules.verdict(s, P).findings[0]
    assert [lv.setting for lv in f.levers] == ["routing.dp_ranks"] and "3 of" in f.summary
    blind = rules.verdict(dataclasses.replace(s, policies=("round_robin",)), P).findings[0]
    assert [lv.setting for lv in blind.levers] == ["routing.policy", "routing.dp_ranks"]
    assert blind.cause == "routing"


def test_max_running_requests_verdict_names_the_sglang_flag() -> None:
    s = with_(healthy_signals(), occupancy={"queued_mean": 3.0, "token_usage_mean": 0.1, "occupancy_mean": 1.0})
    v = rules.verdict(s, P)
    assert [lv.setting for lv in v.levers] == ["--max-running-requests"]


def test_page_size_mismatch_names_both_sizes_in_the_lever() -> None:
    s = with_(healthy_signals(), cache={"captured": 0.2, "available": 0.7}, page_sizes=(64,))
    lever = next(lv for lv in rules.verdict(s, P).levers if lv.setting.startswith("--page-size"))
    assert "16" in lever.change and "64" in lever.change


def test_tune_findings_suppress_the_ceiling() -> None:
    s = with_(healthy_signals(), latency={"ttft": dist(2.0, 3.0)},
              occupancy={"occupancy_mean": 0.95, "token_usage_mean": 0.9},
              cache={"captured": 0.2, "available": 0.7}, policies=("round_robin",))
    v = rules.verdict(s, P)
    assert v.kind == rules.TUNE
    assert "ceiling" not in {f.rule for f in v.findings}


def test_ceiling_confidence_drops_when_gpu_idle_is_unknown() -> None:
    base = with_(healthy_signals(), latency={"ttft": dist(2.0, 3.0)},
                 occupancy={"occupancy_mean": 0.95, "token_usage_mean": 0.9})
    known = rules.verdict(with_(base, gpu=gpu(0.05)), P)
    unknown = rules.verdict(base, P)
    assert known.kind == unknown.kind == rules.AT_CEILING
    assert unknown.confidence < known.confidence


def test_slo_is_a_parameter() -> None:
    s = with_(healthy_signals(), latency={"ttft": dist(2.5, 3.0), "ttft_big_p10": 2.4}, unloaded_ttft_p95=2.8)
    assert rules.verdict(s, P).kind == rules.AT_CEILING
    assert rules.verdict(s, RuleParams(slo_ttft_p95_s=5.0)).kind == rules.HEALTHY


def test_slo_missed_with_no_visible_cause_is_not_called_a_ceiling() -> None:
    # Evidence first: nothing explains the miss, so nothing says "buy hardware" either.
    s = with_(healthy_signals(), latency={"ttft": dist(1.5, 3.0)},
              occupancy={"queued_mean": 2.0, "token_usage_mean": 0.7, "occupancy_mean": 0.7})
    v = rules.verdict(s, P)
    assert (v.kind, v.findings, v.confidence_label) == (rules.INSUFFICIENT, (), "low")


def test_thresholds_override_by_name_and_unknown_names_are_refused() -> None:
    p = RuleParams.from_mapping({"saturation": 0.9, "min_requests": 10})
    assert (p.saturation, p.min_requests) == (0.9, 10)
    assert isinstance(p.min_requests, int)
    with pytest.raises(ValueError, match="bogus"):
        RuleParams.from_mapping({"bogus": 1.0})


def test_confidence_rises_with_the_margin_past_the_threshold() -> None:
    near = with_(healthy_signals(), cache={"captured": 0.5, "available": 0.7}, policies=("round_robin",))
    far = with_(healthy_signals(), cache={"captured": 0.1, "available": 0.7}, policies=("round_robin",))
    assert rules.verdict(far, P).confidence > rules.verdict(near, P).confidence


def test_waiting_in_our_own_admission_queue_counts_as_queueing() -> None:
    s = with_(healthy_signals(), occupancy={"token_usage_mean": 0.1, "occupancy_mean": 1.0},
              latency={"admission_wait": dist(0.3, 1.5)})
    v = rules.verdict(s, P)
    assert v.findings[0].rule == "admission"
    assert any(e.signal == "latency.admission_wait.p95_s" and e.holds for e in v.findings[0].evidence)


# What a deployment without --enable-metrics / --enable-cache-report gives the diagnosis.
NO_METRICS = {"occupancy": {"occupancy_mean": None, "token_usage_mean": None, "queued_mean": None},
              "latency": {"ttft": dist(0.2, 7.0), "worker_queue": dist(None, None, 0)}}


def test_a_slow_fleet_that_reports_no_queue_is_not_a_latency_floor() -> None:
    # The GPU fleet's misreading: unreported queueing read as "prefill on this GPU is the floor".
    v = rules.verdict(with_(healthy_signals(), **NO_METRICS), P)
    assert v.kind == rules.INSUFFICIENT
    assert [f.rule for f in v.findings] == ["missing_signals"]
    assert "--enable-metrics" in {lv.setting for lv in v.levers}
    assert "queue and batch state" in v.summary


def test_scraped_queue_state_without_per_request_queue_times_is_not_missing_metrics() -> None:
    # OpenAI chat through engines whose /v1/loads is scraped: no meta_info queue_time, yet the
    # queue is known; --enable-metrics would change nothing.
    s = with_(healthy_signals(), latency={"worker_queue": dist(None, None, 0)})
    v = rules.verdict(s, P)
    assert "missing_signals" not in {f.rule for f in v.findings}
    assert "--enable-metrics" not in {lv.setting for lv in v.levers}
    # ...and still no latency floor claimed on it (that needs both).
    slow = with_(s, latency={"ttft": dist(0.2, 7.0), "worker_queue": dist(None, None, 0)})
    assert "latency_floor" not in {f.rule for f in rules.verdict(slow, P).findings}


def test_the_ceiling_needs_the_cache_figure() -> None:
    saturated = {"latency": {"ttft": dist(2.0, 3.0)}, "occupancy": {"occupancy_mean": 0.95, "token_usage_mean": 0.9},
                 "gpu": gpu(0.05)}
    assert rules.verdict(with_(healthy_signals(), **saturated), P).kind == rules.AT_CEILING
    blind = with_(healthy_signals(), **saturated, cache={"captured": None, "available": None, "reporting_requests": 0})
    v = rules.verdict(blind, P)
    assert v.kind == rules.INSUFFICIENT and "--enable-cache-report" in {lv.setting for lv in v.levers}


def test_healthy_without_cache_reports_says_what_it_could_not_see() -> None:
    blind = with_(healthy_signals(), cache={"captured": None, "available": None, "reporting_requests": 0})
    v = rules.verdict(blind, P)
    assert v.kind == rules.HEALTHY and v.summary.startswith("healthy as far as the signals show")
    assert [f.rule for f in v.findings] == ["missing_signals"]


def test_estimated_reuse_still_names_routing_and_says_it_is_estimated() -> None:
    s = with_(healthy_signals(), cache={"captured": 0.05, "available": 0.70, "estimated": True},
              policies=("round_robin",))
    v = rules.verdict(s, P)
    assert v.kind == rules.TUNE and v.findings[0].cause == "routing"
    assert "estimated by the proxy" in v.findings[0].summary
    assert v.findings[-1].rule == "missing_signals"


def test_a_hot_prefix_on_too_few_workers_is_named() -> None:
    from proxy.diagnose.signals import HotPrefix

    hot = {"hot_prefix": HotPrefix(share=0.8, workers=1, requests=160, ttft_p95=3.0), "workers": 4}
    v = rules.verdict(with_(healthy_signals(), **hot), P)
    assert v.kind == rules.TUNE and v.findings[0].rule == "hot_prefix"
    assert "80% of requests" in v.findings[0].summary
    # Spread over enough workers, or fast enough: no finding.
    spread = {"hot_prefix": HotPrefix(share=0.8, workers=4, requests=160, ttft_p95=3.0), "workers": 4}
    fast = {"hot_prefix": HotPrefix(share=0.8, workers=1, requests=160, ttft_p95=0.3), "workers": 4}
    # On 3 of 4 workers each carries 1.07 workers' share: a slow TTFT there is the fleet's capacity.
    nearly = {"hot_prefix": HotPrefix(share=0.8, workers=3, requests=160, ttft_p95=3.0), "workers": 4}
    for case in (spread, fast, nearly):
        assert "hot_prefix" not in {f.rule for f in rules.verdict(with_(healthy_signals(), **case), P).findings}


def test_the_hot_prefix_lever_is_the_spill_setting_of_the_policy_in_use() -> None:
    from proxy.diagnose.signals import HotPrefix

    def finding(policy: str, workers: int = 1) -> rules.Finding:
        hot = HotPrefix(share=0.8, workers=workers, requests=160, ttft_p95=2.5)
        v = rules.verdict(with_(healthy_signals(), hot_prefix=hot, workers=8, policies=(policy,)), P)
        return next(f for f in v.findings if f.rule == "hot_prefix")

    # cache_aware takes no work_weight: its spill is the balance threshold, or the ttft policy.
    aware = [lv.setting for lv in finding("cache_aware").levers]
    assert aware[0].startswith("routing.params.balance_abs_threshold") and "routing.policy" in aware
    assert not any("work_weight" in lv for lv in aware)
    ttft = [lv.setting for lv in finding("ttft").levers]
    assert ttft[0] == "routing.params (work_weight, tie_rel)" and "routing.policy" not in ttft
    # The further its spread falls short of what its share needs, the surer the finding.
    assert finding("cache_aware", workers=1).confidence > finding("cache_aware", workers=4).confidence


def test_a_queue_on_one_worker_while_the_others_have_none_is_less_surely_admission() -> None:
    from proxy.diagnose.signals import WorkerOccupancy

    def worker(i: int, queued: float) -> WorkerOccupancy:
        return WorkerOccupancy(f"http://w{i}", 100, 0.4, 0.5, 0.05, 0.1, 8.0, queued, 256, 200_000, 1)

    def admission(queued: tuple[float, ...]) -> rules.Finding:
        occ = {"queued_mean": sum(queued) / len(queued), "token_usage_mean": 0.05, "occupancy_mean": 0.4,
               "workers": tuple(worker(i, q) for i, q in enumerate(queued))}
        v = rules.verdict(with_(healthy_signals(), occupancy=occ, latency={"worker_queue": dist(0.3, 0.8)}), P)
        return next(f for f in v.findings if f.rule == "admission")

    even, pinned = admission((3.0, 3.0, 3.0, 3.0)), admission((12.0, 0.0, 0.0, 0.0))
    assert pinned.confidence == pytest.approx(even.confidence / 2)
    assert admission((4.0, 2.0, 3.0, 3.0)).confidence > 0.8 * even.confidence


def test_the_hot_prefix_signal_groups_requests_by_their_first_blocks() -> None:
    from proxy.diagnose.signals import hot_prefix
    from tests.unit.diagnose_builders import chain, record

    recs = [record(blocks=chain(1, 8), worker="http://w0", received=float(i)) for i in range(6)]
    recs += [record(blocks=chain(2, 8), worker=f"http://w{i % 2}", received=float(i)) for i in range(2)]
    hot = hot_prefix(recs)
    assert hot is not None and (hot.share, hot.workers, hot.requests) == (0.75, 1, 6)


def test_a_replayed_switch_predicted_to_cut_the_tail_comes_before_buying_capacity() -> None:
    # Round robin past capacity: the queue grows (overload) and routing misses half the reuse. A
    # shadow replay that predicts ttft's p95 at a third of this window's ranks the switch first;
    # one that predicts no gain leaves it where the capture gap alone puts it.
    from proxy.diagnose.shadow import ShadowResult

    base = with_(healthy_signals(), cache={"captured": 0.33, "available": 0.70}, policies=("round_robin",),
                 latency={"ttft": dist(3.0, 14.0), "ttft_early_p50": 2.0, "ttft_mid_p50": 4.8,
                                                  "ttft_late_p50": 7.7})

    def replayed(predicted: float) -> Signals:
        return with_(base, shadow=(ShadowResult("ttft", 0.70, 1.07, 150, predicted, 9.0),
                                   ShadowResult("round_robin", 0.33, 1.0, 150, 9.0, 9.0)))

    flat = {f.rule: f.confidence for f in rules.verdict(replayed(9.0), P).findings}
    v = rules.verdict(replayed(3.0), P)
    gain = {f.rule: f.confidence for f in v.findings}
    assert {"overload", "cache_routing"} <= set(gain)
    assert gain["cache_routing"] > flat["cache_routing"] and gain["overload"] == flat["overload"]
    assert v.findings[0].rule == "cache_routing"


def test_a_replayed_better_policy_puts_routing_first_ahead_of_a_level_stall_finding() -> None:
    # The GPU fleet behind round robin: decode stalls behind prefills and round robin's reuse at
    # half of what is available score about the same; the shadow replay of the same traffic
    # through ttft capturing twice as much is what tells them apart.
    from proxy.diagnose.shadow import ShadowResult

    stalled = {"itl": dist(0.2, 2.0), "itl_floor": 0.22, "itl_max": dist(1.8, 3.0), "uncached_tokens_p95": 3700.0}
    base = with_(healthy_signals(), cache={"captured": 0.33, "available": 0.67}, policies=("round_robin",),
                 latency=stalled, gpu=gpu(0.05))
    replayed = with_(base, shadow=(ShadowResult("ttft", 0.65, 1.1, 400), ShadowResult("round_robin", 0.33, 1.0, 400)))
    plain = {f.rule: f.confidence for f in rules.verdict(base, P).findings}
    v = rules.verdict(replayed, P)
    shadowed = {f.rule: f.confidence for f in v.findings}
    assert {"cache_routing", "prefill_stall"} <= set(plain)
    assert shadowed["cache_routing"] > plain["cache_routing"]
    assert shadowed["prefill_stall"] == plain["prefill_stall"]
    assert v.findings[0].rule == "cache_routing"
    assert v.levers[0].setting == "routing.policy" and v.levers[0].change.startswith("ttft")


def test_a_queue_that_grows_through_the_window_is_overload_with_the_capacity_levers() -> None:
    # The GPU fleet past its knee: median TTFT 0.4 s in the first third of a phase, 6 s in the last.
    grows = with_(healthy_signals(), latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": 0.4,
                                                         "ttft_mid_p50": 3.1, "ttft_late_p50": 6.0})
    v = rules.verdict(grows, P)
    assert v.kind == rules.TUNE and v.findings[0].rule == "overload" and v.findings[0].cause == "over_capacity"
    assert {"replicas", "admission.queue_size / admission.queue_timeout_s"} <= {lv.setting for lv in v.levers}
    # A slow fleet whose TTFT does not grow (a steady tail), or a growing one within the SLO: no.
    steady = with_(grows, latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": 2.0, "ttft_late_p50": 2.4})
    assert "overload" not in {f.rule for f in rules.verdict(steady, P).findings}
    within = with_(grows, latency={"ttft": dist(0.3, 1.5), "ttft_early_p50": 0.1, "ttft_late_p50": 0.9})
    assert "overload" not in {f.rule for f in rules.verdict(within, P).findings}
    # A closed loop's first burst: the middle third already as slow as the last, so the queue
    # stopped growing: not overload...
    plateau = with_(grows, latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": 0.4, "ttft_mid_p50": 5.8,
                                    "ttft_late_p50": 6.0})
    assert "overload" not in {f.rule for f in rules.verdict(plateau, P).findings}
    # ...unless the late TTFTs are bounds (clients left at their patience, however long the queue).
    censored = with_(plateau, latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": 0.4, "ttft_mid_p50": 5.8,
                                       "ttft_late_p50": 6.0, "ttft_waited_out": 40})
    assert rules.verdict(censored, P).findings[0].rule == "overload"
    still = with_(plateau, latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": 0.4, "ttft_mid_p50": 3.0,
                                    "ttft_late_p50": 6.0})
    assert rules.verdict(still, P).findings[0].rule == "overload"
    # Fewer than 30 requests give no thirds: silent, never assumed.
    unknown = with_(grows, latency={"ttft": dist(2.0, 8.0), "ttft_early_p50": None, "ttft_late_p50": None})
    assert "overload" not in {f.rule for f in rules.verdict(unknown, P).findings}


def test_the_thirds_are_taken_by_arrival_time() -> None:
    from proxy.diagnose.signals import latency_signal
    from proxy.diagnose.window import RequestRecord
    from proxy.timing import RequestTiming

    def record(received: float, ttft: float) -> RequestRecord:
        return RequestRecord(timing=RequestTiming(received=received, first_token=received + ttft), worker="w")

    # arrivals out of order in the list; TTFT rising with arrival time: 0.1 s early, 5 s late
    records = [record(float(i), 0.1 + 0.1 * i if i < 20 else 5.0) for i in reversed(range(45))]
    lat = latency_signal(records)
    assert lat.ttft_early_p50 is not None and lat.ttft_late_p50 is not None
    assert lat.ttft_early_p50 < 1.0 and lat.ttft_late_p50 == 5.0
    assert lat.ttft_mid_p50 == 5.0  # 15-29: five rising, ten at 5 s
    assert latency_signal(records[:29]).ttft_late_p50 is None


def test_requests_given_up_waiting_count_as_at_least_their_wait_and_towards_the_data_floor() -> None:
    from proxy.diagnose.signals import compute_signals
    from proxy.diagnose.window import RequestRecord
    from proxy.timing import RequestTiming

    def answered(received: float, ttft: float) -> RequestRecord:
        return RequestRecord(timing=RequestTiming(received=received, first_token=received + ttft,
                                                  done=received + ttft + 1.0), worker="w")

    def gave_up(received: float, waited: float, outcome: str = "cancelled", cause: str | None = None) -> RequestRecord:
        return RequestRecord(timing=RequestTiming(received=received, done=received + waited), worker="w",
                             outcome=outcome, cause=cause)

    # Past capacity (the GPU fleet's round robin at 6/s): 40 answered early and fast, then 90 whose
    # clients left after 20-30 s without a token, and 5 refused at once (a bad request proves nothing).
    records = ([answered(0.1 * i, 0.5) for i in range(40)]
               + [gave_up(4.0 + 0.2 * i, 20.0 + i / 9, cause="client_disconnect") for i in range(80)]
               + [gave_up(20.0 + i, 30.0, outcome="error", cause="upstream_timeout") for i in range(10)]
               + [gave_up(25.0 + i, 0.01, outcome="error", cause="bad_request") for i in range(5)])
    s = compute_signals(records, [])
    assert s.window.ok == 40 and s.window.cut_short == 90
    assert s.latency.ttft_waited_out == 90 and s.latency.ttft.n == 130
    assert s.latency.ttft.p95 is not None and s.latency.ttft.p95 >= 20.0  # not the answered ones' 0.5 s
    v = rules.verdict(s, P)
    assert v.kind != "insufficient_data", v.summary  # 40 answered + 90 given up is evidence
    assert "overload" in {f.rule for f in v.findings}
    # Answered requests alone under the floor, and nobody waited: still too little to say anything.
    few = compute_signals([answered(0.1 * i, 0.5) for i in range(40)], [])
    assert rules.verdict(few, P).kind == "insufficient_data"
    # A client that left mid-answer got its first token: that TTFT counts as it was.
    left = RequestRecord(timing=RequestTiming(received=0.0, first_token=15.0, done=21.0), worker="w",
                         outcome="cancelled", cause="client_disconnect")
    assert left.ttft_evidence == 15.0 and left.waited_out is None
    assert compute_signals([left], []).latency.ttft.p50 == 15.0


def test_kv_event_streams_routing_cannot_use_are_named_with_the_tokenizer_and_publisher_levers() -> None:
    doubted = dataclasses.replace(healthy_signals(), kv_doubted=("http://w1",), workers=4)
    v = rules.verdict(doubted, P)
    blind = [f for f in v.findings if f.rule == "missing_signals"]
    assert blind and "1 of 4 workers" in blind[0].summary
    assert {lv.setting for lv in blind[0].levers} >= {"routing.tokenizer", "--kv-events-config"}
    assert v.kind == "healthy" and "as far as the signals show" in v.summary
    # streams routing reads (or none configured) add nothing
    assert not [f for f in rules.verdict(healthy_signals(), P).findings if f.rule == "missing_signals"]


def test_a_replica_says_its_window_holds_only_its_share_of_the_fleets_requests() -> None:
    base = healthy_signals()
    shared = dataclasses.replace(base, peer_requests=3 * base.window.requests)
    v = rules.verdict(shared, P)
    blind = [f for f in v.findings if f.rule == "missing_signals"]
    assert blind and f"routed {base.window.requests} of the ~{4 * base.window.requests} requests" in blind[0].summary
    assert any(e.note == "25% of the fleet's were this replica's" for e in blind[0].evidence)
    assert "diagnose.fleet_view" in {lv.setting for lv in blind[0].levers}
    assert v.kind == "healthy" and "as far as the signals show" in v.summary
