"""The one path every request takes, whichever frontend received it.

    key → admit → route → forward → time → record

1. key: ``prefix_key.build_route_request`` (block size = the healthy workers' page size, min 16;
   a text prompt's tokens counted with the bytes per token learned from the ``prompt_tokens``
   that finished answers reported, ``routing/token_estimate.py``).
2. admit: an ``Admission`` lease — waits at the proxy until a worker slot is free.
3. route: ``policy.select`` over fresh snapshots of the healthy workers that have a free slot and
   serve the model. A ``hold`` decision (``Decision.after``) waits, at most ``routing.hold_max_s``
   and the decision's ``hold_s``, for the named prefill's first token (``Pipeline.prefilled``),
   then selects again.
4. forward: POST the caller's bytes (plus a ``rid`` when they gave none, and
   ``stream_options.include_usage`` on an OpenAI stream that did not ask for it: its usage chunk is
   counted, not relayed, so every stream mode feeds the token counters) to the worker. Until the
   first byte of the answer reaches the client, a connect error, a 5xx, a 503 (queue full /
   starting) or a first-byte timeout moves the request to another worker, at most
   ``upstream.max_retries`` times (a refused connection on the last one answers 503). A
   stream is handed to the frontend only once its first complete event arrived, so a failed
   attempt costs the client nothing but time. A non-stream answer arrives whole, so no silence
   tells a hung worker from a long generation: past each ``first_byte_timeout_s`` the worker's
   health probe decides (passing: keep waiting; failing: the first-byte timeout's path).
   Every answer is judged before a byte of it reaches the client (``workers/answers.py``: status,
   content type, JSON-ness; ``sse.check_events`` for each relayed run); a bad one, a protocol error
   or a breach of an ``upstream.max_*_bytes`` cap is a 502, retried like a 5xx. A stream ends at its
   deadline by the clock (one timer), whatever the worker still sends.
5. time: ``RequestTiming`` marks received, admitted, dispatched, upstream_headers, first_byte, each
   token-bearing chunk, done.
6. record: metrics, one JSON log line, ``policy.on_complete``, and ``observers`` (diagnosis).
   (A streamed answer's first token already told the policy: ``policy.on_first_token``.)

Two ways to consume an ``Exchange`` (``async with pipeline.exchange(req) as ex``):
* ``ex.chunks()`` — complete SSE events as raw bytes, relayed as they come (HTTP frontend);
* ``ex.events()`` — typed ``TextDelta`` / ``ErrorEvent`` and a final ``Finished`` (gRPC frontend).
A non-stream answer is ``ex.status`` / ``ex.body``. If the worker dies mid-stream the stream ends
with an error event and ``[DONE]``. If the consumer leaves early (client disconnect), leaving the
``async with`` closes the upstream connection and sends ``/abort_request`` for the ``rid``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Hashable, Sequence
from types import TracebackType
from typing import Protocol

from proxy import safejson
from proxy.admission import Admission, Lease
from proxy.clock import Clock
from proxy.config import Config
from proxy.errors import (
    ModelNotFound,
    NoHealthyWorker,
    Overloaded,
    RadixgateError,
    UpstreamError,
    UpstreamTimeout,
)
from proxy.records import CompletedRequest, Finished, body_with_rid, wants_usage_hidden
from proxy.request import GenerateRequest
from proxy.routing.base import (
    Completion,
    Decision,
    FirstToken,
    IgnoresFeedback,
    NoWorkerAvailable,
    Policy,
    RouteRequest,
    WorkerSnapshot,
)
from proxy.routing.prefix_key import block_tokens_for, build_route_request
from proxy.routing.token_estimate import TokenEstimate
from proxy.sse import (
    ErrorEvent,
    EventDecoder,
    FinalMeta,
    MalformedEvent,
    StreamAccountant,
    TextDelta,
    check_events,
    drop_usage_events,
    error_event,
    first_token_counts,
    meta_from,
    until_end,
)
from proxy.telemetry.logging import RequestLogger
from proxy.telemetry.metrics import Metrics
from proxy.timing import RequestTiming
from proxy.workers.answers import BadAnswer, Kind, client_error_body, judge_body, judge_head
from proxy.workers.health import Change
from proxy.workers.http1 import (
    Http1Connection,
    ResponseTooLarge,
    UpstreamClosed,
    UpstreamIdle,
    UpstreamProtocolError,
)
from proxy.workers.registry import WorkerRegistry
from proxy.workers.upstream import CONNECT_ERRORS, UpstreamPool

# Re-exported: callers import the pipeline's records from here.
__all__ = ["CompletedRequest", "Exchange", "Finished", "Pipeline", "body_with_rid", "error_event"]


class RouteListener(Protocol):
    """Told of each routing decision and of each streamed answer's first token (its prefill done)."""

    def routed(self, worker: str, route: RouteRequest, matched_blocks: int, rid: str) -> None: ...

    def prefilled(self, worker: str, rid: str) -> None: ...


