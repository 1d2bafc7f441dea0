"""Admission at the proxy: per-worker outstanding limits and one bounded priority queue.

Rule. Each healthy worker ``w`` accepts at most ``limit(w)`` outstanding requests from this proxy
(``admission.per_worker_limit``, or ``ceil(max_running_requests * limit_factor)`` from its scraped
state, or ``unknown_worker_limit`` before the first scrape). A request is *admitted* when the fleet
has a free slot: ``Σ_w max(0, limit(w) - outstanding(w)) - reserved > 0``; ``reserved`` counts
requests admitted but not yet routed. Otherwise it waits in one queue, higher ``priority`` first,
FIFO within a priority, until a slot frees (then it is routed with *fresh* state — the point of
waiting here rather than in one worker's queue), its wait exceeds ``queue_timeout_s`` (outcome
``timed_out`` → 429), it is cancelled (client left: ``cancelled``), or the proxy begins shutting
down (``shutting_down`` → 503). A full queue (``queue_size``) rejects at once (``queue_full`` → 429).

Structure: ``AdmissionCore`` is pure (no asyncio, time from an injected ``Clock``) and does all the
accounting; ``Admission`` is the thin async shell handing out ``Lease`` context managers that
always release their slot and always record their outcome and wait. Complexity: O(log q) per
enqueue/grant (heap), O(workers) per capacity check.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType
from typing import NoReturn

from proxy.clock import Clock
from proxy.config import AdmissionConfig
from proxy.errors import Overloaded, ShuttingDown
from proxy.routing.base import WorkerSnapshot


class Outcome(StrEnum):
    ADMITTED = "admitted"
    QUEUE_FULL = "queue_full"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    SHUTTING_DOWN = "shutting_down"


class _State(StrEnum):
    QUEUED = "queued"
    RESERVED = "reserved"  # admitted, not yet routed to a worker
    ASSIGNED = "assigned"
    DONE = "done"


@dataclass(eq=False, slots=True)
class Ticket:
    priority: int
    seq: int
    enqueued_at: float
    deadline: float
    state: _State = _State.QUEUED
    worker: str | None = None
    admitted_at: float | None = None


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    queue_depth: int
    reserved: int
    outstanding: Mapping[str, int]
    limits: Mapping[str, int]
    shutting_down: bool


def derive_limit(worker: WorkerSnapshot, cfg: AdmissionConfig) -> int:
    """The outstanding limit for one worker under ``cfg``."""
    if cfg.per_worker_limit > 0:
        return cfg.per_worker_limit
    if worker.max_running_requests:
        return max(1, math.ceil(worker.max_running_requests * cfg.limit_factor))
    return cfg.unknown_worker_limit


class AdmissionCore:
    """Pure accounting; every method returns the tickets it newly admitted (the shell wakes them)."""

    def __init__(self, *, queue_size: int, queue_timeout_s: float, clock: Clock) -> None:
        self._queue_size = queue_size
        self._timeout = queue_timeout_s
        self._clock = clock
        self._heap: list[tuple[int, int, Ticket]] = []
        self._queued = 0
        self._reserved = 0
        self._limits: dict[str, int] = {}
        self._outstanding: dict[str, int] = {}
        self._seq = itertools.count()
        self._shutting_down = False

    # -- capacity ----------------------------------------------------------------------------
    def free_slots(self) -> int:
        room = sum(max(0, lim - self._outstanding.get(w, 0)) for w, lim in self._limits.items())
        return room - self._reserved

    def has_room(self, worker: str) -> bool:
        return self._outstanding.get(worker, 0) < self._limits.get(worker, 0)

    def outstanding(self, worker: str) -> int:
        return self._outstanding.get(worker, 0)

    def set_limits(self, limits: Mapping[str, int]) -> list[Ticket]:
        """The healthy workers and their limits changed; a worker absent here takes nothing new."""
        self._limits = dict(limits)
        return self._grant()

    # -- requests ----------------------------------------------------------------------------
    def request(self, priority: int = 0, timeout_s: float | None = None) -> Ticket | Outcome:
        """Admit at once (state RESERVED), queue (state QUEUED), or reject with an outcome."""
        if self._shutting_down:
            return Outcome.SHUTTING_DOWN
        now = self._clock.now()
        wait = self._timeout if timeout_s is None else min(self._timeout, max(0.0, timeout_s))
        ticket = Ticket(priority, next(self._seq), now, now + wait)
        if self._queued == 0 and self.free_slots() > 0:
            self._reserve(ticket, now)
            return ticket
        if self._queued >= self._queue_size:
            return Outcome.QUEUE_FULL
        if wait <= 0:
            return Outcome.TIMED_OUT
        heapq.heappush(self._heap, (-priority, ticket.seq, ticket))
        self._queued += 1
        return ticket

    def assign(self, ticket: Ticket, worker: str) -> None:
        """Bind an admitted ticket to ``worker`` (first dispatch, or a retry on another worker)."""
        if ticket.state is _State.RESERVED:
            self._reserved -= 1
        elif ticket.state is _State.ASSIGNED and ticket.worker is not None:
            self._dec(ticket.worker)
        else:
            raise RuntimeError(f"cannot assign a ticket in state {ticket.state}")
        ticket.state = _State.ASSIGNED
        ticket.worker = worker
        self._outstanding[worker] = self._outstanding.get(worker, 0) + 1

    def release(self, ticket: Ticket) -> list[Ticket]:
        """The request finished (or gave up): free its slot or its place in the queue."""
        state, ticket.state = ticket.state, _State.DONE
        if state is _State.QUEUED:
            self._queued -= 1  # its heap entry is skipped lazily
            return []
        if state is _State.RESERVED:
            self._reserved -= 1
        elif state is _State.ASSIGNED and ticket.worker is not None:
            self._dec(ticket.worker)
        else:
            return []
        return self._grant()

    def begin_shutdown(self) -> list[Ticket]:
        """Reject new requests; return the queued tickets so the shell can fail them."""
        self._shutting_down = True
        waiting = [t for _, _, t in self._heap if t.state is _State.QUEUED]
        for t in waiting:
            t.state = _State.DONE
        self._heap.clear()
        self._queued = 0
        return waiting

    def snapshot(self) -> AdmissionSnapshot:
        return AdmissionSnapshot(self._queued, self._reserved, dict(self._outstanding), dict(self._limits),
                                 self._shutting_down)

    # -- internals -----------------------------------------------------------------------------
    def _reserve(self, ticket: Ticket, now: float) -> None:
        ticket.state = _State.RESERVED
        ticket.admitted_at = now
        self._reserved += 1

    def _dec(self, worker: str) -> None:
        left = self._outstanding.get(worker, 0) - 1
        if left > 0:
            self._outstanding[worker] = left
        else:
            self._outstanding.pop(worker, None)

    def _grant(self) -> list[Ticket]:
        granted: list[Ticket] = []
        now = self._clock.now()
        free = self.free_slots()
        while free > 0 and self._heap:
            _, _, ticket = heapq.heappop(self._heap)
            if ticket.state is not _State.QUEUED:
                continue
            self._queued -= 1
            self._reserve(ticket, now)
            granted.append(ticket)
            free -= 1
        return granted


class Admission:
    """Async shell: ``async with admission.lease(priority=p) as lease: lease.assign(url)``."""

    def __init__(self, cfg: AdmissionConfig, clock: Clock) -> None:
        self.cfg = cfg
        self.clock = clock
        self.core = AdmissionCore(queue_size=cfg.queue_size, queue_timeout_s=cfg.queue_timeout_s, clock=clock)
        self._waiters: dict[Ticket, asyncio.Future[Outcome]] = {}

    def lease(self, *, priority: int = 0, timeout_s: float | None = None) -> Lease:
        return Lease(self, priority, timeout_s)

    def update_workers(self, workers: Sequence[WorkerSnapshot]) -> None:
        """Recompute limits from the healthy workers' snapshots; wake whoever now fits."""
        limits = {w.url: derive_limit(w, self.cfg) for w in workers if w.healthy}
        self._wake(self.core.set_limits(limits))

    def begin_shutdown(self) -> None:
        for ticket in self.core.begin_shutdown():
            fut = self._waiters.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(Outcome.SHUTTING_DOWN)

    def limits(self) -> dict[str, int]:
        return dict(self.core.snapshot().limits)

    def _wake(self, tickets: list[Ticket]) -> None:
        for ticket in tickets:
            fut = self._waiters.pop(ticket, None)
            if fut is not None and not fut.done():
                fut.set_result(Outcome.ADMITTED)

    def _release(self, ticket: Ticket) -> None:
        self._waiters.pop(ticket, None)
        self._wake(self.core.release(ticket))


