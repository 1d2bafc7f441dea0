"""W3C Trace Context (``traceparent``, ``tracestate``) carried from the caller to the worker (pure).

Without tracing of its own, radixgate passes the caller's trace context on unchanged, so an engine
that traces (SGLang ``--enable-trace``, vLLM ``--otlp-traces-endpoint``) continues the caller's
trace instead of starting one per request, and the request's log line carries the trace id. With
``telemetry.otlp_traces_endpoint`` (``proxy/telemetry/tracing.py``) radixgate's own span for the
request sits between the two: the worker is handed radixgate's span as its parent.

Both headers come from the client, so they are checked as the specification asks of a receiver
(https://www.w3.org/TR/trace-context/): a ``traceparent`` that does not parse (wrong length,
upper-case or non-hex digits, version ``ff``, an all-zero trace or parent id) is dropped, and
``tracestate`` with it (it means nothing without its parent); a ``tracestate`` longer than 512
characters (what a receiver must at least pass on) or holding anything but printable ASCII is
dropped alone. A context is passed on as version 00. Nothing else the caller sent reaches a
worker through here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACESTATE = 512
_PARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_PRINTABLE = re.compile(r"[\x20-\x7e]*")


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str  # 32 lower-case hex digits
    span_id: str  # 16: the span the worker's spans hang under
    flags: int  # bit 0: sampled
    state: str | None = None
    # Set when span_id is radixgate's own span (tracing on): the caller's span above it, if any.
    own: bool = False
    parent_id: str | None = None

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    def headers(self) -> dict[str, str]:
        out = {TRACEPARENT: f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"}
        if self.state:
            out[TRACESTATE] = self.state
        return out

    def child(self, span_id: str, *, sampled: bool) -> TraceContext:
        """radixgate's own span under this one."""
        flags = (self.flags | 1) if sampled else (self.flags & ~1)
        return replace(self, span_id=span_id, flags=flags, own=True, parent_id=self.span_id)


def parse_traceparent(value: str) -> TraceContext | None:
    """A valid ``traceparent``'s context, else None."""
    m = _PARENT.fullmatch(value.strip(" \t"))
    if m is None:
        return None
    version, trace, span, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None  # ff is forbidden; version 00 is exactly 55 characters; later ones may extend it
    if trace == "0" * 32 or span == "0" * 16:
        return None
    return TraceContext(trace, span, int(flags, 16))


def from_headers(get: Callable[[str], str | None]) -> TraceContext | None:
    """The caller's context, read with ``get(name)`` (lower-case names; a repeated ``tracestate``
    joined with commas by the caller of ``get``); None without a valid ``traceparent``."""
    parent = get(TRACEPARENT)
    ctx = parse_traceparent(parent) if parent is not None else None
    if ctx is None:
        return None
    state = get(TRACESTATE)
    if state is not None:
        state = state.strip(" \t")
        if state and len(state) <= MAX_TRACESTATE and _PRINTABLE.fullmatch(state):
            return replace(ctx, state=state)
    return ctx