class _Retry(Exception):
    def __init__(self, cause: str, error: RadixgateError, *, sick: bool) -> None:
        super().__init__(error.message)
        self.cause, self.error, self.sick = cause, error, sick


class Pipeline:
    def __init__(self, *, config: Config, clock: Clock, registry: WorkerRegistry, admission: Admission,
                 policy: Policy, upstream: UpstreamPool, metrics: Metrics,
                 request_log: RequestLogger | None = None) -> None:
        self.config, self.clock, self.registry, self.admission = config, clock, registry, admission
        self.policy, self.upstream, self.metrics, self.request_log = policy, upstream, metrics, request_log
        self.observers: list[Callable[[CompletedRequest], None]] = []
        # UTF-8 bytes per token per model, learned from reported prompt tokens (text prompts).
        self.token_estimate = TokenEstimate(config.routing.chars_per_token)
        # Told of every routing decision and streamed first token (App: peer replicas, proxy/peers.py).
        self.route_listeners: list[RouteListener] = []
        # caller's Authorization → what the worker gets (App sets it from security config).
        self.upstream_authorization: Callable[[str | None], str | None] = lambda client: client
        self.active = 0
        # Decision.after -> requests held until that prefill's first token
        self._holds: dict[Hashable, list[asyncio.Future[None]]] = {}
        self._live: set[Exchange] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        # worker -> (started, probe): the health check long non-stream answers on it share
        self._checks: dict[str, tuple[float, asyncio.Task[bool]]] = {}

    def exchange(self, req: GenerateRequest, *, received: float | None = None) -> Exchange:
        return Exchange(self, req, self.clock.now() if received is None else received)

    def reject(self, frontend: str, dialect: str, err: RadixgateError, received: float) -> None:
        """Record a request refused before it entered the pipeline (malformed, too large)."""
        timing = RequestTiming(received=received, done=self.clock.now())
        self.metrics.inc(self.metrics.requests_accepted, frontend)
        self._record(CompletedRequest(
            rid="", frontend=frontend, dialect=dialect, stream=False, worker=None, status=err.status,
            outcome="error", cause=err.cause, retries=0, policy=self.policy.name, decision=None, route=None,
            admission=None, admission_wait=None, timing=timing, finish_reason=None))

    def worker_alive(self, worker: str, timeout_s: float) -> asyncio.Task[bool]:
        """Whether ``worker`` passes its health probe. Every long answer it owes asks the same probe:
        one started less than ``health.timeout_s`` ago (running or done) is shared, so a hundred long
        answers on one worker cost one probe, not a hundred (SGLang's /health runs a generation)."""
        now, reuse_s = self.clock.now(), self.config.health.timeout_s
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
            return await self.upstream.probe(worker, self.config.health.endpoint, timeout_s) == 200
        except (OSError, TimeoutError):
            return False

    def prefilled(self, key: Hashable) -> None:
        """The prefill named ``key`` ended (its first token, or its request ended, or a peer said
        so): release the requests held for it."""
        for fut in self._holds.pop(key, ()):
            if not fut.done():
                fut.set_result(None)

    def models(self) -> list[str]:
        seen: dict[str, None] = {}
        for s in self.registry.published():
            for m in s.models:
                seen.setdefault(m, None)
        return list(seen)

    def cut_streams(self, err: RadixgateError) -> int:
        """End every stream still relaying with ``err`` as its error event (the drain's last word):
        closing each upstream connection makes its relay stop at the next read, the one place a
        stream already knows how to end with an error. Returns how many were cut."""
        cut = 0
        for ex in list(self._live):
            if ex.streaming and ex._resp is not None and not ex._upstream_done:
                ex._cut = err
                ex._resp.close()
                cut += 1
        return cut

    async def drained(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _record(self, done: CompletedRequest) -> None:
        self.metrics.record(done)
        if self.request_log is not None:
            self.request_log.log(done)
        for observe in self.observers:
            observe(done)


class Exchange:
    def __init__(self, p: Pipeline, req: GenerateRequest, received: float) -> None:
        self.p, self.req = p, req
        self.timing = RequestTiming(received=received)
        self.rid = req.rid or uuid.uuid4().hex
        self.streaming = req.stream
        self.status = 0
        self.content_type = "application/json"
        self.body = b""
        self.worker: str | None = None
        self.decision: Decision | None = None
        self.route: RouteRequest | None = None
        self.retries = 0
        self.meta = FinalMeta()
        self.error: RadixgateError | None = None  # set when a stream broke after relaying began
        self._cut: RadixgateError | None = None  # why the proxy itself ended the stream (drain)
        self._lease: Lease | None = None
        self._resp: Http1Connection | None = None
        self._first = b""
        self._first_at = 0.0
        self._buf: list[bytes] = []  # a partial SSE event, in the pieces it arrived in
        self._buf_len = 0
        self._acct = StreamAccountant(req.dialect)
        # An OpenAI stream whose caller did not ask for usage: asked for anyway, not relayed.
        self._hide_usage = wants_usage_hidden(req)
        self._upstream_done = False
        self._ended = False
        self._gen: AsyncGenerator[bytes, None] | None = None
        total = p.config.upstream.total_timeout_s
        if req.timeout_s is not None:
            total = min(total, req.timeout_s)
        self._total = total
        self._deadline = received + total
        p.metrics.inc(p.metrics.requests_accepted, req.frontend)
        p.active += 1
        p._live.add(self)
        p._idle.clear()

    async def __aenter__(self) -> Exchange:
        try:
            await self._start()
        except BaseException as e:
            await self._end(e)
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._end(e)

    # -- admit, route, forward ----------------------------------------------------------------------
    def _serving(self, snaps: Sequence[WorkerSnapshot]) -> list[WorkerSnapshot]:
        """Healthy workers serving the requested model; 404 when no worker (healthy or not) serves it."""
        model = self.req.model
        healthy = [s for s in snaps if s.healthy]
        if not model or not any(s.models for s in snaps):
            return healthy
        if not any(model in s.models or not s.models for s in snaps):
            raise ModelNotFound(not_served(model, self.p.models()))
        return [s for s in healthy if model in s.models or not s.models]

    async def _start(self) -> None:
        p, t = self.p, self.timing
        cfg = p.config
        snaps = p.registry.snapshots()
        serving = self._serving(snaps)
        if not serving:
            raise NoHealthyWorker("no healthy worker can take the request", retry_after=1.0)
        self.route = build_route_request(
            self.req, block_tokens=block_tokens_for(s.page_size for s in serving),
            chars_per_token=cfg.routing.chars_per_token, max_blocks=cfg.routing.max_blocks,
            bytes_per_token=p.token_estimate.bytes_per_token(self.req.model))
        if cfg.routing.hold_max_s <= 0:  # holds are off: a policy routes it at once
            self.route = dataclasses.replace(self.route, held=True)
        remaining = self._deadline - p.clock.now()
        self._lease = lease = p.admission.lease(priority=self.req.priority, timeout_s=remaining)
        await lease.__aenter__()
        t.admitted = p.clock.now()
        body = self._body()
        tried: set[str] = set()
        last: _Retry | None = None
        stale = lease.wait_s > 0  # waited for a slot: route on the state of now, not of arrival
        while True:
            if stale:
                snaps = p.registry.snapshots()
            stale = True
            candidates = [s for s in lease.eligible(self._serving(snaps)) if s.url not in tried]
            if not candidates and last is not None:
                err, last = last.error, None  # no frame -> _Retry -> error -> frame cycle keeps buffers alive
                raise err
            try:
                decision = p.policy.select(self.route, candidates)
            except NoWorkerAvailable:
                raise NoHealthyWorker("no healthy worker can take the request", retry_after=1.0) from None
            if decision.after is not None:
                p.metrics.inc(p.metrics.decisions, p.policy.name, decision.branch)
                if await self._hold(decision.after, decision.hold_s) == "timed_out":
                    # Stop holding anyone for it: a peer that went away never says it is done.
                    p.policy.on_peer_prefilled(decision.worker, decision.after)
                self.route = dataclasses.replace(self.route, held=True)
                continue
            lease.assign(decision.worker)
            self.worker, self.decision = decision.worker, decision
            for listener in p.route_listeners:
                listener.routed(decision.worker, self.route, decision.matched_blocks, self.rid)
            p.metrics.inc(p.metrics.decisions, p.policy.name, decision.branch)
            t.dispatched = p.clock.now()
            try:
                await self._attempt(decision.worker, body)
                return
            except _Retry as r:
                p.metrics.inc(p.metrics.upstream_failures, decision.worker, r.cause, worker=decision.worker)
                if r.sick:
                    self._report_sick(decision.worker)
                tried.add(decision.worker)
                last = r
                if len(tried) > cfg.upstream.max_retries:
                    last = None  # (see above: the cycle would hold the failed attempt's buffers until a GC pass)
                    raise r.error from None
                self.retries += 1
                p.metrics.inc(p.metrics.retries, r.cause)

    async def _hold(self, key: Hashable, hold_s: float | None) -> str:
        """Wait for the prefill ``key`` names, at most ``routing.hold_max_s``, ``hold_s`` (what the
        policy says the hold is worth) and the deadline; "released" or "timed_out"."""
        p = self.p
        start = p.clock.now()
        limit = hold_limit(p.config.routing.hold_max_s, hold_s, self._deadline - start)
        if limit <= 0:
            return "timed_out"
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = p._holds.setdefault(key, [])
        waiting.append(fut)
        outcome = "timed_out"
        try:
            await asyncio.wait_for(fut, limit)
            outcome = "released"
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            if fut in waiting:  # timed out or cancelled: no longer held for it
                waiting.remove(fut)
                if not waiting and p._holds.get(key) is waiting:
                    del p._holds[key]
            held = p.clock.now() - start
            self.timing.prefix_hold += held
            p.metrics.observe(p.metrics.prefix_hold, held, outcome)
        return outcome

    def _report_sick(self, worker: str) -> None:
        if self.p.registry.report_request(worker, False) is Change.EJECTED:
            self.p.metrics.inc(self.p.metrics.ejections, worker, worker=worker)

    def _body(self) -> bytes:
        return body_with_rid(self.req, None if self.req.rid else self.rid, ask_usage=self._hide_usage)

    async def _attempt(self, worker: str, body: bytes) -> None:
        p, t = self.p, self.timing
        cfg = p.config.upstream
        loop = asyncio.get_running_loop()
        started = p.clock.now()
        remaining = self._deadline - started
        # A non-stream answer's first byte is its last: its wait is the request's whole deadline, and
        # a check on the worker every first_byte_timeout_s tells a long answer from a hung worker.
        whole = not self.req.stream
        wait = remaining if whole else min(cfg.first_byte_timeout_s, remaining)
        headers = {"Content-Type": "application/json"}
        auth = p.upstream_authorization(self.req.headers.get("authorization"))
        if auth:
            headers["Authorization"] = auth
        resp: Http1Connection | None = None
        check: asyncio.Task[bool] | None = None
        try:
            async with asyncio.timeout_at(loop.time() + max(0.0, wait)) as scope:
                if whole:
                    check = loop.create_task(self._check_on(worker, scope))
                resp = await p.upstream.post(worker, self.req.dialect.path, body, headers)
                t.upstream_headers = p.clock.now()
                status = resp.status
                # One judge of every answer (workers/answers.py): what it is, or BadAnswer → 502 + retry.
                kind = judge_head(status, resp.content_type, resp.headers, stream=self.streaming)
                if kind is Kind.BUSY or kind is Kind.FAILED:
                    await resp.read()
                    p.upstream.release(resp)  # read to the end: the connection stays reusable
                    resp = None
                    busy = kind is Kind.BUSY
                    err: RadixgateError = (
                        Overloaded(f"every worker tried is busy (last answered {status})", retry_after=1.0)
                        if busy else UpstreamError(f"worker answered HTTP {status}"))
                    raise _Retry("worker_busy" if busy else "http_5xx", err, sick=not busy)
                if kind is not Kind.STREAM:
                    answer = await resp.read()
                    doc = judge_body(answer, resp.content_type) if kind is Kind.BODY else None
                    self.streaming = False
                    self.content_type = resp.content_type or "application/json"
                    if kind is Kind.CLIENT_ERROR:
                        answer, self.content_type = client_error_body(status, answer, resp.content_type), \
                            "application/json"
                    self.status, self.body = status, answer
                    t.first_byte = p.clock.now()
                    p.upstream.release(resp)
                    self._upstream_done = True
                    if doc is not None:
                        self.meta = meta_from(self.req.dialect, doc)
                    return
                self.status, self.content_type = status, resp.content_type
                self._resp = resp
                first = await self._next_events()
                if not first:
                    raise _Retry("stream_broken", UpstreamError("worker closed the stream before any output"),
                                 sick=True)
                check_events(first)
                if first.startswith(b'data: {"error"') and _busy_error(first):
                    # SGLang opens a stream, then aborts a request its full queue cannot take.
                    raise _Retry("worker_busy", Overloaded("every worker tried is busy (queue full)",
                                                           retry_after=1.0), sick=False)
                self._first, self._first_at = first, p.clock.now()
                t.first_byte = self._first_at
        except TimeoutError as e:
            self._drop(resp)
            self._abort(worker)  # it may be generating (or hung): free its slot
            hung = check is not None and check.done() and not check.cancelled() and check.result()
            if hung:
                raise _Retry("timeout", UpstreamTimeout(
                    f"worker failed its health check with no answer after {p.clock.now() - started:.3g} s"),
                    sick=True) from None
            if isinstance(e, UpstreamIdle):  # its head came, then silence: nothing reached the client yet
                raise _Retry("timeout", UpstreamTimeout(str(e)), sick=True) from None
            if whole or wait < cfg.first_byte_timeout_s:  # the request's own deadline ran out: no time to retry
                p.metrics.inc(p.metrics.upstream_failures, worker, "timeout", worker=worker)
                raise UpstreamTimeout(f"no answer within the request's deadline ({self._total:.3g} s: "
                                      "upstream.total_timeout_s or the caller's own timeout)") from None
            raise _Retry("timeout", UpstreamTimeout(  # nothing reached the client yet
                f"worker sent nothing within {wait:.3g} s (upstream.first_byte_timeout_s)"), sick=True) from None
        except (BadAnswer, MalformedEvent, UpstreamProtocolError) as e:
            self._drop(resp)
            cause = e.cause if isinstance(e, BadAnswer) else "too_large" if isinstance(
                e, ResponseTooLarge) else "protocol_error" if isinstance(e, UpstreamProtocolError) else "bad_answer"
            raise _Retry(cause, UpstreamError(str(e)), sick=True) from None
        except UpstreamClosed as e:
            if resp is None:  # before its head: as a refused connection (the worker is going away)
                raise _Retry("connect_error", NoHealthyWorker(f"worker connection failed: {e!r}", retry_after=1.0),
                             sick=True) from None
            self._drop(resp)
            raise _Retry("stream_broken", UpstreamError(f"the worker closed the connection mid-answer: {e}"),
                         sick=True) from None
        except CONNECT_ERRORS as e:
            self._drop(resp)
            # When every worker tried refused or dropped the connection, none is up: 503 + Retry-After.
            raise _Retry("connect_error", NoHealthyWorker(f"worker connection failed: {e!r}", retry_after=1.0),
                         sick=True) from None
        except _Retry:
            self._drop(resp)
            raise
        except asyncio.CancelledError:
            if resp is not None and self._resp is None:
                self._resp = resp  # the client left while we read an answer: _end closes, frees, aborts
            elif resp is None:  # the client left while a non-stream answer was being generated
                self._abort(worker)
            raise
        finally:
            if check is not None:
                check.cancel()

    async def _check_on(self, worker: str, scope: asyncio.Timeout) -> bool:
        """Every ``first_byte_timeout_s`` while a non-stream answer is owed, probe the worker's health
        endpoint; on a failed probe end the wait (``scope``) at once and return True (hung)."""
        p = self.p
        every = p.config.upstream.first_byte_timeout_s
        probe_s = min(p.config.health.timeout_s, every)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(every)
            alive = await asyncio.shield(p.worker_alive(worker, probe_s))  # shared: a waiter leaving spares it
            p.metrics.inc(p.metrics.long_answer_checks, worker, "alive" if alive else "hung", worker=worker)
            if not alive:
                scope.reschedule(loop.time())
                return True

    def _abort(self, worker: str) -> None:
        self.p.upstream.abort(worker, self.rid)
        self.p.metrics.inc(self.p.metrics.aborts, worker, worker=worker)

    def _drop(self, resp: Http1Connection | None) -> None:
        if resp is not None:
            resp.close()
            self.p.upstream.release(resp)
        self._resp = None
        self._buf.clear()  # a failed attempt's partial event: freed now, whoever still holds the list

    async def _next_events(self) -> bytes:
        """The next run of complete SSE events; b"" at the end (a trailing partial event is dropped).

        A partial event waits in pieces (joined once, when its blank line comes: no copy per read),
        at most ``upstream.max_event_bytes`` of it: beyond, ``MalformedEvent``."""
        assert self._resp is not None
        read = self._resp.readany
        pending = self._buf
        while True:
            data = await read()
            if not data:
                return b""
            if pending:
                if b"\n\n" not in data and not (data[:1] == b"\n" and pending[-1].endswith(b"\n")):
                    pending.append(data)
                    self._buf_len += len(data)
                    self._check_partial()
                    continue
                data = b"".join(pending) + data
                pending.clear()
            cut = data.rfind(b"\n\n") + 2
            if cut == 1:
                pending.append(data)
                self._buf_len = len(data)
                self._check_partial()
                continue
            self._buf_len = len(data) - cut
            if self._buf_len:
                pending.append(data[cut:])
                self._check_partial()
                data = data[:cut]
            return data

    def _check_partial(self) -> None:
        limit = self.p.config.upstream.max_event_bytes
        if self._buf_len > limit:
            self._buf.clear()  # freed at once, not when the exception's frames are
            raise MalformedEvent(f"the worker sent an event of more than {limit} bytes without its end "
                                 "(upstream.max_event_bytes)")

    # -- consume ------------------------------------------------------------------------------------
    def chunks(self) -> AsyncIterator[bytes]:
        """Complete SSE events as raw bytes, as they arrive; ends after ``[DONE]`` or an error event."""
        if self._gen is None:
            self._gen = self._relay()
        return self._gen

    @property
    def last_chunk(self) -> bool:
        """Whether the chunk ``chunks()`` just yielded is the stream's last (``[DONE]`` or an error event),
        so a frontend can send it together with the end of its response (one write, not two)."""
        return self._acct.done or self._acct.error is not None or self.error is not None

    async def _relay(self) -> AsyncGenerator[bytes, None]:
        p, t, acct = self.p, self.timing, self._acct
        data, now = self._first, self._first_at
        self._first = b""
        err: RadixgateError
        # The deadline is the clock's, not the events': a worker dribbling a byte at a time never
        # completes an event, so one timer ends the stream at its deadline whatever arrives.
        loop = asyncio.get_running_loop()
        assert self._resp is not None
        resp = self._resp
        deadline = loop.call_at(loop.time() + max(0.0, self._deadline - p.clock.now()), resp.fail, TimeoutError())
        try:
            while data:
                first = False
                if acct.feed(data):
                    first = t.first_token is None
                    t.mark_token(now)
                if self._hide_usage:
                    data = drop_usage_events(data)  # counted above; the caller did not ask for it
                if acct.done or acct.error is not None:
                    data = until_end(data)
                if data:
                    yield data
                if first:  # after the client has its first token, not before
                    self._first_token(data)
                if acct.done or acct.error is not None:
                    break
                data = await self._next_events()
                if data:
                    check_events(data)
                now = p.clock.now()
                if now > self._deadline:
                    raise TimeoutError
            self._upstream_done = True
            if acct.done or acct.error is not None:
                self.meta = acct.final()
                return
            err = UpstreamError("the worker closed the stream before it finished")
        except UpstreamIdle as e:
            err = UpstreamTimeout(str(e))
        except TimeoutError:
            err = UpstreamTimeout(f"the stream ran past the request's deadline ({self._total:.3g} s: "
                                  "upstream.total_timeout_s or the caller's own timeout)")
        except (MalformedEvent, UpstreamProtocolError) as e:
            resp.close()  # what follows a malformed event is not worth reading
            err = UpstreamError(f"the worker's stream broke: {e}")
        except CONNECT_ERRORS as e:
            err = UpstreamError(f"the worker connection broke mid-stream: {e!r}")
        finally:
            deadline.cancel()
        self._upstream_done = False
        self.meta = acct.final()
        assert self.worker is not None
        if self._cut is not None:  # we closed it ourselves: not the worker's failure
            err = self._cut
        else:
            p.metrics.inc(p.metrics.upstream_failures, self.worker,
                          "timeout" if isinstance(err, UpstreamTimeout) else "stream_broken", worker=self.worker)
            if not isinstance(err, UpstreamTimeout):
                self._report_sick(self.worker)
        self.error = err
        yield error_event(err)

    def _first_token(self, data: bytes) -> None:
        """The prompt is prefilled and in the worker's cache: tell the policy now, not at the end."""
        p = self.p
        if self.worker is None or self.route is None:
            return
        if not isinstance(p.policy, IgnoresFeedback):  # the others learn nothing from the counts
            prompt_tokens, cached_tokens = first_token_counts(self.req.dialect, data)
            p.policy.on_first_token(FirstToken(self.worker, self.route, prompt_tokens, cached_tokens))
        if p._holds:
            p.prefilled(id(self.route))
        for listener in p.route_listeners:
            listener.prefilled(self.worker, self.rid)

    async def events(self) -> AsyncIterator[TextDelta | ErrorEvent | Finished]:
        """Typed events of the answer, then ``Finished`` (the gRPC frontend's view)."""
        async for run in self.event_runs():
            for event in run:
                yield event

    async def event_runs(self) -> AsyncIterator[list[TextDelta | ErrorEvent | Finished]]:
        """``events()`` grouped by what arrived together, so a frontend can send one message per group
        (fewer writes when the worker outpaces the client, never a wait). The stream's last run comes
        with ``Finished``, which needs no further read."""
        decoder = EventDecoder(self.req.dialect)
        last: list[TextDelta | ErrorEvent | Finished] = []
        if self.streaming:
            async for data in self.chunks():
                try:
                    run: list[TextDelta | ErrorEvent | Finished] = [*decoder.decode(data)]
                except ValueError as e:
                    err = self.broken_event(e)
                    last = [ErrorEvent(err.message, err.status)]
                    break
                if self._acct.done or self._acct.error is not None:
                    last = run
                elif run:
                    yield run
        elif self.status != 200:
            try:
                found = decoder.decode_object(safejson.loads(self.body))
            except ValueError:
                found = []
            last = [next((e for e in found if isinstance(e, ErrorEvent)),
                         ErrorEvent(self.body.decode(errors="replace")[:500], self.status))]
        else:
            try:
                last = [*decoder.decode_object(safejson.loads(self.body))]
            except ValueError as e:
                err = self.broken_event(e)
                last = [ErrorEvent(err.message, err.status)]
        assert self.worker is not None
        yield [*last, Finished(self.meta, self.worker, self.rid, self.timing)]

    def broken_event(self, e: ValueError) -> RadixgateError:
        """A frontend decoding the answer found what it cannot read (an event that is not JSON, token
        ids that are not integers): the request failed, as the worker's fault (502)."""
        if self.error is None:
            self.error = UpstreamError(f"the worker's answer is malformed: {str(e)[:200]}")
            if self.worker is not None:
                self.p.metrics.inc(self.p.metrics.upstream_failures, self.worker, "bad_answer", worker=self.worker)
        return self.error

    # -- record -------------------------------------------------------------------------------------
    async def _end(self, exc: BaseException | None) -> None:
        if self._ended:
            return
        self._ended = True
        p, t = self.p, self.timing
        t.done = p.clock.now()
        if self._gen is not None:
            await self._gen.aclose()
        left_early = not self._upstream_done and self._resp is not None
        if self._resp is not None:
            if left_early:
                self._resp.close()
            p.upstream.release(self._resp)
        if left_early and not isinstance(self.error, UpstreamError) and self.worker is not None:
            # The client left, or the stream went silent: free the worker's slot. (A worker whose
            # connection broke has nothing left to abort.)
            self._abort(self.worker)
        lease = self._lease
        if lease is not None:
            lease.release()
        outcome, cause = self._outcome(exc)
        m = self.meta
        t.prompt_tokens, t.cached_tokens, t.completion_tokens = m.prompt_tokens, m.cached_tokens, m.completion_tokens
        t.worker_queue_time, t.worker_first_token_latency = m.queue_time, m.first_token_latency
        t.worker_e2e_latency = m.e2e_latency
        if outcome == "ok" and self.route is not None and self.route.prompt_bytes:
            p.token_estimate.observe(self.route.model, self.route.prompt_bytes, m.prompt_tokens)
        if self.worker is not None and self.route is not None:
            p.policy.on_complete(Completion(
                self.worker, self.route, outcome == "ok", m.prompt_tokens, m.cached_tokens, t.upstream_ttft))
            if p._holds:  # ended without a first token (failed, not streamed): stop holding for it
                p.prefilled(id(self.route))
        status = exc.status if isinstance(exc, RadixgateError) else (499 if outcome == "cancelled" else self.status)
        p._record(CompletedRequest(
            rid=self.rid, frontend=self.req.frontend, dialect=self.req.dialect.value, stream=self.req.stream,
            worker=self.worker, status=status, outcome=outcome, cause=cause, retries=self.retries,
            policy=p.policy.name, decision=self.decision, route=self.route,
            admission=lease.outcome.value if lease is not None and lease.outcome else None,
            admission_wait=lease.wait_s if lease is not None and lease.outcome else None,
            timing=t, finish_reason=m.finish_reason))
        p.active -= 1
        p._live.discard(self)
        if p.active == 0:
            p._idle.set()

    def _outcome(self, exc: BaseException | None) -> tuple[str, str | None]:
        if isinstance(exc, RadixgateError):
            return "error", exc.cause
        if isinstance(exc, asyncio.CancelledError | ConnectionError):  # the client went away
            return "cancelled", "client_disconnect"
        if exc is not None:
            return "error", "internal"
        if self.error is not None:
            return "error", self.error.cause
        if not self._upstream_done and self.streaming:
            return "cancelled", "client_disconnect"
        if self.meta.error is not None:
            return "error", "upstream_error"
        if self.status >= 400:
            return "error", "upstream_rejected"
        return "ok", None


def hold_limit(hold_max_s: float, hold_s: float | None, remaining_s: float) -> float:
    """The longest a hold may wait: ``routing.hold_max_s``, the decision's ``hold_s`` (None = no
    bound of its own) and the time left before the request's deadline."""
    return min(hold_max_s, remaining_s) if hold_s is None else min(hold_max_s, hold_s, remaining_s)


def not_served(model: str, served: Sequence[str], *, show: int = 8) -> str:
    """The 404 message: bounded whatever the caller sent or the fleet serves (200k models, a 1 MB name)."""
    name = model if len(model) <= 100 else model[:100] + "..."
    more = f" and {len(served) - show} more" if len(served) > show else ""
    return f"model {name!r} is not served here (serving: {', '.join(m[:100] for m in served[:show])}{more})"


def _busy_error(first: bytes) -> bool:
    """Whether a stream's first event is a 503 error (queue full / starting): safe to retry."""
    for event in first.split(b"\n\n"):
        if event.startswith(b"data: "):
            try:
                err = safejson.loads(event[6:]).get("error") or {}
            except (ValueError, AttributeError):
                return False
            return isinstance(err, dict) and 503 in (err.get("code"), err.get("status_code"))
    return False
