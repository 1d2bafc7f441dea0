"""The simulated engine: the scheduler driven on the asyncio loop at ``time_scale`` x real time.

Loop: form a step, sleep its roofline time divided by ``time_scale``, apply it, wake the requests
it touched. Sleeps aim at a running deadline (the sum of step times), so late wake-ups of the
event loop do not slow the simulated GPU down; a lag over ``MAX_CATCH_UP_S`` is forgiven rather
than replayed as a burst, and added to ``lag_seconds`` (real seconds the host CPU could not keep
up with the simulated GPU: a load test whose worker lags measures the host, not the model). All timestamps are real monotonic seconds from the injected clock, so
latencies a worker reports match what a client measures. With nothing to do the loop waits on an
event (no polling).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from proxy.clock import Clock, MonotonicClock
from proxy.sim.blocks import BlockCache
from proxy.sim.config import SimConfig
from proxy.sim.gpu_realtime import RealTimeGpu
from proxy.sim.kv_publish import KvPublisher
from proxy.sim.perf import Profile, step_parts
from proxy.sim.radix import RadixCache
from proxy.sim.scheduler import Scheduler, SchedulerLimits, SimRequest

MAX_CATCH_UP_S = 0.02
THROUGHPUT_WINDOW_S = 5.0


class Engine:
    def __init__(self, config: SimConfig, clock: Clock | None = None, gpu: RealTimeGpu | None = None,
                 profile: Profile | None = None) -> None:
        config.validate()
        self.config = config
        self.clock = clock or MonotonicClock()
        # ``profile``: one not in PROFILES (a fit's candidate); else the config's, by name.
        self.profile: Profile = profile or config.resolved_profile()
        # Several engines on one GPU (gpu_realtime: shared as the profile says); None = a GPU of its own.
        self.gpu = gpu
        self.max_total_tokens = config.max_total_tokens or self.profile.kv_pool_tokens
        self.context_length = config.context_length or self.profile.model.context_length
        chunk = config.chunked_prefill_size
        self.limits = SchedulerLimits(
            max_running_requests=config.max_running_requests or self.profile.max_running_requests,
            chunked_prefill_size=self.profile.chunked_prefill_size if chunk is None else chunk,
            max_prefill_tokens=config.max_prefill_tokens,
            max_queued_requests=config.max_queued_requests,
            schedule_policy=config.schedule_policy,
            enable_mixed_chunk=config.enable_mixed_chunk or self.profile.enable_mixed_chunk,
            prefill_max_requests=config.prefill_max_requests or self.profile.prefill_max_requests,
            context_length=self.context_length,
            kind=self.profile.scheduler,
            kv_read_budget=self.profile.kv_read_budget,
            safety_margin=self.profile.safety_margin,
            cache_chunks=self.profile.cache_chunks,
        )
        self.cache: RadixCache | BlockCache = (
            BlockCache(self.max_total_tokens, config.page_size) if self.profile.kv_blocks
            else RadixCache(self.max_total_tokens, config.page_size, self.profile.evict_most_recent))
        # Where the cache's events go after each step (SimWorker sets it when publishing).
        self.kv_publisher: KvPublisher | None = None
        if config.kv_events_config:
            self.cache.events = []
        self.scheduler = Scheduler(self.cache, self.limits)
        self.scheduler.store_at_schedule = config.kv_events_at == "schedule"
        self.by_rid: dict[str, SimRequest] = {}
        self.on_tokens: Callable[[int], None] | None = None  # total generated so far, after each step
        self.on_finish: Callable[[SimRequest], None] | None = None
        self._throughput: deque[tuple[float, int]] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.busy_seconds = 0.0  # simulated GPU seconds
        self.lag_seconds = 0.0

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="simworker-engine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for req in self.scheduler.all_requests():
            self._abort(req, "The server is shutting down.", 503)

    # -- requests --------------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        """Queue a request; raises scheduler.QueueFull or scheduler.InvalidRequest."""
        if req.rid in self.by_rid:
            raise ValueError(f"duplicate request id {req.rid!r}")
        self.scheduler.submit(req, self.clock.now())
        self.by_rid[req.rid] = req
        self._wake.set()

    def abort(self, rid: str, message: str = "Aborted by request.", status: int | None = None) -> bool:
        req = self.by_rid.get(rid)
        return req is not None and self._abort(req, message, status)

    def abort_all(self, message: str = "Aborted by request.") -> int:
        return sum(self._abort(r, message, None) for r in self.scheduler.all_requests())

    def _abort(self, req: SimRequest, message: str, status: int | None) -> bool:
        done = self.scheduler.abort(req, self.clock.now(), message, status)
        if done:
            self._finished(req)
        return done

    def _finished(self, req: SimRequest) -> None:
        self.by_rid.pop(req.rid, None)
        if self.on_finish is not None:
            self.on_finish(req)
        if req.listener is not None:
            req.listener(req)

    def flush_cache(self) -> bool:
        flushed = self.scheduler.flush_cache()
        if flushed and self.cache.events:
            self._wake.set()  # the loop publishes the AllBlocksCleared
        return flushed

    # -- figures ---------------------------------------------------------------------------------
    def gen_throughput(self) -> float:
        now = self.clock.now()
        while self._throughput and self._throughput[0][0] < now - THROUGHPUT_WINDOW_S:
            self._throughput.popleft()
        return sum(n for _, n in self._throughput) / THROUGHPUT_WINDOW_S

    # -- the loop --------------------------------------------------------------------------------
    async def _publish_cache_events(self) -> None:
        events = self.cache.events
        if events and self.kv_publisher is not None:
            batch = events[:]
            events.clear()
            await self.kv_publisher.publish_events(batch)

    async def _loop(self) -> None:
        deadline: float | None = None
        while True:
            await self._publish_cache_events()  # a flush between steps
            now = self.clock.now()
            step = self.scheduler.next_step(now)
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                deadline = None
                continue
            host, device = step_parts(self.profile, step.work)
            self.busy_seconds += host + device
            if deadline is not None and now - deadline > MAX_CATCH_UP_S:
                self.lag_seconds += now - deadline - MAX_CATCH_UP_S
            base = now if deadline is None else max(deadline, now - MAX_CATCH_UP_S)
            scale = self.config.time_scale
            if self.gpu is None:
                deadline = base + (host + device) / scale
                await asyncio.sleep(max(0.0, deadline - self.clock.now()))
            else:  # returns once the step has ended on the shared GPU
                deadline = await self.gpu.step(base, host / scale, device / scale)
            done_at = self.clock.now()
            before = self.scheduler.generated_tokens
            touched = self.scheduler.finish_step(step, done_at)
            await self._publish_cache_events()  # what the step stored and evicted, as SGLang does
            for req in touched:
                if req.finished:
                    self._finished(req)
                elif req.listener is not None:
                    req.listener(req)
            produced = self.scheduler.generated_tokens - before
            if produced:
                self._throughput.append((done_at, produced))
                if self.on_tokens is not None:
                    self.on_tokens(self.scheduler.generated_tokens)
