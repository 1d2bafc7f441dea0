"""The OpenAI Responses API, as far as a router must understand it (pure, no I/O).

A Responses server keeps state: with ``store`` (the default) the worker that answered keeps the
response and its input, and ``GET /v1/responses/{id}``, ``POST .../cancel`` and a follow-up's
``previous_response_id`` (the conversation so far, prepended by the worker) work only there. So the
proxy remembers which worker holds each id (``ResponseHomes``, bounded) and pins those requests
to it; for routing, a request's ``instructions`` and ``input`` read as the chat messages the
worker renders (``conversation``), so Responses and chat traffic with one system prompt share
prefix keys.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any

from proxy.errors import BadRequest

# Ids travel in URL paths to workers (GET /v1/responses/{id}): only characters that need no escaping.
_ID = re.compile(r"[A-Za-z0-9_.\-]{1,256}")


def check_id(field: str, value: Any) -> str:
    """A response id a caller sent (``previous_response_id``, ``request_id``, a path's id)."""
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise BadRequest(f"{field}: must be a response id of 1-256 letters, digits, '_', '.' or '-'")
    return value


def _text_of(content: Any, where: str) -> str:
    """An item's content as the text a chat template renders: a string, or the text of its parts
    (a part without text, e.g. ``input_image``, keys by its JSON, so two images key apart)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content: must be a string or a list of content parts")
    pieces = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise BadRequest(f"{where}.content[{j}]: must be an object")
        text = part.get("text")
        pieces.append(text if isinstance(text, str) else json.dumps(part, sort_keys=True))
    return "".join(pieces)


def _message(item: dict[str, Any], where: str) -> dict[str, Any] | None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or not role:
            raise BadRequest(f"{where}.role: must be a non-empty string")
        return {"role": role, "content": _text_of(item.get("content", ""), where)}
    if kind == "function_call":
        return {"role": "assistant", "content": f"{item.get('name', '')}({item.get('arguments', '')})"}
    if kind == "function_call_output":
        output = item.get("output", "")
        return {"role": "tool", "content": output if isinstance(output, str) else json.dumps(output)}
    if kind in ("reasoning", "item_reference"):
        return None  # not rendered into the prompt (SGLang drops reasoning from the history)
    if not isinstance(kind, str):
        raise BadRequest(f"{where}.type: must be a string")
    return {"role": kind[:40], "content": json.dumps(item, sort_keys=True)}


def conversation(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a Responses request renders to (instructions as the system turn, then the
    input), for its prefix key; ``BadRequest`` names the field that is malformed."""
    messages: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions: must be a string")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    given = payload.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            if not isinstance(item, dict):
                raise BadRequest(f"input[{i}]: must be an input item object")
            msg = _message(item, f"input[{i}]")
            if msg is not None:
                messages.append(msg)
    else:
        raise BadRequest("input: required, a string or a non-empty list of input items")
    for name in ("store", "background", "stream"):
        if payload.get(name) is not None and not isinstance(payload[name], bool):
            raise BadRequest(f"{name}: must be true or false")
    if payload.get("background") and payload.get("stream"):
        raise BadRequest("background: a background response cannot be streamed (stream: false)")
    if not messages:
        messages.append({"role": "user", "content": ""})
    return messages


class ResponseHomes:
    """Which worker holds each stored response: an LRU of at most ``capacity`` ids (the oldest
    forgotten first; a forgotten id is found again by asking the workers)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._homes: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._homes)

    def remember(self, response_id: str, worker: str) -> None:
        self._homes[response_id] = worker
        self._homes.move_to_end(response_id)
        while len(self._homes) > self.capacity:
            self._homes.popitem(last=False)

    def home(self, response_id: str) -> str | None:
        worker = self._homes.get(response_id)
        if worker is not None:
            self._homes.move_to_end(response_id)
        return worker

    def forget(self, response_id: str) -> None:
        self._homes.pop(response_id, None)
