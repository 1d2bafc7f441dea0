"""The injected clock: a manual one fires sleeps, timers and deadlines only when advanced."""

from __future__ import annotations

import asyncio

import pytest

from proxy.clock import ManualClock, MonotonicClock, wait_until


async def test_a_manual_sleep_ends_when_the_clock_reaches_it() -> None:
    clock = ManualClock()
    sleeper = asyncio.ensure_future(clock.sleep(5.0))
    await asyncio.sleep(0)
    clock.advance(4.0)
    await asyncio.sleep(0)
    assert not sleeper.done()
    clock.advance(1.0)
    await sleeper
    assert clock.pending == 0


async def test_a_manual_deadline_raises_timeout_error_only_once_the_clock_passes_it() -> None:
    clock = ManualClock(100.0)

    async def wait_forever() -> None:
        async with clock.timeout_at(103.0):
            await asyncio.get_running_loop().create_future()

    task = asyncio.ensure_future(wait_forever())
    await asyncio.sleep(0)
    clock.advance(2.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    with pytest.raises(TimeoutError):
        await task


async def test_expire_ends_a_deadline_at_once() -> None:
    clock = ManualClock()
    with pytest.raises(TimeoutError):
        async with clock.timeout_at(1e9) as scope:
            scope.expire()
            await asyncio.sleep(3600)
    assert clock.pending == 0  # leaving the scope cancelled its timer


async def test_a_cancelled_timer_never_fires_and_a_past_one_fires_at_the_next_turn() -> None:
    clock = ManualClock(10.0)
    fired: list[str] = []
    clock.call_at(12.0, lambda: fired.append("late")).cancel()
    clock.call_at(5.0, lambda: fired.append("past"))
    await asyncio.sleep(0)
    clock.advance(5.0)
    assert fired == ["past"]


async def test_wait_until_reports_whether_the_event_came_in_time() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    waiting = asyncio.ensure_future(wait_until(clock, event, 1.0))
    await asyncio.sleep(0)
    clock.advance(1.0)
    assert await waiting is False
    event.set()
    assert await wait_until(clock, event, 1.0) is True


async def test_the_monotonic_clock_times_out_in_real_time() -> None:
    clock = MonotonicClock()
    with pytest.raises(TimeoutError):
        async with clock.timeout_at(clock.now() + 0.01):
            await asyncio.sleep(1.0)
