"""W3C Trace Context as a receiver reads it (proxy/tracecontext.py, pure)."""

from __future__ import annotations

import pytest

from proxy.tracecontext import parse_traceparent, trace_headers, trace_id

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.mark.parametrize("value, expected", [
    (PARENT, TRACE),
    (f" {PARENT}\t", TRACE),  # optional whitespace around a header value
    (f"cc-{TRACE}-00f067aa0ba902b7-09-what-a-later-version-adds", TRACE),
    (f"cc-{TRACE}-00f067aa0ba902b7-09", TRACE),
    (f"00-{TRACE}-00f067aa0ba902b7-01-", None),
    (f"ff-{TRACE}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),
    (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),
    (f"00-{TRACE}-{'0' * 16}-01", None),
    (f"00-{TRACE[:-1]}-00f067aa0ba902b7-01", None),
    (f"00_{TRACE}_00f067aa0ba902b7_01", None),
    ("", None),
])
def test_traceparent(value: str, expected: str | None) -> None:
    assert parse_traceparent(value) == expected


def test_only_the_two_headers_pass_and_tracestate_only_with_a_valid_parent() -> None:
    sent = {"traceparent": PARENT, "tracestate": "a=1,b=2", "baggage": "x=y"}
    assert trace_headers(sent.get) == {"traceparent": PARENT, "tracestate": "a=1,b=2"}
    assert trace_headers({"tracestate": "a=1"}.get) == {}
    assert trace_headers({"traceparent": "bad", "tracestate": "a=1"}.get) == {}
    for state in ("", "k=" + "v" * 511, "k=\x01", "k=é"):
        assert trace_headers({"traceparent": PARENT, "tracestate": state}.get) == {"traceparent": PARENT}
    assert trace_id(trace_headers(sent.get)) == TRACE and trace_id({}) is None
