"""Pure shaping for SGLang 0.5.23's Anthropic Messages API (no I/O).

Mirrors ``entrypoints/anthropic/serving.py``: a body becomes a ``MessagesBody`` (or BadRequest);
its system prompt and messages become the chat messages SGLang hands to its chat path
(``_convert_to_chat_completion_request``), so they tokenize as /v1/chat/completions would; the
builders give the message object, the stream events and the error bodies SGLang sends.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from proxy.sim.protocol import BadRequest, stop_list
from proxy.sim.scheduler import SimRequest

ROLES = frozenset({"user", "assistant"})
# AnthropicContentBlock's types; the thinking ones are accepted and, as SGLang does, not rendered.
BLOCK_TYPES = frozenset({"text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"})
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 503: "overloaded_error"}


@dataclass(frozen=True)
class MessagesBody:
    rid: str  # the engine rid: the proxy names it so that /abort_request {"rid"} finds the request
    model: str
    messages: list[dict[str, Any]]  # validated Anthropic messages, still in Anthropic form
    max_tokens: int = 1  # count_tokens has none; nothing is generated then
    system: str | list[dict[str, Any]] | None = None
    stream: bool = False
    stop: tuple[str, ...] = ()


def _number(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
        raise BadRequest(f"{name} must be a number")


def _block(block: Any, where: str) -> dict[str, Any]:
    if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
        raise BadRequest(f"{where} content blocks must be objects with a type in {sorted(BLOCK_TYPES)}")
    text = block.get("text")
    if text is not None and not isinstance(text, str):
        raise BadRequest(f"{where} text blocks need a string text")
    if block["type"] == "tool_result":
        content = block.get("content")
        if not (content is None or isinstance(content, str)
                or (isinstance(content, list) and all(isinstance(p, dict) for p in content))):
            raise BadRequest("tool_result content must be a string or a list of blocks")
    return block


def _message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise BadRequest(f"each message needs a role in {sorted(ROLES)}")
    content = message.get("content")
    if isinstance(content, list):
        content = [_block(b, "message") for b in content]
    elif not isinstance(content, str):
        raise BadRequest("message content must be a string or a list of content blocks")
    return {"role": message["role"], "content": content}


def parse_body(body: Any, *, counting: bool = False) -> MessagesBody:
    """A POST /v1/messages body, or (``counting``) a /v1/messages/count_tokens one, which has no
    max_tokens. temperature, top_p and top_k are checked and ignored: the output is deterministic."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("model is required")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("messages must be a non-empty list")
    messages = [_message(m) for m in raw]
    system = body.get("system")
    if isinstance(system, list):
        system = [_block(b, "system") for b in system]
    elif system is not None and not isinstance(system, str):
        raise BadRequest("system must be a string or a list of text blocks")
    max_tokens = 1 if counting else body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest("max_tokens must be a positive integer")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream must be a boolean")
    stops = body.get("stop_sequences")
    if stops is not None and not isinstance(stops, list):
        raise BadRequest("stop_sequences must be a list of strings")
    for name in ("temperature", "top_p", "top_k"):
        _number(body, name)
    rid = body.get("rid")
    return MessagesBody(rid=rid if isinstance(rid, str) else uuid.uuid4().hex, model=model, messages=messages,
                        max_tokens=max_tokens, system=system, stream=bool(stream), stop=stop_list(stops))


# -- the chat conversation -------------------------------------------------------------------------
def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    # One text part is sent as a plain string, several as parts the chat path joins: as SGLang.
    return parts[0]["text"] if len(parts) == 1 else parts


def _tool_result(block: dict[str, Any]) -> tuple[str | list[dict[str, Any]], str]:
    """(the tool message's content, its text joined by newlines), as SGLang's
    ``_convert_tool_result_content`` gives them; image parts are dropped (the sim sees no pixels)."""
    content = block.get("content")
    if not isinstance(content, list):
        text = content or ""
        return text, text
    texts = [p["text"] for p in content if p.get("type") == "text" and isinstance(p.get("text"), str) and p["text"]]
    return (_content([_text_part(t) for t in texts]) if texts else ""), "\n".join(texts)


def _tool_use_text(block: dict[str, Any]) -> str:
    # SGLang makes a tool_call the chat template renders; the sim's template renders text only, so
    # the call is written as Llama 3.1's template writes one: a JSON object of name and parameters.
    return json.dumps({"name": block.get("name") or "", "parameters": block.get("input") or {}})


def _system_message(system: str | list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if not system:  # None, "" and [] add no system turn, as SGLang's ``if request.system``
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    text = "\n".join(b["text"] for b in system if b.get("type") == "text" and b.get("text"))
    return [{"role": "system", "content": text}]


def chat_messages(body: MessagesBody) -> list[dict[str, Any]]:
    """The chat messages SGLang renders the prompt from: the system turn, then each message. A
    user's tool_result becomes a ``tool`` turn placed before the rest of that message (SGLang
    appends it as it meets it); a block-content message with nothing left to render is dropped."""
    out = _system_message(body.system)
    for message in body.messages:
        role, content = message["role"], message["content"]
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        parts: list[dict[str, Any]] = []
        for block in content:
            kind = block["type"]
            if kind == "text" and block.get("text"):
                parts.append(_text_part(block["text"]))
            elif kind == "tool_use":
                parts.append(_text_part(_tool_use_text(block)))
            elif kind == "tool_result":
                tool_content, tool_text = _tool_result(block)
                if role == "user":
                    out.append({"role": "tool", "content": tool_content})
                else:
                    parts.append(_text_part(f"Tool result: {tool_text}"))
        if parts:
            out.append({"role": role, "content": _content(parts)})
    return out


# -- answers ---------------------------------------------------------------------------------------
def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def stop_reason(req: SimRequest) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). An abort that is not the server's (``/abort_request``) ends
    the turn normally, as SGLang maps every unknown finish reason to end_turn."""
    reason = req.finish_reason or {}
    if reason.get("type") == "length":
        return "max_tokens", None
    matched = reason.get("matched")
    if reason.get("type") == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def usage(input_tokens: int, output_tokens: int, cached: int) -> dict[str, int]:
    # SGLang counts the whole prompt as input_tokens; the cached part is repeated, not subtracted.
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_read_input_tokens": cached}


def message_object(message_id: str, model: str, text: str, reason: str | None, sequence: str | None,
                   tokens: dict[str, int]) -> dict[str, Any]:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": [text_block(text)] if text else [], "stop_reason": reason, "stop_sequence": sequence,
            "usage": tokens}


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


# -- stream events ---------------------------------------------------------------------------------
def message_start_event(message_id: str, model: str) -> dict[str, Any]:
    # Usage is all zeros here: SGLang reads it from a first chat chunk that carries none.
    return {"type": "message_start", "message": message_object(message_id, model, "", None, None, usage(0, 0, 0))}


def block_start_event() -> dict[str, Any]:
    return {"type": "content_block_start", "index": 0, "content_block": text_block("")}


def text_delta_event(text: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}


def block_stop_event() -> dict[str, Any]:
    return {"type": "content_block_stop", "index": 0}


def message_delta_event(reason: str, sequence: str | None, tokens: dict[str, int]) -> dict[str, Any]:
    return {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence}, "usage": tokens}


def message_stop_event() -> dict[str, Any]:
    return {"type": "message_stop"}


def error_event(message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": "api_error", "message": message}}


# -- errors ----------------------------------------------------------------------------------------
def error_body(message: str, status: int) -> dict[str, Any]:
    """``AnthropicErrorResponse``; any other 5xx (an injected fault, a server abort) is an api_error."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
