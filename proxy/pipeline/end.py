"""The end of an exchange: its outcome, what the policy and the estimates learn, its record.

Runs once per request, after the relay closed and the admission lease was released: the
worker-reported counts go on the timing, a successful text prompt teaches the bytes-per-token
estimate, the policy hears ``on_complete`` (and requests held for this prefill stop waiting, if
no first token released them), and one ``CompletedRequest`` goes to ``Parts.record`` (metrics,
the JSON log line, observers such as the diagnosis).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from proxy.admission import Lease
from proxy.errors import RadixgateError
from proxy.pipeline.parts import Parts
from proxy.records import CompletedRequest, is_batch
from proxy.request import GenerateRequest
from proxy.routing.base import Completion, Decision, RouteRequest
from proxy.sse import FinalMeta
from proxy.timing import RequestTiming


@dataclass(slots=True, eq=False)
class Ending:
    """What the exchange knows when it ends."""

    exc: BaseException | None  # what left the ``async with`` (None: a normal end)
    error: RadixgateError | None  # a stream that broke after relaying began, or an undecodable answer
    answered: bool  # the worker's answer ended (a whole answer, or a stream's [DONE] / error event)
    streaming: bool
    status: int  # the worker's HTTP status (0: none)
    meta: FinalMeta


def outcome(e: Ending) -> tuple[str, str | None]:
    """(outcome, cause): ok | error | cancelled, and the cause label of an error."""
    exc = e.exc
    if isinstance(exc, RadixgateError):
        return "error", exc.cause
    if isinstance(exc, asyncio.CancelledError | ConnectionError):  # the client went away
        return "cancelled", "client_disconnect"
    if exc is not None:
        return "error", "internal"
    if e.error is not None:
        return "error", e.error.cause
    if not e.answered and e.streaming:
        return "cancelled", "client_disconnect"
    if e.meta.error is not None:
        return "error", "upstream_error"
    if e.status >= 400:
        return "error", "upstream_rejected"
    return "ok", None


def finish(parts: Parts, e: Ending, *, req: GenerateRequest, rid: str, timing: RequestTiming,
           worker: str | None, decision: Decision | None, route: RouteRequest | None, retries: int,
           lease: Lease | None, dp_rank: int | None = None) -> None:
    result, cause = outcome(e)
    m, t = e.meta, timing
    t.prompt_tokens, t.cached_tokens, t.completion_tokens = m.prompt_tokens, m.cached_tokens, m.completion_tokens
    t.worker_queue_time, t.worker_first_token_latency = m.queue_time, m.first_token_latency
    t.worker_e2e_latency = m.e2e_latency
    # Routing learns tokens from answers about the prompt it keyed on: a batch's (or n samples')
    # counts are summed over several prompts, and would teach a bytes-per-token several times too
    # few and an index cached tokens its routed prompt does not have. The counters keep the sums.
    own = m.parts <= 1 and not is_batch(req)
    if result == "ok" and route is not None and route.prompt_bytes and own:
        parts.token_estimate.observe(route.model, route.prompt_bytes, m.prompt_tokens)
    if worker is not None and route is not None:
        parts.policy.on_complete(Completion(
            worker, route, result == "ok", m.prompt_tokens if own else None, m.cached_tokens if own else None,
            t.upstream_ttft, m.completion_tokens, t.decode))
        if parts.holds:  # ended without a first token (failed, not streamed): stop holding for it
            parts.holds.release(id(route))
        for listener in parts.route_listeners:
            listener.finished(worker, rid)
    exc = e.exc
    status = exc.status if isinstance(exc, RadixgateError) else (499 if result == "cancelled" else e.status)
    admission = lease.outcome if lease is not None else None  # None: refused before admission was asked
    parts.record(CompletedRequest(
        rid=rid, frontend=req.frontend, dialect=req.dialect.value, stream=req.stream,
        worker=worker, status=status, outcome=result, cause=cause, retries=retries,
        policy=parts.policy.name, decision=decision, route=route,
        admission=admission.value if admission is not None else None,
        admission_wait=lease.wait_s if admission is not None and lease is not None else None,
        timing=t, finish_reason=m.finish_reason, trace=req.trace, dp_rank=dp_rank, summed=not own))
