"""One attempt: send the request to one worker and wait for an answer worth relaying.

Returns a ``Whole`` non-stream answer, or an ``Opened`` stream whose first complete events
arrived — nothing has reached the client yet, so any failure before that is a ``Retry`` (the
exchange may move the request to another worker). Until the first byte:

* a connect error, a 5xx, a 503 (queue full / starting, or a stream that opens with a 503 error
  event) is a ``Retry``; a refused connection reads as 503, a busy worker as 429-like Overloaded;
* every answer is judged (``workers/answers.py``, ``sse_frames.check_events``); a bad one, a protocol
  error or a breach of a size cap is a 502, retried like a 5xx;
* a stream waits at most ``upstream.first_byte_timeout_s`` (a ``Retry``) and never past the
  request's deadline (final: no time left to retry);
* a non-stream answer arrives whole, so no silence tells a hung worker from a long generation:
  every ``first_byte_timeout_s`` the worker's health probe decides (passing: keep waiting;
  failing: end the wait at once, a ``Retry``).

All waits are on the injected clock. The attempt owns its answer until it returns it: on any
failure or cancellation it closes (or returns) the connection and aborts what the worker may
still be generating.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy import safejson
from proxy.clock import Deadline
from proxy.errors import NoHealthyWorker, Overloaded, RadixgateError, UpstreamError, UpstreamTimeout
from proxy.pipeline.events import EventReader
from proxy.pipeline.parts import Parts
from proxy.pipeline.transport import Answer
from proxy.request import GenerateRequest
from proxy.sse import FinalMeta, meta_from
from proxy.sse_frames import MalformedEvent, check_events
from proxy.timing import RequestTiming
from proxy.workers.answers import BadAnswer, Kind, client_error_body, judge_body, judge_head
from proxy.workers.http1 import ResponseTooLarge, UpstreamClosed, UpstreamIdle, UpstreamProtocolError
from proxy.workers.upstream import CONNECT_ERRORS


class Retry(Exception):
    """This worker failed before anything reached the client: ``cause`` (metric label), the error
    the client gets if no other worker does better, and whether the worker counts as sick."""

    def __init__(self, cause: str, error: RadixgateError, *, sick: bool) -> None:
        super().__init__(error.message)
        self.cause, self.error, self.sick = cause, error, sick


@dataclass(slots=True, eq=False)
class Whole:
    """A non-stream answer, read whole (its connection already returned)."""

    status: int
    content_type: str
    body: bytes
    meta: FinalMeta | None


@dataclass(slots=True, eq=False)
class Opened:
    """A stream whose first complete events arrived; the relay owns it from here."""

    status: int
    content_type: str
    answer: Answer
    reader: EventReader
    first: bytes
    first_at: float


@dataclass(slots=True, eq=False)
class Target:
    """What one attempt sends, and by when it must be answered."""

    req: GenerateRequest
    rid: str
    body: bytes
    deadline: float  # on the clock
    total_s: float  # the request's whole budget (for messages)


async def attempt(parts: Parts, target: Target, worker: str, timing: RequestTiming) -> Whole | Opened:
    clock, cfg = parts.clock, parts.config.upstream
    req = target.req
    started = clock.now()
    remaining = target.deadline - started
    # A non-stream answer's first byte is its last: its wait is the request's whole deadline, and
    # a check on the worker every first_byte_timeout_s tells a long answer from a hung worker.
    whole = not req.stream
    wait = remaining if whole else min(cfg.first_byte_timeout_s, remaining)
    headers = {"Content-Type": "application/json"}
    auth = parts.upstream_authorization(req.headers.get("authorization"))
    if auth:
        headers["Authorization"] = auth
    if req.trace is not None:  # the caller's trace context, or radixgate's span in it (proxy/tracecontext.py)
        headers.update(req.trace.headers())
    resp: Answer | None = None
    reader: EventReader | None = None
    check: asyncio.Task[bool] | None = None
    try:
        async with clock.timeout_at(started + max(0.0, wait)) as scope:
            if whole:
                check = asyncio.get_running_loop().create_task(_check_on(parts, worker, scope))
            resp = await parts.transport.post(worker, req.dialect.path, target.body, headers)
            timing.upstream_headers = clock.now()
            status = resp.status
            # One judge of every answer (workers/answers.py): what it is, or BadAnswer → 502 + retry.
            kind = judge_head(status, resp.content_type, resp.headers, stream=req.stream)
            if kind is Kind.BUSY or kind is Kind.FAILED:
                await resp.read()
                resp.release()  # read to the end: the connection stays reusable
                resp = None
                busy = kind is Kind.BUSY
                err: RadixgateError = (
                    Overloaded(f"every worker tried is busy (last answered {status})", retry_after=1.0)
                    if busy else UpstreamError(f"worker answered HTTP {status}"))
                raise Retry("worker_busy" if busy else "http_5xx", err, sick=not busy)
            if kind is not Kind.STREAM:
                answer = await resp.read()
                doc = judge_body(answer, resp.content_type) if kind is Kind.BODY else None
                content_type = resp.content_type or "application/json"
                if kind is Kind.CLIENT_ERROR:
                    answer, content_type = client_error_body(status, answer, resp.content_type), "application/json"
                timing.first_byte = clock.now()
                resp.release()
                resp = None
                return Whole(status, content_type, answer, None if doc is None else meta_from(req.dialect, doc))
            reader = EventReader(resp, cfg.max_event_bytes)
            first = await reader.next_run()
            if not first:
                raise Retry("stream_broken", UpstreamError("worker closed the stream before any output"), sick=True)
            check_events(first)
            if first.startswith(b'data: {"error"') and busy_error(first):
                # SGLang opens a stream, then aborts a request its full queue cannot take.
                raise Retry("worker_busy", Overloaded("every worker tried is busy (queue full)", retry_after=1.0),
                            sick=False)
            timing.first_byte = first_at = clock.now()
            opened = Opened(status, resp.content_type, resp, reader, first, first_at)
            resp = None  # the relay's now
            return opened
    except TimeoutError as e:
        _drop(resp, reader)
        if req.dialect.abortable:
            parts.abort(worker, target.rid)  # it may be generating (or hung): free its slot
        hung = check is not None and check.done() and not check.cancelled() and check.result()
        if hung:
            raise Retry("timeout", UpstreamTimeout(
                f"worker failed its health check with no answer after {clock.now() - started:.3g} s"),
                sick=True) from None
        if isinstance(e, UpstreamIdle):  # its head came, then silence: nothing reached the client yet
            raise Retry("timeout", UpstreamTimeout(str(e)), sick=True) from None
        if whole or wait < cfg.first_byte_timeout_s:  # the request's own deadline ran out: no time to retry
            parts.metrics.inc(parts.metrics.upstream_failures, worker, "timeout", worker=worker)
            raise UpstreamTimeout(f"no answer within the request's deadline ({target.total_s:.3g} s: "
                                  "upstream.total_timeout_s or the caller's own timeout)") from None
        raise Retry("timeout", UpstreamTimeout(  # nothing reached the client yet
            f"worker sent nothing within {wait:.3g} s (upstream.first_byte_timeout_s)"), sick=True) from None
    except (BadAnswer, MalformedEvent, UpstreamProtocolError) as e:
        _drop(resp, reader)
        cause = e.cause if isinstance(e, BadAnswer) else "too_large" if isinstance(
            e, ResponseTooLarge) else "protocol_error" if isinstance(e, UpstreamProtocolError) else "bad_answer"
        raise Retry(cause, UpstreamError(str(e)), sick=True) from None
    except UpstreamClosed as e:
        if resp is None:  # before its head: as a refused connection (the worker is going away)
            raise Retry("connect_error", NoHealthyWorker(f"worker connection failed: {e!r}", retry_after=1.0),
                        sick=True) from None
        _drop(resp, reader)
        raise Retry("stream_broken", UpstreamError(f"the worker closed the connection mid-answer: {e}"),
                    sick=True) from None
    except CONNECT_ERRORS as e:
        _drop(resp, reader)
        # When every worker tried refused or dropped the connection, none is up: 503 + Retry-After.
        raise Retry("connect_error", NoHealthyWorker(f"worker connection failed: {e!r}", retry_after=1.0),
                    sick=True) from None
    except Retry:
        _drop(resp, reader)
        raise
    except asyncio.CancelledError:
        # The client left while we waited for (or read) an answer: close it, free the worker's slot.
        _drop(resp, reader)
        if req.dialect.abortable:
            parts.abort(worker, target.rid)
        raise
    finally:
        if check is not None:
            check.cancel()


async def _check_on(parts: Parts, worker: str, scope: Deadline) -> bool:
    """Every ``first_byte_timeout_s`` while a non-stream answer is owed, probe the worker's health
    endpoint; on a failed probe end the wait (``scope``) at once and return True (hung)."""
    every = parts.config.upstream.first_byte_timeout_s
    probe_s = min(parts.config.health.timeout_s, every)
    while True:
        await parts.clock.sleep(every)
        alive = await asyncio.shield(parts.health_checks.alive(worker, probe_s))  # shared: a waiter leaving spares it
        parts.metrics.inc(parts.metrics.long_answer_checks, worker, "alive" if alive else "hung", worker=worker)
        if not alive:
            scope.expire()
            return True


def _drop(resp: Answer | None, reader: EventReader | None) -> None:
    if resp is not None:
        resp.close()
        resp.release()
    if reader is not None:
        reader.clear()  # a failed attempt's partial event: freed now, whoever still holds it


def busy_error(first: bytes) -> bool:
    """Whether a stream's first event is a 503 error (queue full / starting): safe to retry."""
    for event in first.split(b"\n\n"):
        if event.startswith(b"data: "):
            try:
                err = safejson.loads(event[6:]).get("error") or {}
            except (ValueError, AttributeError):
                return False
            return isinstance(err, dict) and 503 in (err.get("code"), err.get("status_code"))
    return False
