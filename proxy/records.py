"""The records the pipeline hands out, and the body it forwards.

``CompletedRequest`` — one finished request, as metrics, the request log line and observers
(diagnosis) see it. ``Finished`` — the last item of ``Exchange.events()``. ``body_with_rid`` — the
bytes sent to the worker: the caller's own, with a ``rid`` spliced in when they gave none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.request import GenerateRequest
from proxy.routing.base import Decision, RouteRequest
from proxy.sse import FinalMeta
from proxy.timing import RequestTiming


@dataclass(frozen=True, slots=True)
class CompletedRequest:
    """One finished request, as metrics, the log line and observers see it."""

    rid: str
    frontend: str
    dialect: str
    stream: bool
    worker: str | None
    status: int
    outcome: str  # ok | error | cancelled
    cause: str | None
    retries: int
    policy: str
    decision: Decision | None
    route: RouteRequest | None
    admission: str | None
    admission_wait: float | None
    timing: RequestTiming
    finish_reason: str | None


@dataclass(frozen=True, slots=True)
class Finished:
    """The last item of ``Exchange.events()``."""

    meta: FinalMeta
    worker: str
    rid: str
    timing: RequestTiming


def body_with_rid(req: GenerateRequest, rid: str | None) -> bytes:
    """The bytes to forward: the caller's own, with ``"rid"`` spliced in when ``rid`` is given.

    Batches (several prompts) take a list of rids; they are forwarded unchanged.
    """
    raw = req.body or json.dumps(req.payload, separators=(",", ":")).encode()
    if rid is None or _is_batch(req.payload):
        return raw
    if req.body and "rid" not in req.payload:
        i = raw.index(b"{") + 1  # splice: the caller's bytes stay as they were
        return raw[:i] + b'"rid":' + json.dumps(rid).encode() + b"," + raw[i:]
    return json.dumps({**req.payload, "rid": rid}, separators=(",", ":")).encode()


def _is_batch(payload: dict[str, Any]) -> bool:
    """A batch request (several prompts) takes a list of rids; we leave those alone."""
    text, ids, prompt = payload.get("text"), payload.get("input_ids"), payload.get("prompt")
    return (isinstance(text, list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))
            or (isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)))
