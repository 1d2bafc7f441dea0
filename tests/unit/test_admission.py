"""Admission: per-worker limits, the bounded priority queue, and the lease's outcomes."""

import asyncio

import pytest

from proxy.admission import Admission, AdmissionCore, Outcome, Ticket, derive_limit
from proxy.clock import ManualClock
from proxy.config import AdmissionConfig
from proxy.errors import Overloaded, ShuttingDown
from proxy.routing.base import WorkerSnapshot


def core(queue_size: int = 8, timeout: float = 10.0, clock: ManualClock | None = None) -> AdmissionCore:
    return AdmissionCore(queue_size=queue_size, queue_timeout_s=timeout, clock=clock or ManualClock())


def admitted(got: Ticket | Outcome) -> Ticket:
    assert isinstance(got, Ticket) and got.admitted_at is not None, got
    return got


def test_requests_are_admitted_while_the_fleet_has_free_slots() -> None:
    c = core()
    c.set_limits({"a": 1, "b": 1})
    t1, t2 = admitted(c.request()), admitted(c.request())
    c.assign(t1, "a")
    c.assign(t2, "b")
    t3 = c.request()
    assert isinstance(t3, Ticket) and t3.admitted_at is None  # queued
    assert c.snapshot().queue_depth == 1


def test_a_reserved_slot_counts_until_the_request_is_routed() -> None:
    c = core()
    c.set_limits({"a": 1})
    admitted(c.request())  # reserved, not yet assigned
    assert c.free_slots() == 0
    queued = c.request()
    assert isinstance(queued, Ticket) and queued.admitted_at is None


def test_release_admits_the_highest_priority_then_the_oldest() -> None:
    clock = ManualClock()
    c = core(clock=clock)
    c.set_limits({"a": 1})
    holder = admitted(c.request())
    c.assign(holder, "a")
    low1 = c.request(priority=0)
    clock.advance(1)
    high = c.request(priority=5)
    clock.advance(1)
    low2 = c.request(priority=0)
    assert all(isinstance(t, Ticket) for t in (low1, high, low2))
    clock.advance(2)
    assert c.release(holder) == [high]
    assert isinstance(high, Ticket) and high.admitted_at == 4.0
    assert high.admitted_at - high.enqueued_at == 3.0  # the wait is measured on the injected clock
    c.assign(high, "a")
    assert c.release(high) == [low1]


def test_a_full_queue_rejects_at_once() -> None:
    c = core(queue_size=1)
    c.set_limits({"a": 1})
    admitted(c.request())
    assert isinstance(c.request(), Ticket)
    assert c.request() is Outcome.QUEUE_FULL


def test_queue_size_zero_never_waits() -> None:
    c = core(queue_size=0)
    c.set_limits({"a": 1})
    admitted(c.request())
    assert c.request() is Outcome.QUEUE_FULL


def test_a_cancelled_waiter_leaves_the_queue_without_taking_a_slot() -> None:
    c = core()
    c.set_limits({"a": 1})
    holder = admitted(c.request())
    c.assign(holder, "a")
    gone, next_ = c.request(), c.request()
    assert isinstance(gone, Ticket) and isinstance(next_, Ticket)
    assert c.release(gone) == []
    assert c.snapshot().queue_depth == 1
    assert c.release(holder) == [next_]


def test_per_worker_room_follows_assignments_and_retries() -> None:
    c = core()
    c.set_limits({"a": 1, "b": 1})
    t = admitted(c.request())
    c.assign(t, "a")
    assert not c.has_room("a") and c.has_room("b")
    c.assign(t, "b")  # a retry moves the slot
    assert c.has_room("a") and not c.has_room("b")
    assert c.outstanding("b") == 1 and c.outstanding("a") == 0


def test_more_capacity_wakes_waiters() -> None:
    c = core()
    c.set_limits({"a": 1})
    admitted(c.request())
    waiting = c.request()
    assert c.set_limits({"a": 1, "b": 1}) == [waiting]


