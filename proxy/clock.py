"""Injected time: one clock for marks, sleeps, timers and deadlines. Tests drive a manual one.

Durations always come from a monotonic clock. Everything on the request path that waits — the
admission queue, a hold, an attempt's first byte, a stream's deadline, a long answer's health
checks, the drain — asks the injected ``Clock``, never ``loop.time()`` or a bare
``asyncio.sleep`` / ``asyncio.wait_for``, so a ``ManualClock`` advanced by a test drives every
timeout with no real waiting.

    await clock.sleep(s)
    timer = clock.call_at(when, callback); timer.cancel()
    async with clock.timeout_at(when) as scope:   # TimeoutError once the clock reaches ``when``
        ...; scope.expire()                        # or end the scope now, as the same TimeoutError
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback`` on the running loop once this clock reaches ``when``."""
        ...

    def timeout_at(self, when: float) -> Deadline:
        """A scope that raises ``TimeoutError`` once this clock reaches ``when``."""
        ...


class Deadline:
    """``async with clock.timeout_at(when)``: an ``asyncio.timeout`` whose expiry is a timer of the
    clock (so a manual clock can fire it), and which can be ended early with ``expire()``."""

    __slots__ = ("_clock", "_inner", "_open", "_timer", "when")

    def __init__(self, clock: Clock, when: float) -> None:
        self._clock, self.when = clock, when
        self._inner: asyncio.Timeout | None = None
        self._timer: Timer | None = None
        self._open = False

    async def __aenter__(self) -> Deadline:
        self._inner = inner = asyncio.timeout(None)
        await inner.__aenter__()
        self._open = True
        self._timer = self._clock.call_at(self.when, self.expire)
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._open = False
        if self._timer is not None:
            self._timer.cancel()
        assert self._inner is not None
        await self._inner.__aexit__(et, e, tb)  # turns its own cancellation into TimeoutError

    def expire(self) -> None:
        """End the scope now: its body is cancelled and the ``async with`` raises TimeoutError."""
        inner = self._inner
        if self._open and inner is not None and not inner.expired():
            inner.reschedule(asyncio.get_running_loop().time())

    def expired(self) -> bool:
        return self._inner is not None and self._inner.expired()


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        # The loop keeps its own time (uvloop's is libuv's cached one): translate by the distance.
        if when == math.inf:  # no deadline: a timer that never fires
            return _ManualTimer()
        loop = asyncio.get_running_loop()
        return loop.call_at(loop.time() + max(0.0, when - self.now()), callback)

    def timeout_at(self, when: float) -> Deadline:
        return Deadline(self, when)


class _ManualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when a test advances it; timers and sleeps fire on ``advance``."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start
        self._seq = itertools.count()
        self._timers: list[tuple[float, int, _ManualTimer, Callable[[], object]]] = []

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        """Move time on and run, in time order, every callback now due (sleepers wake at the loop's
        next turn: a test awaits ``asyncio.sleep(0)`` to let them run)."""
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        target = self._t + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer, callback = heapq.heappop(self._timers)
            self._t = max(self._t, when)
            if not timer.cancelled:
                callback()
        self._t = target

    @property
    def pending(self) -> int:
        """Timers not yet fired nor cancelled (what a test may advance towards)."""
        return sum(1 for _, _, timer, _ in self._timers if not timer.cancelled)

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        timer = _ManualTimer()
        if when <= self._t:
            asyncio.get_running_loop().call_soon(lambda: None if timer.cancelled else callback())
            return timer
        heapq.heappush(self._timers, (when, next(self._seq), timer, callback))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_at(self._t + seconds, lambda: None if fut.done() else fut.set_result(None))
        try:
            await fut
        finally:
            timer.cancel()

    def timeout_at(self, when: float) -> Deadline:
        return Deadline(self, when)


async def wait_until(clock: Clock, event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s`` on ``clock`` (``asyncio.wait_for`` on the clock)."""
    try:
        async with clock.timeout_at(clock.now() + timeout_s):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
