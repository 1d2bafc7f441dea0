"""Pure shaping for SGLang 0.5.23's OpenAI Responses API (no I/O).

Mirrors ``serving_responses.py`` on its non-harmony path: a body becomes a ``ResponsesBody``
(or BadRequest); the conversation becomes chat messages (instructions, the previous response's
input and output, the new input) that tokenize as chat does; ``response_object`` and the
``*_event`` builders give the JSON SGLang sends (``ResponsesResponse.from_request`` and the
``openai.types.responses`` stream events). Sequence numbers are the caller's: it owns the stream.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from proxy.sim.protocol import DEFAULT_MAX_NEW_TOKENS, BadRequest, int_field, stop_list

ID_PREFIX = "resp_"
TEXT_PART_TYPES = frozenset({"input_text", "output_text", "text"})
ROLES = frozenset({"user", "assistant", "system", "developer"})
RUNNING = frozenset({"queued", "in_progress"})  # what a cancel can still stop


@dataclass(frozen=True)
class ResponsesBody:
    request_id: str  # the response's id and the engine rid (/abort_request finds it)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    background: bool = False
    max_output_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None

    @property
    def max_new_tokens(self) -> int:
        return DEFAULT_MAX_NEW_TOKENS if self.max_output_tokens is None else self.max_output_tokens


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"{name} must be a string")
    return value


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadRequest(f"{name} must be a number")
    return float(value)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean")
    return value


def parse_body(body: Any) -> ResponsesBody:
    """A POST /v1/responses body; SGLang's ``rid`` is ignored (``request_id`` names the request)."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    raw_input = body.get("input")
    if not isinstance(raw_input, str | list):
        raise BadRequest("input must be a string or a list of input items")
    input_messages(raw_input)  # validated here so a bad item is a 400 before anything else
    max_output = int_field(body, "max_output_tokens", -1)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object")
    return ResponsesBody(
        request_id=_text(body, "request_id") or ID_PREFIX + uuid.uuid4().hex,
        input=raw_input,
        instructions=_text(body, "instructions"),
        previous_response_id=_text(body, "previous_response_id"),
        store=_flag(body, "store", True),
        stream=_flag(body, "stream", False),
        background=_flag(body, "background", False),
        max_output_tokens=None if max_output < 0 else max_output,
        stop=stop_list(body.get("stop")),
        temperature=_number(body, "temperature"),
        top_p=_number(body, "top_p"),
        user=_text(body, "user"),
        metadata=dict(metadata) if metadata is not None else None,
    )


def _part_text(part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") not in TEXT_PART_TYPES or not isinstance(part.get("text"), str):
        raise BadRequest("content parts must be text parts: {'type': 'input_text', 'text': ...}")
    text: str = part["text"]
    return text


def input_messages(value: str | list[Any]) -> list[dict[str, Any]]:
    """The request's input as chat messages: a string is one user turn; list items are message
    items whose text parts are joined as the chat path's ``render_chat`` joins them (one space)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not value:
        raise BadRequest("input must not be an empty list")
    out: list[dict[str, Any]] = []
    for item in value:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise BadRequest("input items must be messages: {'role': ..., 'content': ...}")
        role, content = item.get("role"), item.get("content")
        if role not in ROLES:
            raise BadRequest(f"input message role must be one of {sorted(ROLES)}")
        if isinstance(content, list):
            content = " ".join(_part_text(p) for p in content)
        if not isinstance(content, str):
            raise BadRequest("input message content must be a string or a list of text parts")
        out.append({"role": role, "content": content})
    return out


def output_text(response: dict[str, Any]) -> str:
    """The text of a response's output_text parts (what the SDK's ``Response.output_text`` reads)."""
    return "".join(part.get("text", "") for item in response.get("output") or () if item.get("type") == "message"
                   for part in item.get("content") or () if part.get("type") == "output_text")


def conversation(body: ResponsesBody, previous: tuple[list[dict[str, Any]], dict[str, Any]] | None
                 ) -> list[dict[str, Any]]:
    """The messages the prompt is rendered from. ``previous``: the previous response's stored
    messages and the response. SGLang 0.5.23 appends the instructions as a system message where
    the previous output belongs (a bug); this appends the output as the assistant turn, as meant,
    so a follow-up's prompt extends the previous prompt and its output token for token."""
    messages: list[dict[str, Any]] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    if previous is not None:
        prev_messages, prev_response = previous
        messages.extend(prev_messages)
        if prev_response.get("output"):
            messages.append({"role": "assistant", "content": output_text(prev_response)})
    messages.extend(input_messages(body.input))
    return messages


def message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def new_item_id() -> str:
    return "msg_" + uuid.uuid4().hex


def usage(prompt: int, cached: int, completion: int) -> dict[str, Any]:
    # cache_write_tokens: SGLang adds it because the SDK's InputTokensDetails requires it.
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def response_object(body: ResponsesBody, *, model: str, created_at: int, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    """``ResponsesResponse.from_request``: the request's settings echoed around output and usage."""
    return {
        "id": body.request_id, "object": "response", "created_at": created_at, "model": model,
        "status": status, "output": output, "usage": usage,
        "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
        "error": None, "incomplete_details": None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": body.store, "temperature": body.temperature,
        # SGLang names the text format only once there is text output to describe.
        "text": {"format": {"type": "text"}} if output else None,
        "top_p": body.top_p, "truncation": "disabled", "user": body.user,
        "metadata": body.metadata or {},
    }


# -- stream events (sequence_number is set by the stream) ------------------------------------------
def response_event(kind: str, response: dict[str, Any]) -> dict[str, Any]:
    """response.created / response.in_progress / response.completed."""
    return {"type": kind, "response": response}


def item_added_event(item_id: str) -> dict[str, Any]:
    return {"type": "response.output_item.added", "output_index": 0, "item": message_item(item_id, None, "in_progress")}


def part_added_event(item_id: str) -> dict[str, Any]:
    return {"type": "response.content_part.added", "item_id": item_id, "output_index": 0, "content_index": 0,
            "part": text_part("")}


def delta_event(item_id: str, delta: str) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "item_id": item_id, "output_index": 0, "content_index": 0,
            "delta": delta, "logprobs": []}


def done_events(item_id: str, text: str) -> list[dict[str, Any]]:
    """What closes the message: its text, its part, the item."""
    where = {"item_id": item_id, "output_index": 0, "content_index": 0}
    return [
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": text_part(text)},
        {"type": "response.output_item.done", "output_index": 0, "item": message_item(item_id, text, "completed")},
    ]


def error_event(message: str, status: int) -> dict[str, Any]:
    return {"type": "error", "code": status, "message": message, "param": None}


def sse_event(event: dict[str, Any]) -> bytes:
    """``event: <type>`` then ``data: <json>``: the Responses stream names every event."""
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# -- errors ----------------------------------------------------------------------------------------
def error_body(message: str, status: int, param: str | None = None) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": "invalid_request_error", "param": param, "code": status}


def id_error(response_id: str, known: bool) -> tuple[dict[str, Any], int] | None:
    """SGLang's answer for an id that is malformed (400) or not stored (404); None when usable."""
    if not response_id.startswith(ID_PREFIX):
        message = f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'."
        return error_body(message, 400, "response_id"), 400
    if not known:
        return error_body(f"Response with id '{response_id}' not found.", 404, "response_id"), 404
    return None


def cancel_sync_error() -> dict[str, Any]:
    """SGLang's answer to a cancel of a response that is not (or no longer) running in the background."""
    return error_body("Cannot cancel a synchronous response.", 400)
