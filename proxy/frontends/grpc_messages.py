"""Pure translation between radixgate.v1 protobuf messages and the proxy's own types.

Inbound, a ``radixgate.v1.GenerateRequest`` becomes the one ``GenerateRequest`` both frontends
produce:

* text or token ids → SGLang native ``/generate``: typed sampling fields become
  ``sampling_params`` (``seed`` → ``sampling_seed``), the ``extra_json`` object is merged into
  ``sampling_params``;
* chat messages → ``/v1/chat/completions``: typed fields become OpenAI body fields
  (``max_new_tokens`` → ``max_tokens``; SGLang's extensions ``top_k``, ``min_p``, … keep their
  names), the ``extra_json`` object is merged into the body.

``Generate`` streams upstream; ``GenerateUnary`` asks the worker for one whole answer, as an HTTP
non-stream request does: no per-token events to relay (a fraction of the CPU), and like HTTP's
non-stream answers its stage timings have no first token (ttft, itl, decode stay unset).

A key in ``extra_json`` that a typed field also sets is refused rather than silently overriding one
of the two. Every refusal is a ``BadRequest`` (→ INVALID_ARGUMENT) whose message names the field.

Outbound: stage timings, the final chunk and worker snapshots become their protobuf forms.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy import safejson
from proxy._proto.radixgate.v1 import admin_pb2, generate_pb2
from proxy.errors import BadRequest, PayloadTooLarge
from proxy.frontends.sampling import check_sampling
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import WorkerSnapshot
from proxy.sse import TextDelta

# Typed sampling fields (proto name → (native sampling_params key, OpenAI body key)).
_SCALAR_SAMPLING: dict[str, tuple[str, str]] = {
    "max_new_tokens": ("max_new_tokens", "max_tokens"),
    "temperature": ("temperature", "temperature"),
    "top_p": ("top_p", "top_p"),
    "top_k": ("top_k", "top_k"),
    "min_p": ("min_p", "min_p"),
    "frequency_penalty": ("frequency_penalty", "frequency_penalty"),
    "presence_penalty": ("presence_penalty", "presence_penalty"),
    "repetition_penalty": ("repetition_penalty", "repetition_penalty"),
    "ignore_eos": ("ignore_eos", "ignore_eos"),
    "seed": ("sampling_seed", "seed"),
}
_REPEATED_SAMPLING: dict[str, tuple[str, str]] = {
    "stop": ("stop", "stop"),
    "stop_token_ids": ("stop_token_ids", "stop_token_ids"),
}
# Dict keys back to the proto field the caller set (messages name what the caller wrote).
_PROTO_NAMES = {native: field for field, (native, _) in _SCALAR_SAMPLING.items()} | {
    openai: field for field, (_, openai) in _SCALAR_SAMPLING.items()}
# Body keys a chat request's extra_json may not replace: the frontend owns them.
_CHAT_RESERVED = frozenset({"model", "messages", "stream", "stream_options", "rid"})


def to_generate_request(
    msg: generate_pb2.GenerateRequest,
    *,
    timeout_s: float | None,
    max_prompt_chars: int,
    stream: bool = True,
) -> GenerateRequest:
    """Validate ``msg`` and build the pipeline's request (``stream``: ask the worker for a stream);
    raise ``BadRequest`` naming the field."""
    prompt = msg.WhichOneof("prompt")
    if prompt is None:
        raise BadRequest("prompt: set one of text, input_ids or chat")
    dialect = Dialect.CHAT if prompt == "chat" else Dialect.SGLANG
    sampling = _sampling(msg.sampling, chat=dialect is Dialect.CHAT) if msg.HasField("sampling") else {}
    extra = _extra(msg.sampling.extra_json) if msg.HasField("sampling") else {}
    clash = sorted(set(extra) & set(sampling))
    if clash:
        raise BadRequest(f"sampling.extra_json: {clash[0]!r} is also set by a typed field; set it once")
    rid = msg.request_id or None
    req = GenerateRequest(
        dialect=dialect,
        payload={},
        model=msg.model,
        stream=stream,
        rid=rid,
        session_key=msg.session_key if msg.HasField("session_key") else None,
        priority=msg.priority,
        frontend="grpc",
        timeout_s=timeout_s,
    )
    if prompt == "text":
        if not msg.text:
            raise BadRequest("text: the prompt is empty")
        _check_length("text", len(msg.text), max_prompt_chars)
        req.text = msg.text
        req.payload = {"text": msg.text}
    elif prompt == "input_ids":
        ids = list(msg.input_ids.ids)
        if not ids:
            raise BadRequest("input_ids.ids: the prompt is empty")
        if min(ids) < 0:
            raise BadRequest("input_ids.ids: token ids must be >= 0")
        _check_length("input_ids.ids", len(ids), max_prompt_chars)
        req.input_ids = ids
        req.payload = {"input_ids": ids}
    else:
        messages = _messages(msg.chat, max_prompt_chars)
        req.messages = messages
        reserved = sorted(set(extra) & _CHAT_RESERVED)
        if reserved:
            raise BadRequest(f"sampling.extra_json: {reserved[0]!r} is set by radixgate, not by extra_json")
        req.payload = {"messages": messages, **sampling, **extra, "stream": stream}
        if stream:
            req.payload["stream_options"] = {"include_usage": True}
        if msg.model:
            req.payload["model"] = msg.model
    if dialect is Dialect.SGLANG:
        req.payload["sampling_params"] = {**sampling, **extra}
        req.payload["stream"] = stream
    if rid is not None:
        req.payload["rid"] = rid
    return req


def _check_length(field: str, size: int, limit: int) -> None:
    if size > limit:
        raise PayloadTooLarge(f"{field}: the prompt has {size} characters or tokens, over the limit of {limit}")


def _messages(chat: generate_pb2.ChatMessages, max_prompt_chars: int) -> list[dict[str, Any]]:
    if not chat.messages:
        raise BadRequest("chat.messages: the conversation is empty")
    out: list[dict[str, Any]] = []
    total = 0
    for i, m in enumerate(chat.messages):
        if not m.role:
            raise BadRequest(f"chat.messages[{i}].role: must be set (system, user, assistant, ...)")
        total += len(m.content)
        out.append({"role": m.role, "content": m.content})
    _check_length("chat.messages", total, max_prompt_chars)
    return out


def _sampling(params: generate_pb2.SamplingParams, *, chat: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field, keys in _SCALAR_SAMPLING.items():
        if params.HasField(field):
            value = getattr(params, field)
            out[keys[1] if chat else keys[0]] = value
    for field, keys in _REPEATED_SAMPLING.items():
        values = list(getattr(params, field))
        if values:
            out[keys[1] if chat else keys[0]] = values
    # The same table HTTP requests are checked against (frontends/sampling.py), under the proto's names.
    check_sampling(out, "sampling.", names=_PROTO_NAMES)
    return out


def _extra(text: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = safejson.loads(text)
    except ValueError as e:
        raise BadRequest(f"sampling.extra_json: not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise BadRequest(f"sampling.extra_json: must be a JSON object, got {type(value).__name__}")
    check_sampling(value, "sampling.extra_json.")
    return value


# -- outbound ------------------------------------------------------------------------------------


def tokens_added(delta: TextDelta, emitted: int) -> int:
    """Output tokens one delta added, given ``emitted`` so far: from the worker's cumulative count when
    it reports one (SGLang meta_info, an OpenAI usage chunk), else its token ids, else one per text."""
    if delta.completion_tokens is not None:
        return max(0, delta.completion_tokens - emitted)
    if delta.token_ids:
        return len(delta.token_ids)
    return 1 if delta.text else 0


def stage_timings(stages: Mapping[str, float | None]) -> generate_pb2.StageTimings:
    """``RequestTiming.stages()`` → StageTimings; a stage that did not happen stays unset."""
    out = generate_pb2.StageTimings()
    fields = out.DESCRIPTOR.fields_by_name
    for name, value in stages.items():
        if value is not None and f"{name}_s" in fields:
            setattr(out, f"{name}_s", value)
    return out


def final_message(
    *,
    finish_reason: str,
    prompt_tokens: int | None,
    cached_tokens: int | None,
    completion_tokens: int | None,
    worker: str,
    request_id: str,
    stages: Mapping[str, float | None],
) -> generate_pb2.Final:
    return generate_pb2.Final(
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens or 0,
        cached_tokens=cached_tokens or 0,
        completion_tokens=completion_tokens or 0,
        worker=worker,
        request_id=request_id,
        timings=stage_timings(stages),
    )


def worker_state(w: WorkerSnapshot) -> admin_pb2.WorkerState:
    state = admin_pb2.WorkerState(
        url=w.url,
        healthy=w.healthy,
        stale=w.stale,
        in_flight=max(0, w.in_flight),
        page_size=max(0, w.page_size),
        generation=max(0, w.generation),
        models=list(w.models),
    )
    if w.running is not None:
        state.running = max(0, w.running)
    if w.queued is not None:
        state.queued = max(0, w.queued)
    if w.token_usage is not None:
        state.token_usage = w.token_usage
    if w.cache_hit_rate is not None:
        state.cache_hit_rate = w.cache_hit_rate
    if w.max_running_requests is not None:
        state.max_running_requests = max(0, w.max_running_requests)
    if w.max_total_tokens is not None:
        state.max_total_tokens = max(0, w.max_total_tokens)
    return state
