"""What every exchange shares: the collaborators (``Parts``), the set of exchanges in flight
(``Live``) and the shared health checks of long answers (``HealthChecks``).

``Pipeline`` builds one ``Parts`` and hands it to each ``Exchange``; the stages read it and call
its methods, none writes another's state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from proxy.admission import Admission
from proxy.clock import Clock, wait_until
from proxy.config import Config
from proxy.errors import RadixgateError
from proxy.pipeline.holds import Holds
from proxy.pipeline.transport import Transport
from proxy.records import CompletedRequest
from proxy.routing.base import Policy, RouteRequest
from proxy.routing.dp_rank import RankBook
from proxy.routing.token_estimate import TokenEstimate
from proxy.routing.tokenizer import PromptTokenizer
from proxy.telemetry.metrics import Metrics
from proxy.workers.health import Change
from proxy.workers.registry import WorkerRegistry


class RouteListener(Protocol):
    """Told of each routing decision, of each streamed answer's first token (its prefill done),
    and of each routed request's end (answered, failed or cancelled: once per request)."""

    def routed(self, worker: str, route: RouteRequest, matched_blocks: int, rid: str,
               dp_rank: int | None = None) -> None: ...

    def prefilled(self, worker: str, rid: str) -> None: ...

    def finished(self, worker: str, rid: str) -> None: ...


class Cuttable(Protocol):
    def cut(self, err: RadixgateError) -> bool:
        """End a stream still relaying with ``err`` as its error event; whether there was one."""
        ...


class Live:
    """The exchanges in flight; ``drained`` waits (on the clock) until there are none."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._items: set[Cuttable] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Cuttable]:
        return iter(list(self._items))

    def add(self, item: Cuttable) -> None:
        self._items.add(item)
        self._idle.clear()

    def discard(self, item: Cuttable) -> None:
        self._items.discard(item)
        if not self._items:
            self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        return await wait_until(self._clock, self._idle, timeout_s)


class HealthChecks:
    """Whether a worker passes its health probe. Every long answer it owes asks the same probe:
    one started less than ``health.timeout_s`` ago (running or done) is shared, so a hundred long
    answers on one worker cost one probe, not a hundred (SGLang's /health runs a generation)."""

    def __init__(self, clock: Clock, transport: Transport, *, endpoint: str, reuse_s: float) -> None:
        self._clock, self._transport = clock, transport
        self._endpoint, self._reuse_s = endpoint, reuse_s
        # worker -> (started, probe)
        self._checks: dict[str, tuple[float, asyncio.Task[bool]]] = {}

    def alive(self, worker: str, timeout_s: float) -> asyncio.Task[bool]:
        now, reuse_s = self._clock.now(), self._reuse_s
        found = self._checks.get(worker)
        if found is not None and now - found[0] < reuse_s:
            return found[1]
        # Only recent probes are kept: workers come and go, this map must not grow with them.
        self._checks = {w: c for w, c in self._checks.items() if now - c[0] < reuse_s}
        task = asyncio.get_running_loop().create_task(self._probe(worker, timeout_s))
        self._checks[worker] = (now, task)
        return task

    async def _probe(self, worker: str, timeout_s: float) -> bool:
        try:
            return await self._transport.probe(worker, self._endpoint, timeout_s) == 200
        except (OSError, TimeoutError):
            return False


@dataclass(frozen=True, slots=True, eq=False)
class Parts:
    config: Config
    clock: Clock
    registry: WorkerRegistry
    admission: Admission
    policy: Policy
    transport: Transport
    metrics: Metrics
    token_estimate: TokenEstimate
    holds: Holds
    health_checks: HealthChecks
    live: Live
    route_listeners: Sequence[RouteListener]
    # caller's Authorization → what the worker gets (security config).
    upstream_authorization: Callable[[str | None], str | None]
    # one finished request → metrics, the log line, observers
    record: Callable[[CompletedRequest], None]
    # routing.tokenizer: text prompts keyed by the model's token ids (None = by bytes)
    tokenizer: PromptTokenizer | None = None
    # routing.dp_ranks: this proxy's requests in flight per (worker, DP rank), known at once where
    # the workers' per-rank loads are a scrape old.
    dp_in_flight: dict[tuple[str, int], int] = field(default_factory=dict)
    # and the rank each prompt head went to first, so its followers find it there (shared with
    # peer sync: the peers' placements are booked too)
    rank_book: RankBook = field(default_factory=RankBook)

    def report_sick(self, worker: str) -> None:
        if self.registry.report_request(worker, False) is Change.EJECTED:
            self.metrics.inc(self.metrics.ejections, worker, worker=worker)

    def abort(self, worker: str, rid: str) -> None:
        """Free the worker's slot: it may still be generating (client left, deadline, hung)."""
        self.transport.abort(worker, rid)
        self.metrics.inc(self.metrics.aborts, worker, worker=worker)

    def failed(self, worker: str, cause: str, *, sick: bool) -> None:
        self.metrics.inc(self.metrics.upstream_failures, worker, cause, worker=worker)
        if sick:
            self.report_sick(worker)
