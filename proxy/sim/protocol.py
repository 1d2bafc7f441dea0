"""Pure payload shaping for SGLang's native and OpenAI-compatible APIs (no I/O).

Parsing turns a request body into a SimRequest (or raises BadRequest); the builders turn a
request's state into the exact JSON SGLang 0.5.23 sends (see shared/reference/sglang-protocol.md
§1.2-§1.4). Chat messages are rendered turn by turn with a Llama-3-like template, so the prompt of
turn n+1 extends the prompt of turn n token for token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from proxy.routing.chat_template import ChatTemplateError
from proxy.sim import tokenizer
from proxy.sim.scheduler import SimRequest

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang sampling_params default
OPENAI_DEFAULT_MAX_TOKENS = 16  # SGLang CompletionRequest default


class BadRequest(ValueError):
    pass


def stop_list(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise BadRequest("stop must be a string or a list of strings")


def int_field(body: dict[str, Any], name: str, default: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be a non-negative integer")
    return value


def _token_ids(value: Any) -> list[int]:
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return list(value)
    raise BadRequest("input_ids must be a non-empty list of integers (batches are not supported)")


def parse_generate(body: Any, encode: Callable[[str], list[int]] = tokenizer.encode) -> tuple[SimRequest, bool]:
    """/generate body -> (request, stream); ``encode`` tokenizes text prompts."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise BadRequest("Either text or input_ids should be provided.")
    if text is not None and not isinstance(text, str):
        raise BadRequest("text must be a string (batches are not supported)")
    input_ids = encode(text) if isinstance(text, str) else _token_ids(ids)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("rid must be a string")
    req = SimRequest(
        rid=rid or uuid.uuid4().hex,
        input_ids=input_ids,
        max_new_tokens=int_field(params, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
        stop=stop_list(params.get("stop")),
        dp_rank=dp_rank(body),
    )
    return req, bool(body.get("stream", False))


def dp_rank(body: dict[str, Any]) -> int | None:
    """The data-parallel rank a request names (``routed_dp_rank``, or the older ``data_parallel_rank``)."""
    for name in ("routed_dp_rank", "data_parallel_rank"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"{name} must be a non-negative integer")
        return value
    return None


def meta_info(req: SimRequest, *, final: bool, metrics: bool, wall_offset: float, cached: bool = True) -> dict[str, Any]:
    """SGLang's meta_info. ``wall_offset`` converts monotonic stamps to wall-clock timestamps;
    ``cached`` False leaves out ``cached_tokens`` (an engine that does not report it)."""
    m: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": req.finish_reason if req.finished else None,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "reasoning_tokens": 0,
        "weight_version": "default",
        "num_retractions": 0,
    }
    if not cached:
        del m["cached_tokens"]
    if metrics:
        admitted = req.admitted_at
        m["queue_time"] = (admitted - req.arrival) if admitted is not None else 0.0
        m["forward_entry_time"] = admitted + wall_offset if admitted is not None else None
    if final and req.finished_at is not None:
        m["e2e_latency"] = req.finished_at - req.arrival
        if metrics:
            m["request_received_ts"] = req.arrival + wall_offset
            m["request_finished_ts"] = req.finished_at + wall_offset
            if req.first_token_at is not None:
                m["first_token_latency"] = req.first_token_at - req.arrival
                decode_s = req.finished_at - req.first_token_at
                if len(req.output_ids) > 1 and decode_s > 0:
                    m["decode_throughput"] = (len(req.output_ids) - 1) / decode_s
    return m


def generate_payload(req: SimRequest, text: str, ids: list[int], meta: dict[str, Any]) -> dict[str, Any]:
    return {"text": text, "output_ids": ids, "meta_info": meta}


