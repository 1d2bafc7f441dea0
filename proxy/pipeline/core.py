"""``Pipeline``: what every exchange shares, and the calls the frontends and ``App`` make on it.

It builds one ``Parts`` (the collaborators, given in its constructor by ``App``) and opens an
``Exchange`` per request; besides that it refuses requests that never entered (``reject``),
releases holds (``prefilled``, also a peer replica's word), lists the served models, and on stop
waits for the exchanges in flight (``drained``) and cuts the streams left (``cut_streams``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence

from proxy.admission import Admission
from proxy.clock import Clock
from proxy.config import Config
from proxy.errors import RadixgateError
from proxy.pipeline.exchange import Exchange, models_of
from proxy.pipeline.holds import Holds
from proxy.pipeline.parts import HealthChecks, Live, Parts, RouteListener
from proxy.pipeline.transport import Transport
from proxy.records import CompletedRequest
from proxy.request import GenerateRequest
from proxy.routing.base import Policy
from proxy.routing.dp_rank import RankBook
from proxy.routing.token_estimate import TokenEstimate
from proxy.routing.tokenizer import PromptTokenizer
from proxy.telemetry.logging import RequestLogger
from proxy.telemetry.metrics import Metrics
from proxy.timing import RequestTiming
from proxy.tracecontext import TraceContext
from proxy.workers.registry import WorkerRegistry

log = logging.getLogger(__name__)


def _unchanged(client: str | None) -> str | None:
    return client


class Pipeline:
    def __init__(self, *, config: Config, clock: Clock, registry: WorkerRegistry, admission: Admission,
                 policy: Policy, upstream: Transport, metrics: Metrics,
                 request_log: RequestLogger | None = None,
                 observers: Sequence[Callable[[CompletedRequest], None]] = (),
                 route_listeners: Sequence[RouteListener] = (),
                 upstream_authorization: Callable[[str | None], str | None] = _unchanged,
                 holds: Holds | None = None, tokenizer: PromptTokenizer | None = None,
                 rank_book: RankBook | None = None) -> None:
        self.config, self.clock, self.registry, self.admission = config, clock, registry, admission
        self.policy, self.metrics, self.request_log = policy, metrics, request_log
        self.upstream = upstream  # the transport to workers (workers/upstream.py in the product)
        # Anything that wants every finished request (the diagnosis); given by App at construction.
        self.observers: list[Callable[[CompletedRequest], None]] = list(observers)
        # Tracing on: the context a request's worker is handed (proxy/telemetry/tracing.py).
        self.trace_begin: Callable[[TraceContext | None], TraceContext | None] | None = None
        # caller's Authorization → what the worker gets (security config).
        self.upstream_authorization = upstream_authorization
        # UTF-8 bytes per token per model, learned from reported prompt tokens (text prompts).
        self.token_estimate = TokenEstimate(config.routing.chars_per_token)
        # Decision.after -> requests held until that prefill's first token (shared with peer sync).
        self._holds = holds if holds is not None else Holds(clock)
        self._live = Live(clock)
        self._parts = Parts(
            config=config, clock=clock, registry=registry, admission=admission, policy=policy,
            transport=upstream, metrics=metrics, token_estimate=self.token_estimate, holds=self._holds,
            health_checks=HealthChecks(clock, upstream, endpoint=config.health.endpoint,
                                       reuse_s=config.health.timeout_s),
            live=self._live, route_listeners=tuple(route_listeners),
            upstream_authorization=upstream_authorization, record=self._record, tokenizer=tokenizer,
            rank_book=rank_book if rank_book is not None else RankBook())

    @property
    def active(self) -> int:
        """Exchanges in flight."""
        return len(self._live)

    def exchange(self, req: GenerateRequest, *, received: float | None = None) -> Exchange:
        if self.trace_begin is not None:  # radixgate's own span (telemetry.otlp_traces_endpoint)
            req.trace = self.trace_begin(req.trace)
        return Exchange(self._parts, req, self.clock.now() if received is None else received)

    def reject(self, frontend: str, dialect: str, err: RadixgateError, received: float) -> None:
        """Record a request refused before it entered the pipeline (malformed, too large)."""
        timing = RequestTiming(received=received, done=self.clock.now())
        self.metrics.inc(self.metrics.requests_accepted, frontend)
        self._record(CompletedRequest(
            rid="", frontend=frontend, dialect=dialect, stream=False, worker=None, status=err.status,
            outcome="error", cause=err.cause, retries=0, policy=self.policy.name, decision=None, route=None,
            admission=None, admission_wait=None, timing=timing, finish_reason=None))

    def worker_alive(self, worker: str, timeout_s: float) -> asyncio.Task[bool]:
        """Whether ``worker`` passes its health probe (one probe shared by every long answer it owes)."""
        return self._parts.health_checks.alive(worker, timeout_s)

    def prefilled(self, key: Hashable) -> None:
        """The prefill named ``key`` ended (its first token, or its request ended, or a peer said
        so): release the requests held for it."""
        self._holds.release(key)

    def models(self) -> list[str]:
        return models_of(self.registry.published())

    def cut_streams(self, err: RadixgateError) -> int:
        """End every stream still relaying with ``err`` as its error event; how many were cut."""
        return sum(1 for ex in self._live if ex.cut(err))

    async def drained(self, timeout_s: float) -> bool:
        """Whether every exchange ended within ``timeout_s`` (on the clock)."""
        return await self._live.drained(timeout_s)

    def _record(self, done: CompletedRequest) -> None:
        self.metrics.record(done)
        if self.request_log is not None:
            self.request_log.log(done)
        for observe in self.observers:
            try:
                observe(done)
            except Exception:  # an observer's bug (diagnosis, tracing) must not fail the request it watched
                log.exception("observer %r failed on request %s", observe, done.rid)
