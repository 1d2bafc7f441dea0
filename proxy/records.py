"""The records the pipeline hands out, and the body it forwards.

``CompletedRequest`` — one finished request, as metrics, the request log line and observers
(diagnosis) see it. ``Finished`` — the last item of ``Exchange.events()``. ``body_with_rid`` — the
bytes sent to the worker: the caller's own, with a ``rid`` (Responses: ``request_id``) spliced in
when they gave none (and
``include_usage`` on an OpenAI stream that did not ask for it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import Decision, RouteRequest
from proxy.sse import FinalMeta
from proxy.timing import RequestTiming
from proxy.tracecontext import TraceContext


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
    # The request's W3C trace context as passed on to the worker (proxy/tracecontext.py); None without one.
    trace: TraceContext | None = None
    # The data-parallel rank of ``worker`` it was sent to, where radixgate named one (routing.dp_ranks).
    dp_rank: int | None = None
    # Its token counts are several prompts' (a batch, or n samples of one): the work done, which
    # the counters count, not the routed prompt's, which routing's own figures compare with.
    summed: bool = False


@dataclass(frozen=True, slots=True)
class Finished:
    """The last item of ``Exchange.events()``."""

    meta: FinalMeta
    worker: str
    rid: str
    timing: RequestTiming


def body_with_rid(req: GenerateRequest, rid: str | None, *, ask_usage: bool = False) -> bytes:
    """The bytes to forward: the caller's own, with ``"rid"`` spliced in when ``rid`` is given, and
    ``"stream_options": {"include_usage": true}`` when ``ask_usage`` (an OpenAI stream whose caller
    did not ask for usage: the token counters need it; ``wants_usage_hidden``).

    Batches (several prompts) take a list of rids; they get none. A key the caller already sent
    (their own ``stream_options``) is merged and the body re-serialised: a spliced duplicate key
    would leave which one a worker reads to its JSON parser.
    """
    raw = req.body or json.dumps(req.payload, separators=(",", ":")).encode()
    add: dict[str, Any] = {}
    if rid is not None and not is_batch(req):
        add[req.dialect.rid_field] = rid
    if ask_usage:
        opts = req.payload.get("stream_options")
        add["stream_options"] = {"include_usage": True}
        if isinstance(opts, dict):
            # Usage per chunk needs include_usage too: a caller who asked for it alone got none.
            add["stream_options"] = {**opts, "include_usage": True} | (
                {"continuous_usage_stats": False} if "continuous_usage_stats" in opts else {})
    if not add:
        return raw
    if req.body and not add.keys() & req.payload.keys():
        i = raw.index(b"{") + 1  # splice: the caller's bytes stay as they were
        head = b"".join(json.dumps(k).encode() + b":" + json.dumps(v, separators=(",", ":")).encode() + b","
                        for k, v in add.items())
        return raw[:i] + head + raw[i:]
    return json.dumps({**req.payload, **add}, separators=(",", ":")).encode()


def with_field(body: bytes, name: str, value: int) -> bytes:
    """``body`` (a JSON object's bytes, ``body_with_rid``'s) with ``name`` spliced in first; the caller
    checked the body has no such key."""
    i = body.index(b"{") + 1
    empty = body[i:].lstrip().startswith(b"}")
    return body[:i] + json.dumps(name).encode() + b":" + str(int(value)).encode() + (b"" if empty else b",") + body[i:]


def wants_usage_hidden(req: GenerateRequest) -> bool:
    """Whether this is an OpenAI stream whose caller did not ask for usage
    (``stream_options.include_usage``, off in the openai SDK by default): the pipeline asks the
    worker for it anyway (the token counters, the cache-hit numbers and routing learn from it) and
    drops the usage chunk from what the caller receives (``sse_frames.drop_usage_events``). A
    ``stream_options`` that is not an object is the caller's error, forwarded as sent."""
    if req.dialect in (Dialect.SGLANG, Dialect.RESPONSES, Dialect.MESSAGES) or not req.stream:
        return False  # native meta_info, response.completed and message_delta always carry usage
    opts = req.payload.get("stream_options")
    if opts is None:
        return True
    return isinstance(opts, dict) and opts.get("include_usage") is not True


def is_batch(req: GenerateRequest) -> bool:
    """A batch request (several prompts): it takes a list of rids, which we leave alone, and its
    answer's token counts are the batch's, not its first prompt's, which routing keyed on."""
    dialect, payload = req.dialect, req.payload
    if dialect in (Dialect.RERANK, Dialect.SCORE):
        return True  # one engine request per document or item, each prompt the query and it
    text, ids = payload.get("text"), payload.get("input_ids")
    # the prompt field of /v1/completions, or of /v1/embeddings and /v1/classify (Responses' ``input``
    # is a conversation)
    prompt = payload.get("input") if dialect in (Dialect.EMBEDDINGS, Dialect.CLASSIFY) else payload.get("prompt")
    return (isinstance(text, list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))
            or (isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)))
