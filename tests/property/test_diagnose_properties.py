"""Properties of the diagnosis over generated traces and generated signals."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.diagnose import rules
from proxy.diagnose.cache_replay import CacheSignal, cache_signal, replay_matched_blocks
from proxy.diagnose.cost import stage_costs
from proxy.diagnose.signals import (
    Distribution,
    LatencySignal,
    OccupancySignal,
    Signals,
    WindowInfo,
)
from proxy.diagnose.window import RequestRecord
from tests.unit.diagnose_builders import chain, gpu, record


@st.composite
def traces(draw: st.DrawFn) -> list[RequestRecord]:
    """Requests drawn from a few prefix families; each extends its family's shared chain."""
    n = draw(st.integers(1, 40))
    out = []
    for i in range(n):
        family = draw(st.integers(0, 4))
        shared = draw(st.integers(0, 6))
        own = draw(st.integers(0, 3))
        blocks = chain(family, shared) + tuple(10_000_000 + i * 10 + k for k in range(own))
        prompt = draw(st.integers(1, 200))
        cached = draw(st.none() | st.integers(0, 250))
        out.append(record(worker=f"w{draw(st.integers(0, 2))}", received=float(i) * draw(st.floats(0.0, 1.0)),
                          blocks=blocks, prompt=prompt, cached=cached,
                          queue=draw(st.none() | st.floats(0.0, 0.5)), prefill=draw(st.floats(0.0, 1.0)),
                          gaps=tuple(draw(st.lists(st.floats(0.001, 0.2), max_size=4)))))
    return out


@given(traces(), st.none() | st.integers(0, 2_000))
@settings(max_examples=60, deadline=None)
def test_captured_never_exceeds_available_which_never_exceeds_the_ceiling_or_one(trace, capacity) -> None:
    c = cache_signal(trace, capacity)
    if c.captured is None:
        assert c.available is None and c.reporting_requests == 0
        return
    assert c.available is not None and c.reuse_ceiling is not None
    assert 0.0 <= c.captured <= c.available + 1e-12
    assert c.available <= c.reuse_ceiling + 1e-12
    assert c.reuse_ceiling <= 1.0 + 1e-12


@given(traces(), st.integers(0, 1_000), st.integers(0, 1_000))
@settings(max_examples=60, deadline=None)
def test_a_bigger_fleet_cache_never_serves_fewer_blocks(trace, a, b) -> None:
    small, large = sorted((a, b))
    ordered = sorted(trace, key=lambda r: r.order_key)
    hits_small = replay_matched_blocks(ordered, small)
    hits_large = replay_matched_blocks(ordered, large)
    unbounded = replay_matched_blocks(ordered, None)
    for s, lg, u, r in zip(hits_small, hits_large, unbounded, ordered, strict=True):
        assert s <= lg <= u <= len(r.block_hashes)


@given(traces(), st.lists(st.sampled_from(["w0", "w1", "w2", "w3"]), max_size=4),
       st.none() | st.floats(0.0, 1.0), st.integers(1, 8))
@settings(max_examples=50, deadline=None)
def test_every_gpu_second_of_the_window_is_charged_once(trace, workers, idle, gpus) -> None:
    c = stage_costs(trace, workers=workers, price_per_gpu_hour=2.5, gpus_per_worker=gpus, gpu_idle_share=idle)
    assert sum(s.gpu_seconds for s in c.stages) == pytest.approx(c.total_gpu_seconds, rel=1e-9, abs=1e-9)
    assert all(s.gpu_seconds >= -1e-9 for s in c.stages)


ratios = st.none() | st.floats(0.0, 1.0)
seconds = st.none() | st.floats(0.0, 30.0)


@st.composite
def distributions(draw: st.DrawFn) -> Distribution:
    p50 = draw(seconds)
    if p50 is None:
        return Distribution()
    return Distribution(draw(st.integers(1, 5000)), p50, p50 + draw(st.floats(0.0, 30.0)))


@st.composite
def any_signals(draw: st.DrawFn) -> Signals:
    captured, available, ceiling = sorted([draw(st.floats(0.0, 1.0)) for _ in range(3)])
    has_cache = draw(st.booleans())
    ok = draw(st.integers(0, 1000))
    return Signals(
        window=WindowInfo(requests=ok, ok=ok, span_s=draw(st.floats(0.0, 600.0))),
        cache=CacheSignal(captured if has_cache else None, available if has_cache else None,
                          ceiling if has_cache else None, draw(st.none() | st.integers(1, 10**7)),
                          draw(st.integers(0, 1000)), 1000),
        occupancy=OccupancySignal(occupancy_mean=draw(ratios), token_usage_mean=draw(ratios),
                                  queued_mean=draw(st.none() | st.floats(0.0, 100.0)),
                                  queueing_share=draw(ratios), samples=draw(st.integers(0, 500))),
        latency=LatencySignal(ttft=draw(distributions()), worker_queue=draw(distributions()),
                              admission_wait=draw(distributions()), itl=draw(distributions()),
                              proxy_overhead_share=draw(ratios)),
        gpu=gpu(draw(ratios)),
        block_tokens=tuple(draw(st.lists(st.sampled_from([1, 16, 32, 64]), max_size=2, unique=True))),
        page_sizes=tuple(draw(st.lists(st.sampled_from([1, 16, 64]), max_size=2, unique=True))),
        policies=tuple(draw(st.lists(st.sampled_from(["round_robin", "cache_aware", "least_load"]),
                                     max_size=2, unique=True))),
    )


@given(any_signals(), st.floats(0.1, 10.0))
@settings(max_examples=200, deadline=None)
def test_the_verdict_is_a_total_function(s, slo) -> None:
    p = dataclasses.replace(rules.RuleParams(), slo_ttft_p95_s=slo)
    v = rules.verdict(s, p)
    assert v.kind in rules.VERDICT_KINDS
    assert 0.0 <= v.confidence <= 1.0
    # Besides the verdict's own findings, one may say which signals the workers do not report.
    own = [f for f in v.findings if f.rule != "missing_signals"]
    assert all(f.kind == rules.INSUFFICIENT for f in v.findings if f.rule == "missing_signals")
    if v.kind == rules.TUNE:
        assert v.levers and own and all(f.kind == rules.TUNE for f in own)
    if v.kind == rules.INSUFFICIENT:
        # Too few requests, or a missed SLO that no rule explains: never a ceiling claim.
        assert s.window.ok < p.min_requests or (v.slo_met is False and not own)
    if v.kind == rules.HEALTHY:
        assert v.slo_met is not False and not own
    if v.kind == rules.AT_CEILING:
        assert own and all(f.kind == rules.AT_CEILING for f in own)
