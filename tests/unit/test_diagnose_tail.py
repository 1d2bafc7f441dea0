"""The slowest requests and where each one's time went (proxy/diagnose/tail.py, pure)."""

from __future__ import annotations

import pytest

from proxy.diagnose.report import render_tail
from proxy.diagnose.tail import parts, slowest
from proxy.diagnose.window import RequestRecord
from proxy.timing import RequestTiming


def record(rid: str, *, admitted: float = 0.0, dispatched: float = 0.01, first: float | None = 0.5,
           last: float | None = 1.0, done: float = 1.0, queue: float | None = None, outcome: str = "ok",
           cause: str | None = None) -> RequestRecord:
    t = RequestTiming(received=0.0, admitted=admitted, dispatched=dispatched, first_token=first, last_token=last,
                      done=done, worker_queue_time=queue)
    return RequestRecord(timing=t, worker="http://w", outcome=outcome, cause=cause, rid=rid, trace_id="t-" + rid)


def test_a_request_is_cut_at_its_marks_and_the_engines_queue_taken_out_of_its_prefill() -> None:
    r = record("a", admitted=0.2, dispatched=0.25, first=1.25, last=3.0, done=3.0, queue=0.7)
    cut = parts(r, e2e=True)
    assert cut == pytest.approx({"admission": 0.2, "routing": 0.05, "worker_queue": 0.7, "prefill": 0.3,
                                 "decode": 1.75})
    assert sum(parts(r, e2e=False).values()) == pytest.approx(r.timing.ttft)
    # A queue time over the whole upstream wait (clocks apart) is capped at it, never a negative prefill.
    assert parts(record("b", queue=9.0), e2e=False)["prefill"] == 0.0


def test_the_slowest_come_first_with_what_dominated_each() -> None:
    records = [
        record("queued", admitted=2.0, dispatched=2.01, first=2.2, last=2.4, done=2.4),  # the proxy's queue
        record("engine", first=1.5, last=4.5, done=4.5, queue=1.2),  # the engine's queue, then a long answer
        record("fast", first=0.1),
        record("left", first=None, last=None, done=3.0, outcome="cancelled"),  # waited 3 s, then left
        record("failed", first=None, last=None, done=0.2, outcome="error", cause="upstream_error"),
    ]
    doc = slowest(records, n=3, by="ttft", now=10.0)
    assert [r["rid"] for r in doc["requests"]] == ["left", "queued", "engine"]
    assert [r["dominant"] for r in doc["requests"]] == ["prefill", "admission", "worker_queue"]
    assert doc["dominant"] == {"prefill": 1, "admission": 1, "worker_queue": 1}
    assert doc["requests"][0]["answered"] is False and doc["requests"][1]["ttft_s"] == 2.2
    assert doc["requests"][1]["trace_id"] == "t-queued" and doc["requests"][1]["age_s"] == 10.0
    assert (doc["requests_in_window"], doc["timed"]) == (5, 4)  # the failed one has no TTFT evidence
    by_e2e = slowest(records, n=10, by="e2e", now=10.0)
    assert [r["rid"] for r in by_e2e["requests"]] == ["engine", "left", "queued", "fast", "failed"]
    assert by_e2e["requests"][0]["dominant"] == "decode" and by_e2e["requests"][0]["e2e_s"] == 4.5
    with pytest.raises(ValueError, match="by"):
        slowest(records, n=1, by="itl", now=0.0)


def test_the_text_rendering_lists_each_request_with_its_parts_in_ms() -> None:
    doc = slowest([record("queued", admitted=2.0, dispatched=2.01, first=2.2, last=2.4, done=2.4),
                   record("engine", first=1.5, last=4.5, done=4.5, queue=1.2)], n=5, by="ttft", now=5.0)
    lines = render_tail(doc).splitlines()
    assert lines[0] == "The slowest 2 of 2 requests by TTFT (GET /diagnosis/tail)"
    assert lines[2].split()[:3] == ["queued", "2200.0ms", "admission"] and "2000.0" in lines[2]
    assert lines[3].split()[:3] == ["engine", "1500.0ms", "worker_queue"] and "1200.0" in lines[3]
    assert lines[-1].startswith("  dominated by: admission 1, worker_queue 1")
