from __future__ import annotations

import pytest

from proxy.diagnose.cost import stage_costs
from tests.unit.diagnose_builders import record


def seconds(report, stage: str) -> float:
    s = report.stage(stage)
    assert s is not None
    return s.gpu_seconds


def test_a_lone_request_pays_for_its_prefill_and_decode_and_the_idle_tail_of_the_fleet() -> None:
    # Worker a serves one request for 1.0 s (0.4 prefill + 0.6 decode); worker b idles the whole second.
    r = record(worker="a", prefill=0.4, gaps=(0.3, 0.3))
    c = stage_costs([r], workers=["a", "b"], price_per_gpu_hour=3600.0)
    assert seconds(c, "prefill") == pytest.approx(0.4)
    assert seconds(c, "decode") == pytest.approx(0.6)
    assert seconds(c, "idle") == pytest.approx(1.0)
    assert seconds(c, "queue") == 0.0
    assert c.total_gpu_seconds == pytest.approx(2.0)
    assert c.cost_per_request == pytest.approx(2.0)  # $3600/h = $1/GPU-second
    assert c.driver == "idle"


def test_overlapping_requests_share_the_gpu_equally() -> None:
    a = record(worker="w", received=0.0, prefill=1.0, gaps=())
    b = record(worker="w", received=0.5, prefill=1.0, gaps=())
    c = stage_costs([a, b], price_per_gpu_hour=1.0)
    # 0-0.5 a alone, 0.5-1.0 shared, 1.0-1.5 b alone: each request is charged 0.75 s of prefill.
    per = c.stage("prefill")
    assert per is not None
    assert per.per_request.p50 == pytest.approx(0.75) and per.per_request.p95 == pytest.approx(0.75)
    assert seconds(c, "idle") == pytest.approx(0.0)


def test_queue_admission_is_charged_only_while_nothing_runs() -> None:
    # Queued 0.5 s on an empty worker (GPU held idle with work waiting), then 0.5 s of prefill.
    waiting_alone = record(worker="w", queue=0.5, prefill=0.5, gaps=())
    c = stage_costs([waiting_alone], price_per_gpu_hour=1.0)
    assert seconds(c, "queue") == pytest.approx(0.5)
    # Queued behind a running request: no GPU time for the queue, only latency.
    runner = record(worker="w", received=0.0, prefill=2.0, gaps=())
    behind = record(worker="w", received=0.0, queue=1.0, prefill=1.0, gaps=())
    c2 = stage_costs([runner, behind], price_per_gpu_hour=1.0)
    assert seconds(c2, "queue") == 0.0
    assert seconds(c2, "prefill") == pytest.approx(2.0)


def test_nvml_idle_share_moves_busy_time_into_idle_gaps() -> None:
    r = record(worker="w", prefill=0.5, gaps=(0.5,))
    without = stage_costs([r], price_per_gpu_hour=1.0)
    with_gaps = stage_costs([r], price_per_gpu_hour=1.0, gpu_idle_share=0.25)
    assert not without.busy_gaps_known and with_gaps.busy_gaps_known
    assert seconds(without, "idle") == 0.0
    assert seconds(with_gaps, "idle") == pytest.approx(0.25)
    assert seconds(with_gaps, "prefill") + seconds(with_gaps, "decode") == pytest.approx(0.75)


def test_every_gpu_second_is_charged_to_some_stage() -> None:
    recs = [record(worker=f"w{i % 3}", received=0.3 * i, queue=0.05 * (i % 2), prefill=0.2, gaps=(0.1,) * (i % 4))
            for i in range(20)]
    c = stage_costs(recs, workers=["w0", "w1", "w2", "w3"], price_per_gpu_hour=2.0, gpus_per_worker=2)
    assert sum(s.gpu_seconds for s in c.stages) == pytest.approx(c.total_gpu_seconds)
    assert sum(s.share for s in c.stages) == pytest.approx(1.0)
    assert c.total_cost == pytest.approx(c.total_gpu_seconds * 2.0 / 3600)


def test_requests_never_dispatched_cost_nothing_and_an_empty_window_has_no_driver() -> None:
    r = record()
    r.timing.dispatched = None
    c = stage_costs([r], price_per_gpu_hour=1.0)
    assert c.requests == 0 and c.driver is None and c.cost_per_request is None
