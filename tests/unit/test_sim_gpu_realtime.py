"""Simulated engines in real time on one shared GPU (proxy/sim/gpu_realtime.py): the pools of
gpu_share driven by the clock, so the HTTP simulator shares a GPU as its profile says."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from proxy.clock import ManualClock
from proxy.sim.config import SimConfig
from proxy.sim.engine import Engine
from proxy.sim.gpu_realtime import RealTimeGpu
from proxy.sim.gpu_share import TimeSlicedGpu, WholeSteps, gpu_pool
from proxy.sim.perf import PROFILES
from proxy.sim.scheduler import SimRequest


async def run_until(clock: ManualClock, ready: Callable[[], bool], tick: float) -> None:
    """Advance the clock by ``tick`` (letting the loop run between) until ``ready()``."""
    for _ in range(10_000):
        await asyncio.sleep(0)
        if ready():
            return
        clock.advance(tick)
    raise AssertionError("the steps never ended")


async def run_until_done(clock: ManualClock, tasks: list[asyncio.Future[float]], tick: float = 0.01) -> None:
    await run_until(clock, lambda: all(t.done() for t in tasks), tick)


async def test_time_slices_end_two_equal_steps_together_and_whole_steps_one_after_the_other() -> None:
    ends = {}
    for name, pool in (("slices", TimeSlicedGpu()), ("whole", WholeSteps(0.0))):
        clock = ManualClock(1_000_000.0)  # a monotonic clock's size: float residue must not stall it
        gpu = RealTimeGpu(pool, clock)
        steps = [asyncio.ensure_future(gpu.step(clock.now(), 0.0, 0.5)) for _ in range(2)]
        await run_until_done(clock, steps)
        ends[name] = sorted(s.result() - 1_000_000.0 for s in steps)
    assert ends["slices"] == pytest.approx([1.0, 1.0])
    assert ends["whole"] == pytest.approx([0.5, 1.0])


async def test_a_step_that_joins_later_slows_the_one_on_the_gpu_from_then_on() -> None:
    clock = ManualClock()
    gpu = RealTimeGpu(TimeSlicedGpu(), clock)
    first = asyncio.ensure_future(gpu.step(0.0, 0.0, 1.0))
    await asyncio.sleep(0)
    clock.advance(0.5)  # the first alone for half a second: half its work left
    second = asyncio.ensure_future(gpu.step(clock.now(), 0.0, 1.0))
    await run_until_done(clock, [first, second], tick=0.001)
    assert first.result() == pytest.approx(1.5, abs=2e-3)  # its last half at half speed
    assert second.result() == pytest.approx(2.0, abs=2e-3)  # then alone again


async def test_two_simulated_engines_on_a_sliced_gpu_give_their_first_tokens_together() -> None:
    """The engines' own loop on the shared GPU: one identical request each, at the same instant."""
    firsts = {}
    for profile in ("h200-transformers-7b", "h200-transformers-7b-slices"):
        clock = ManualClock()
        config = SimConfig(profile=profile, max_total_tokens=48_000, page_size=32)
        gpu = RealTimeGpu(gpu_pool(PROFILES[profile], 2), clock)
        engines = [Engine(config, clock, gpu) for _ in range(2)]
        reqs = [SimRequest(rid=f"r{i}", input_ids=list(range(3_000)), max_new_tokens=2) for i in range(2)]
        for engine, req in zip(engines, reqs, strict=True):
            engine.start()
            engine.submit(req)
        try:
            await run_until(clock, lambda reqs=reqs: all(r.first_token_at is not None for r in reqs), 0.005)
        finally:
            for engine in engines:
                await engine.stop()
        firsts[profile] = sorted(r.first_token_at for r in reqs if r.first_token_at is not None)
    a, b = firsts["h200-transformers-7b-slices"]
    assert b - a < 0.011  # together, to the test's tick
    a, b = firsts["h200-transformers-7b"]
    assert b - a > 0.05  # whole steps: one engine's prefill first


async def test_a_step_cancelled_with_its_engine_ends_in_the_pool_and_the_next_one_starts_at_once() -> None:
    clock = ManualClock()
    gpu = RealTimeGpu(TimeSlicedGpu(), clock)
    orphan = asyncio.ensure_future(gpu.step(0.0, 0.0, 1.0))
    await asyncio.sleep(0)
    orphan.cancel()  # the engine stopped (a restart) while its step ran
    fresh = asyncio.ensure_future(gpu.step(0.0, 0.0, 1.0))
    await run_until_done(clock, [fresh], tick=0.001)
    assert orphan.cancelled()
    assert fresh.result() == pytest.approx(2.0, abs=2e-3)  # beside the orphan's kernels to their end
