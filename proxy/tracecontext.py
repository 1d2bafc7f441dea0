"""W3C Trace Context (``traceparent``, ``tracestate``) carried from the caller to the worker (pure).

radixgate makes no spans of its own: it passes the caller's trace context on, so an engine that
traces (SGLang ``--enable-trace``, vLLM ``--otlp-traces-endpoint``) continues the caller's trace
instead of starting one per request, and the request's log line carries the trace id to find it.

Both headers come from the client, so they are checked as the specification asks of a receiver
(https://www.w3.org/TR/trace-context/): a ``traceparent`` that does not parse (wrong length,
upper-case or non-hex digits, version ``ff``, an all-zero trace or parent id) is dropped, and
``tracestate`` with it (it means nothing without its parent); a ``tracestate`` longer than 512
characters (what a receiver must at least pass on) or holding anything but printable ASCII is
dropped alone. Nothing else the caller sent reaches a worker through here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACE_HEADERS = (TRACEPARENT, TRACESTATE)
MAX_TRACESTATE = 512
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


def parse_traceparent(value: str) -> str | None:
    """The trace id of a valid ``traceparent``, else None."""
    m = _PARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version, trace, parent, _, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None  # ff is forbidden; version 00 is exactly 55 characters; later ones may extend it
    if trace == "0" * 32 or parent == "0" * 16:
        return None
    return trace


def trace_headers(get: Callable[[str], str | None]) -> dict[str, str]:
    """The trace headers to forward, read with ``get(name)`` (lower-case names; a repeated
    ``tracestate`` joined with commas by the caller of ``get``)."""
    parent = get(TRACEPARENT)
    if parent is None or parse_traceparent(parent) is None:
        return {}
    out = {TRACEPARENT: parent.strip(" \t")}
    state = get(TRACESTATE)
    if state is not None:
        state = state.strip(" \t")
        if state and len(state) <= MAX_TRACESTATE and _PRINTABLE.fullmatch(state):
            out[TRACESTATE] = state
    return out


def trace_id(headers: dict[str, str]) -> str | None:
    """The trace id of forwarded headers (``trace_headers``' output), for the request's log line."""
    parent = headers.get(TRACEPARENT)
    return parse_traceparent(parent) if parent is not None else None
