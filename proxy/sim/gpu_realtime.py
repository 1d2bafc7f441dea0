"""One GPU shared by simulated engines that run in real time (the HTTP simulator's ``--count N
--shared-gpu``), shared as the profile says (``gpu_share.gpu_pool``: whole steps, or time slices
whose step ends move when another engine's step joins).

Why a timer and not a deadline per step: with time slices a step's end is not known when it is
issued, so the pool's next event is kept armed on the clock, and each engine awaits its own
step's end. The pool itself stays pure (``gpu_share``); this is its I/O side.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Hashable

from proxy.clock import Clock, Timer
from proxy.sim.gpu_share import GpuSteps


class RealTimeGpu:
    def __init__(self, pool: GpuSteps[Hashable], clock: Clock) -> None:
        self.pool = pool
        self.clock = clock
        self._waiters: dict[Hashable, asyncio.Future[float]] = {}
        self._timer: Timer | None = None
        self._served = -math.inf  # the last instant the pool was served to

    async def step(self, start: float, host: float, device: float) -> float:
        """Run one step issued at ``start`` (at most now; earlier when the engine catches up);
        return the instant it ended, once it has. Each step is its own key in the pool: an engine
        stopped while its step runs leaves that step to end there (its kernels would), and a
        restarted one can issue the next at once."""
        self._serve(min(start, self.clock.now()))  # the pool must not pass an event unserved
        key = object()
        waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        self.pool.submit(key, max(start, self._served), host, device)
        self._arm()
        try:
            return await waiter
        finally:
            self._waiters.pop(key, None)

    def _serve(self, until: float) -> None:
        """Apply every event of the pool up to ``until``, one instant at a time (a time-sliced
        pool's shares change at each), and wake the engines whose steps ended."""
        t = self.pool.next_event()
        while t <= until:
            self._served = max(self._served, t)
            for key in self.pool.done(t):
                waiter = self._waiters.get(key)
                if waiter is not None and not waiter.done():
                    waiter.set_result(t)
            t = self.pool.next_event()  # later than t: the pools keep their events an ulp apart

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        when = self.pool.next_event()
        self._timer = None if math.isinf(when) else self.clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._serve(self.clock.now())
        self._arm()