# -- OpenAI ----------------------------------------------------------------------------------------
def render_chat(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    parts = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest("each message needs a role")
        content = msg.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise BadRequest("message content must be a string or a list of text parts")
        parts.append(f"<|start_header_id|>{msg['role']}<|end_header_id|>\n\n{content}\n<|eot_id|>\n")
    parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def chat_prompt_ids(messages: Any, encode: Callable[[str], list[int]] = tokenizer.encode,
                    encode_chat: Callable[[list[dict[str, Any]]], list[int] | None] | None = None,
                    ) -> list[int]:
    """A chat prompt's token ids: the model's chat template (``encode_chat``) or, when it gives
    None, ``render_chat`` + ``encode``. Chat and the Responses API both come here, so a Responses
    turn tokenizes exactly as the same conversation sent to /v1/chat/completions."""
    text = render_chat(messages)  # validates the messages whatever renders them
    try:
        ids = encode_chat(messages) if encode_chat is not None else None
    except ChatTemplateError as e:
        raise BadRequest(str(e)) from e
    return ids if ids is not None else encode(text)


def parse_openai(body: Any, chat: bool, encode: Callable[[str], list[int]] = tokenizer.encode,
                 encode_chat: Callable[[list[dict[str, Any]]], list[int] | None] | None = None,
                 ) -> tuple[SimRequest, bool, bool]:
    """/v1/completions or /v1/chat/completions body -> (request, stream, include_usage).

    ``encode_chat``: the model's chat template (``Encoder.encode_chat``); without one, or when it
    gives None, the turns are rendered by ``render_chat``."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if chat:
        input_ids = chat_prompt_ids(body.get("messages"), encode, encode_chat)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            input_ids = encode(prompt)
        elif isinstance(prompt, list):
            input_ids = _token_ids(prompt)
        else:
            raise BadRequest("prompt must be a string or a list of token ids")
    default = DEFAULT_MAX_NEW_TOKENS if chat else OPENAI_DEFAULT_MAX_TOKENS
    max_tokens = int_field(body, "max_completion_tokens", -1) if chat else -1
    if max_tokens < 0:
        max_tokens = int_field(body, "max_tokens", default)
    rid = body.get("rid")
    req = SimRequest(rid=rid if isinstance(rid, str) else uuid.uuid4().hex, input_ids=input_ids,
                     max_new_tokens=max_tokens, stop=stop_list(body.get("stop")), dp_rank=dp_rank(body))
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    return req, bool(body.get("stream", False)), include_usage


def openai_finish(req: SimRequest) -> tuple[str | None, Any]:
    if not req.finished or req.finish_reason is None:
        return None, None
    kind = req.finish_reason.get("type")
    return kind, req.finish_reason.get("matched") if kind == "stop" else None


def usage(req: SimRequest, cache_report: bool) -> dict[str, Any]:
    prompt, completion = len(req.input_ids), len(req.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": req.cached_tokens} if cache_report else None,
        "reasoning_tokens": 0,
    }


def openai_response(req: SimRequest, model: str, chat: bool, cache_report: bool) -> dict[str, Any]:
    reason, matched = openai_finish(req)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
    if chat:
        choice["message"] = {"role": "assistant", "content": req.output_text, "reasoning_content": None,
                             "tool_calls": None}
    else:
        choice["text"] = req.output_text
    return {
        "id": req.rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(req, cache_report),
    }


def openai_chunk(req: SimRequest, model: str, chat: bool, delta: str | None, *, first: bool) -> dict[str, Any]:
    reason, matched = openai_finish(req)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
    if chat:
        d: dict[str, Any] = {"role": "assistant"} if first else {}
        if delta is not None:
            d["content"] = delta
        choice["delta"] = d
    else:
        choice["text"] = delta or ""
    return {
        "id": req.rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": None,
    }


def openai_usage_chunk(req: SimRequest, model: str, chat: bool, cache_report: bool) -> dict[str, Any]:
    return {
        "id": req.rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(req, cache_report),
    }


def openai_error(message: str, status: int) -> dict[str, Any]:
    kind = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError",
            503: "ServiceUnavailableError"}.get(status, "BadRequestError")
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}