class Lease:
    """One request's admission. ``outcome`` and ``wait_s`` are set however ``__aenter__`` ends."""

    __slots__ = ("_adm", "_priority", "_ticket", "_timeout", "outcome", "wait_s")

    def __init__(self, adm: Admission, priority: int, timeout_s: float | None) -> None:
        self._adm = adm
        self._priority = priority
        self._timeout = timeout_s
        self._ticket: Ticket | None = None
        self.outcome: Outcome | None = None
        self.wait_s = 0.0

    @property
    def worker(self) -> str | None:
        return None if self._ticket is None else self._ticket.worker

    @property
    def admitted_at(self) -> float | None:
        return None if self._ticket is None else self._ticket.admitted_at

    async def __aenter__(self) -> Lease:
        adm = self._adm
        got = adm.core.request(self._priority, self._timeout)
        if isinstance(got, Outcome):
            self._fail(got, 0.0)
        ticket = self._ticket = got
        if ticket.state is _State.QUEUED:
            fut: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
            adm._waiters[ticket] = fut
            try:
                # The queue's deadline is the clock's (a manual clock in a test drives it).
                async with adm.clock.timeout_at(ticket.deadline):
                    result = await fut
            except TimeoutError:
                if ticket.admitted_at is None:  # not granted in the same instant
                    adm._release(ticket)
                    self._fail(Outcome.TIMED_OUT, adm.clock.now() - ticket.enqueued_at)
                result = Outcome.ADMITTED
            except asyncio.CancelledError:
                adm._release(ticket)
                self.outcome, self.wait_s = Outcome.CANCELLED, adm.clock.now() - ticket.enqueued_at
                raise
            if result is not Outcome.ADMITTED:
                self._fail(result, adm.clock.now() - ticket.enqueued_at)
        self.outcome = Outcome.ADMITTED
        self.wait_s = (ticket.admitted_at or ticket.enqueued_at) - ticket.enqueued_at
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()

    def release(self) -> None:
        """Free the slot (idempotent); ``__aexit__`` calls it, callers holding no ``async with`` too."""
        if self._ticket is not None and self._ticket.state is not _State.DONE:
            self._adm._release(self._ticket)

    def eligible(self, workers: Sequence[WorkerSnapshot]) -> list[WorkerSnapshot]:
        """The healthy workers with a free slot (all healthy ones if limits shrank under us)."""
        core = self._adm.core
        own = self.worker
        room = [w for w in workers if w.healthy and (w.url == own or core.has_room(w.url))]
        return room or [w for w in workers if w.healthy]

    def assign(self, worker: str) -> None:
        if self._ticket is None:
            raise RuntimeError("assign() before the lease was admitted")
        self._adm.core.assign(self._ticket, worker)

    def _fail(self, outcome: Outcome, wait: float) -> NoReturn:
        self.outcome, self.wait_s = outcome, wait
        if outcome is Outcome.SHUTTING_DOWN:
            raise ShuttingDown("the proxy is shutting down", retry_after=1.0)
        reason = {Outcome.QUEUE_FULL: "admission queue is full",
                  Outcome.TIMED_OUT: "timed out waiting for a free worker slot"}.get(outcome, str(outcome))
        raise Overloaded(reason, retry_after=1.0)
