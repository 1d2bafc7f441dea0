"""Holds: requests waiting for a prefill another request (or a peer replica) is running.

A policy may answer "hold" (``Decision.after`` names a prefill in progress): the request waits
for that prefill's first token — then its prefix is in a worker's cache — at most
``hold_limit(...)`` seconds, and is routed again. ``release(key)`` ends every hold on ``key``
(first token, end of the request that prefilled, or a peer saying so). Waits are on the injected
clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from typing import Literal

from proxy.clock import Clock

HoldOutcome = Literal["released", "timed_out", "cancelled"]


def hold_limit(hold_max_s: float, hold_s: float | None, remaining_s: float) -> float:
    """The longest a hold may wait: ``routing.hold_max_s``, the decision's ``hold_s`` (None = no
    bound of its own) and the time left before the request's deadline."""
    return min(hold_max_s, remaining_s) if hold_s is None else min(hold_max_s, hold_s, remaining_s)


class Holds:
    """Prefill key → the requests held for it. The only writer of its map."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waiting: dict[Hashable, list[asyncio.Future[None]]] = {}

    def __bool__(self) -> bool:
        return bool(self._waiting)

    def release(self, key: Hashable) -> None:
        for fut in self._waiting.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    async def wait(self, key: Hashable, limit_s: float) -> HoldOutcome:
        """Wait at most ``limit_s`` for ``release(key)``: "released" or "timed_out" (a cancelled
        wait raises; ``CancelledError`` propagates)."""
        if limit_s <= 0:
            return "timed_out"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = self._waiting.setdefault(key, [])
        waiting.append(fut)
        try:
            async with self._clock.timeout_at(self._clock.now() + limit_s):
                await fut
            return "released"
        except TimeoutError:
            return "timed_out"
        finally:
            if fut in waiting:  # timed out or cancelled: no longer held for it
                waiting.remove(fut)
                if not waiting and self._waiting.get(key) is waiting:
                    del self._waiting[key]
