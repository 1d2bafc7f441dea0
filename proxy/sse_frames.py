"""Runs of complete SSE events as bytes (pure, no I/O): their ``data:`` payloads, where a stream
ends, whether a worker's events look like events, and the rewrites the relay makes.

A worker's events are not trusted: ``check_events`` (run by the pipeline on every run it relays)
refuses a ``data:`` payload that is neither ``[DONE]`` nor shaped like a JSON object — a cheap
check of its first and last byte, since native chunks are not parsed on the way (their text is
cumulative: parsing each is O(answer²)). Where a payload is parsed anyway (``parse_event``: OpenAI
chunks, error events, the last chunk's ``meta_info``, the gRPC decoders), a parse failure is
``MalformedEvent`` too, through ``safejson`` (no ``RecursionError``, no NaN). What the payloads
mean is ``sse.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy import safejson
from proxy.errors import RadixgateError, anthropic_kind

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


class MalformedEvent(ValueError):
    """A worker's SSE event that is not ``[DONE]`` nor a JSON object."""


_ERROR_EVENT = b'data: {"error"'


def until_end(data: bytes) -> bytes:
    """A run that ends the stream (``[DONE]`` or an error event), cut after that end (and an error
    event's own ``[DONE]``): what a worker sends after its end is not relayed."""
    if data.endswith(DONE_EVENT) and data.count(b"data: [DONE]") == 1 and _ERROR_EVENT not in data:
        return data  # the usual last run: one [DONE], at its end
    starts = [i + 2 for marker in (DONE_EVENT, _ERROR_EVENT) if (i := data.find(b"\n\n" + marker)) >= 0]
    starts += [0] if data.startswith((DONE_EVENT, _ERROR_EVENT)) else []
    if not starts:
        return data
    stop = data.find(b"\n\n", min(starts)) + 2
    if data.startswith(DONE_EVENT, stop):
        stop += len(DONE_EVENT)
    return data[:stop]


def parse_event(payload: bytes) -> Any:
    """One event payload, parsed; ``MalformedEvent`` when it is not JSON."""
    try:
        return safejson.loads(payload)
    except ValueError as e:
        raise MalformedEvent(f"an event is not JSON ({str(e)[:100]}): {payload[:60]!r}") from None


def check_events(data: bytes) -> None:
    """``MalformedEvent`` unless every ``data:`` payload of this run of complete events is ``[DONE]``
    or looks like a JSON object (``{`` … ``}``). The usual layout — single-line ``data: {…}``
    events — is checked by each event's ends (no copy); any other layout line by line."""
    if data.endswith(b"}\n\n") and data.startswith(b"data: {") and data.count(b"\n") == 2:
        return  # one single-line event: most runs
    if _single_line_events(data):
        return
    for event in data.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue  # comments, event:, id:, retry: (ignored, as SSE clients ignore them)
            payload = line[5:].strip()
            if payload != DONE and not (payload.startswith(b"{") and payload.endswith(b"}")):
                raise MalformedEvent(f"an event is neither [DONE] nor a JSON object: {payload[:60]!r}")


def _single_line_events(data: bytes) -> bool:
    """Whether ``data`` is only ``data: {…}\\n\\n`` / ``data: [DONE]\\n\\n`` events (False: look closer)."""
    pos, size = 0, len(data)
    find, starts = data.find, data.startswith
    while pos < size:
        end = find(b"\n", pos)
        if end < 0 or data[end + 1:end + 2] != b"\n":
            return False
        if not ((starts(b"data: {", pos) and data[end - 1] == 0x7D) or starts(b"data: [DONE]\n", pos)):
            return False
        pos = end + 2
    return True


def iter_payloads(data: bytes) -> list[bytes]:
    """The ``data:`` payloads of a run of complete events (comments and other fields skipped)."""
    out = []
    for event in data.split(b"\n\n"):
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                out.append(line[5:].strip())
    return out


def last_output_payload(data: bytes) -> bytes | None:
    """The last ``data:`` payload of a run that is neither ``[DONE]`` nor an error, or None.

    Scans events from the end: a zero-delay worker's whole answer can arrive as one run, and only
    its last output event (``meta_info``) is wanted, so splitting every event would be wasted work.
    """
    end = len(data)
    while end > 0:
        start = data.rfind(b"\n\n", 0, end)
        event = data[start + 2 if start >= 0 else 0:end]
        end = max(start, 0)
        if b"data:" not in event:
            continue
        for line in reversed(event.split(b"\n")):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload != DONE and not payload.startswith(b'{"error"'):
                    return payload
    return None


def drop_usage_events(data: bytes) -> bytes:
    """A run of complete OpenAI events without its usage-only chunks (``"choices": []`` and a
    ``usage`` object: what a worker sends last when asked for ``include_usage``). For a caller who
    did not ask for usage, which the pipeline asked the worker for on their behalf; the accountant
    has read the chunk already. Runs without such a chunk come back as they are (no copy)."""
    if b'"choices":[]' not in data and b'"choices": []' not in data:
        return data
    kept = []
    for event in data.split(b"\n\n"):
        if event and _is_usage_only(event):
            continue
        kept.append(event)
    return b"\n\n".join(kept)


def _is_usage_only(event: bytes) -> bool:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            payload = line[5:].strip()
            if payload == DONE or not payload.startswith(b"{"):
                return False
            try:
                obj = safejson.loads(payload)
            except ValueError:
                return False
            return (isinstance(obj, Mapping) and obj.get("choices") == [] and isinstance(obj.get("usage"), Mapping))
    return False


def error_event(err: RadixgateError, style: str = "openai") -> bytes:
    """An error event then ``[DONE]``: how a stream that broke after it began ends. Anthropic
    clients read only named events (``event: error``, its own shape; no ``[DONE]``)."""
    if style == "anthropic":
        body: dict[str, object] = {"type": "error", "error": {"type": anthropic_kind(err.status), "message": err.message}}
        return b"event: error\ndata: " + json.dumps(body).encode() + b"\n\n"
    body = {"error": {"message": err.message, "type": err.kind, "code": err.status}}
    return b"data: " + json.dumps(body).encode() + b"\n\n" + DONE_EVENT
