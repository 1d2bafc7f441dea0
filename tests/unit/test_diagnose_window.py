from __future__ import annotations

import pytest

from proxy.clock import ManualClock
from proxy.diagnose.window import DiagnosisWindows, RequestRecord, SlidingWindow
from proxy.routing.base import RouteRequest, WorkerSnapshot
from proxy.timing import RequestTiming


def test_window_keeps_only_the_newest_items_by_count() -> None:
    w: SlidingWindow[int] = SlidingWindow(ManualClock(), max_items=3)
    for i in range(5):
        w.add(i)
    assert w.items() == [2, 3, 4]


def test_window_forgets_items_older_than_its_age_even_without_new_adds() -> None:
    clock = ManualClock()
    w: SlidingWindow[str] = SlidingWindow(clock, max_items=100, max_age_s=10.0)
    w.add("old")
    clock.advance(6.0)
    w.add("new")
    clock.advance(5.0)
    assert w.items() == ["new"]
    clock.advance(6.0)
    assert len(w) == 0


def test_age_zero_means_bounded_by_count_only() -> None:
    clock = ManualClock()
    w: SlidingWindow[int] = SlidingWindow(clock, max_items=2, max_age_s=0.0)
    w.add(1)
    clock.advance(1e6)
    assert w.items() == [1]
    assert w.stamped() == [(0.0, 1)]


@pytest.mark.parametrize(("kwargs", "message"), [({"max_items": 0}, "max_items"),
                                                 ({"max_items": 1, "max_age_s": -1.0}, "max_age_s")])
def test_window_refuses_nonsense_bounds(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        SlidingWindow(ManualClock(), **kwargs)


def test_record_takes_token_counts_from_timing_and_blocks_from_the_route() -> None:
    t = RequestTiming(received=1.0, dispatched=1.5, prompt_tokens=80, cached_tokens=32, completion_tokens=7)
    route = RouteRequest(model="m", block_hashes=(1, 2, 3), block_tokens=16, prompt_tokens=50)
    r = RequestRecord.of(t, worker="http://w", route=route, policy="cache_aware")
    assert (r.prompt_tokens, r.cached_tokens, r.completion_tokens) == (80, 32, 7)
    assert (r.block_hashes, r.block_tokens, r.estimated_prompt_tokens) == ((1, 2, 3), 16, 50)
    assert r.ok and r.order_key == 1.5
    assert RequestRecord.of(RequestTiming(received=2.0), worker="w", outcome="timed_out").order_key == 2.0


@pytest.mark.parametrize(("route", "text_prompt"), [
    (RouteRequest(model="m", block_hashes=(1,), prompt_bytes=640), True),
    (RouteRequest(model="m", block_hashes=(1,)), False),  # token ids: no prompt bytes
    (None, False),
])
def test_a_record_knows_whether_its_blocks_are_text(route: RouteRequest | None, text_prompt: bool) -> None:
    assert RequestRecord.of(RequestTiming(received=0.0), worker="w", route=route).text_prompt is text_prompt


def test_diagnosis_windows_stamp_snapshot_samples_with_the_clock() -> None:
    clock = ManualClock(5.0)
    windows = DiagnosisWindows(clock, max_requests=10, max_age_s=60.0, max_snapshot_samples=2)
    for i in range(3):
        windows.observe([WorkerSnapshot(f"w{i}")])
        clock.advance(1.0)
    samples = windows.snapshots.items()
    assert [s.at for s in samples] == [6.0, 7.0]
    assert samples[-1].workers[0].url == "w2"


def test_snapshot_samples_are_thinned_to_one_per_interval() -> None:
    clock = ManualClock()
    windows = DiagnosisWindows(clock, snapshot_interval_s=0.5)
    for _ in range(10):
        windows.observe([WorkerSnapshot("w")])
        clock.advance(0.2)
    assert [s.at for s in windows.snapshots.items()] == pytest.approx([0.0, 0.6, 1.2, 1.8])