def test_shutdown_rejects_new_requests_and_hands_back_the_queue() -> None:
    c = core()
    c.set_limits({"a": 1})
    admitted(c.request())
    waiting = c.request()
    assert c.begin_shutdown() == [waiting]
    assert c.request() is Outcome.SHUTTING_DOWN
    assert c.snapshot().shutting_down


@pytest.mark.parametrize(
    ("cfg", "worker", "limit"),
    [
        (AdmissionConfig(per_worker_limit=7), WorkerSnapshot("a", max_running_requests=100), 7),
        (AdmissionConfig(), WorkerSnapshot("a", max_running_requests=100), 100),
        (AdmissionConfig(limit_factor=1.25), WorkerSnapshot("a", max_running_requests=10), 13),
        (AdmissionConfig(unknown_worker_limit=32), WorkerSnapshot("a"), 32),
    ],
)
def test_limit_is_configured_or_derived_from_max_running_requests(
        cfg: AdmissionConfig, worker: WorkerSnapshot, limit: int) -> None:
    assert derive_limit(worker, cfg) == limit


# -- the async shell ---------------------------------------------------------------------------

def shell(**cfg: object) -> Admission:
    adm = Admission(AdmissionConfig(**cfg), ManualClock())  # type: ignore[arg-type]
    adm.update_workers([WorkerSnapshot("a", max_running_requests=1)])
    return adm


async def test_lease_waits_for_a_slot_and_records_admitted() -> None:
    adm = shell()
    first = adm.lease()
    await first.__aenter__()
    first.assign("a")
    second = adm.lease()
    waiter = asyncio.ensure_future(second.__aenter__())
    await asyncio.sleep(0)
    assert not waiter.done() and adm.core.snapshot().queue_depth == 1
    first.release()
    await waiter
    assert second.outcome is Outcome.ADMITTED
    second.release()
    assert adm.core.snapshot().outstanding == {}


async def test_lease_times_out_into_overloaded_when_the_clock_passes_its_deadline() -> None:
    clock = ManualClock()
    adm = Admission(AdmissionConfig(queue_timeout_s=5.0), clock)
    adm.update_workers([WorkerSnapshot("a", max_running_requests=1)])
    holder = adm.lease()
    await holder.__aenter__()
    late = adm.lease()
    waiter = asyncio.ensure_future(late.__aenter__())
    await asyncio.sleep(0)
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert not waiter.done()  # no real time passes: only the clock ends the wait
    clock.advance(0.2)
    with pytest.raises(Overloaded):
        await waiter
    assert late.outcome is Outcome.TIMED_OUT
    assert adm.core.snapshot().queue_depth == 0


async def test_lease_queue_full_is_overloaded_with_retry_after() -> None:
    adm = shell(queue_size=0)
    async with adm.lease():
        lease = adm.lease()
        with pytest.raises(Overloaded) as info:
            await lease.__aenter__()
        assert info.value.retry_after is not None
        assert lease.outcome is Outcome.QUEUE_FULL


async def test_cancelled_waiter_is_recorded_and_frees_its_place() -> None:
    adm = shell()
    holder = adm.lease()
    await holder.__aenter__()
    lease = adm.lease()
    task = asyncio.ensure_future(lease.__aenter__())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert lease.outcome is Outcome.CANCELLED
    assert adm.core.snapshot().queue_depth == 0


async def test_shutdown_fails_waiters_with_shutting_down() -> None:
    adm = shell()
    holder = adm.lease()
    await holder.__aenter__()
    lease = adm.lease()
    task = asyncio.ensure_future(lease.__aenter__())
    await asyncio.sleep(0)
    adm.begin_shutdown()
    with pytest.raises(ShuttingDown):
        await task
    assert lease.outcome is Outcome.SHUTTING_DOWN


async def test_eligible_lists_only_workers_with_room() -> None:
    adm = Admission(AdmissionConfig(per_worker_limit=1), ManualClock())
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b"), WorkerSnapshot("c", healthy=False)]
    adm.update_workers(workers)
    one = adm.lease()
    await one.__aenter__()
    one.assign("a")
    two = adm.lease()
    await two.__aenter__()
    assert [w.url for w in two.eligible(workers)] == ["b"]
