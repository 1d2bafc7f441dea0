"""Worker health (active thresholds, passive ejection, re-admission) and the worker registry."""

from proxy.clock import ManualClock
from proxy.config import HealthConfig, ScrapeConfig
from proxy.workers.health import Change, HealthTracker
from proxy.workers.registry import WorkerRegistry
from proxy.workers.scrape import EngineState

CFG = HealthConfig(interval_s=1.0, fail_threshold=2, recover_threshold=2, eject_after_failures=3,
                   eject_cooldown_s=5.0)


def test_a_worker_goes_down_after_fail_threshold_probes_in_a_row() -> None:
    h = HealthTracker(CFG)
    assert h.on_probe(False, 0) is None and h.available(0)
    assert h.on_probe(True, 1) is None  # the run is broken
    assert h.on_probe(False, 2) is None
    assert h.on_probe(False, 3) is Change.DOWN and not h.available(3)


def test_a_down_worker_needs_recover_threshold_passing_probes() -> None:
    h = HealthTracker(CFG)
    h.on_probe(False, 0)
    h.on_probe(False, 1)
    assert h.on_probe(True, 2) is None and not h.available(2)
    assert h.on_probe(True, 3) is Change.UP and h.available(3)


def test_repeated_request_failures_eject_and_a_probe_after_the_cooldown_readmits() -> None:
    h = HealthTracker(CFG)
    assert [h.on_request(False, t) for t in (0, 1, 2)] == [None, None, Change.EJECTED]
    assert not h.available(2)
    assert h.on_probe(True, 4) is None and not h.available(4)  # still cooling down
    assert h.on_probe(True, 8) is Change.READMITTED and h.available(8)


def test_a_success_resets_the_failure_run() -> None:
    h = HealthTracker(CFG)
    h.on_request(False, 0)
    h.on_request(False, 1)
    h.on_request(True, 2)
    assert h.on_request(False, 3) is None and h.available(3)


def test_with_probes_off_the_cooldown_alone_readmits() -> None:
    h = HealthTracker(HealthConfig(interval_s=0, eject_after_failures=1, eject_cooldown_s=5.0))
    assert h.on_request(False, 0) is Change.EJECTED
    assert not h.available(4.9)
    assert h.available(5.0)


def registry(clock: ManualClock, *, scrape_interval: float = 0.5) -> WorkerRegistry:
    return WorkerRegistry(health=CFG, scrape=ScrapeConfig(interval_s=scrape_interval, stale_after_s=5.0),
                          clock=clock)


def test_membership_changes_call_join_leave_and_change_listeners() -> None:
    reg = registry(ManualClock())
    joined: list[str] = []
    left: list[str] = []
    changes: list[list[str]] = []
    reg.on_join.append(joined.append)
    reg.on_leave.append(left.append)
    reg.on_change.append(lambda snaps: changes.append([s.url for s in snaps]))
    reg.set_members({"http://a/", "http://b"})
    reg.set_members({"http://b", "http://c"})
    assert joined == ["http://a", "http://b", "http://c"] and left == ["http://a"]
    assert changes[-1] == ["http://b", "http://c"]


def test_snapshots_carry_scraped_state_and_live_in_flight_counts() -> None:
    reg = registry(ManualClock())
    reg.set_members({"http://a"})
    reg.in_flight = lambda url: 3
    reg.report_scrape("http://a", EngineState(running=5, queued=2, max_running_requests=10, page_size=16), ("m",))
    (s,) = reg.snapshots()
    assert (s.in_flight, s.running, s.queued, s.page_size, s.models) == (3, 5, 2, 16, ("m",))
    assert s.occupancy == 0.5 and not s.stale


def test_an_old_scrape_makes_the_worker_stale() -> None:
    clock = ManualClock()
    reg = registry(clock)
    reg.set_members({"http://a"})
    reg.report_scrape("http://a", EngineState(running=0), None)
    clock.advance(6)
    reg.report_scrape("http://a", None, None)  # a failed scrape republishes
    assert reg.snapshots()[0].stale


def test_a_restart_bumps_the_generation_and_notifies() -> None:
    reg = registry(ManualClock())
    reg.set_members({"http://a"})
    bumps: list[tuple[str, str]] = []
    reg.on_generation.append(lambda url, why: bumps.append((url, why)))
    reg.report_scrape("http://a", EngineState(startup_time=1.0), None)
    reg.report_scrape("http://a", EngineState(startup_time=2.0), None)
    assert reg.snapshots()[0].generation == 1 and bumps == [("http://a", "restart")]


def test_a_worker_back_from_down_gets_a_new_generation() -> None:
    reg = registry(ManualClock())
    reg.set_members({"http://a"})
    for ok in (False, False, True, True):
        reg.report_probe("http://a", ok)
    (s,) = reg.snapshots()
    assert s.healthy and s.generation == 1


def test_ejection_makes_the_snapshot_unhealthy() -> None:
    reg = registry(ManualClock())
    reg.set_members({"http://a"})
    results = [reg.report_request("http://a", False) for _ in range(3)]
    assert results[-1] is Change.EJECTED
    assert not reg.snapshots()[0].healthy and reg.ejected("http://a")
