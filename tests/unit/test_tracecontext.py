"""W3C Trace Context as a receiver reads it and passes it on (proxy/tracecontext.py, pure)."""

from __future__ import annotations

import pytest

from proxy.tracecontext import TraceContext, from_headers, parse_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


@pytest.mark.parametrize("value, expected", [
    (PARENT, TraceContext(TRACE, SPAN, 1)),
    (f" {PARENT}\t", TraceContext(TRACE, SPAN, 1)),  # optional whitespace around a header value
    (f"cc-{TRACE}-{SPAN}-09-what-a-later-version-adds", TraceContext(TRACE, SPAN, 9)),
    (f"cc-{TRACE}-{SPAN}-00", TraceContext(TRACE, SPAN, 0)),
    (f"00-{TRACE}-{SPAN}-01-", None),
    (f"ff-{TRACE}-{SPAN}-01", None),
    (f"00-{TRACE.upper()}-{SPAN}-01", None),
    (f"00-{'0' * 32}-{SPAN}-01", None),
    (f"00-{TRACE}-{'0' * 16}-01", None),
    (f"00-{TRACE[:-1]}-{SPAN}-01", None),
    (f"00_{TRACE}_{SPAN}_01", None),
    ("", None),
])
def test_traceparent(value: str, expected: TraceContext | None) -> None:
    assert parse_traceparent(value) == expected


def test_only_the_two_headers_pass_and_tracestate_only_with_a_valid_parent() -> None:
    sent = {"traceparent": PARENT, "tracestate": "a=1,b=2", "baggage": "x=y"}
    ctx = from_headers(sent.get)
    assert ctx is not None and ctx.headers() == {"traceparent": PARENT, "tracestate": "a=1,b=2"}
    assert from_headers({"tracestate": "a=1"}.get) is None
    assert from_headers({"traceparent": "bad", "tracestate": "a=1"}.get) is None
    for state in ("", "k=" + "v" * 511, "k=\x01", "k=é"):
        got = from_headers({"traceparent": PARENT, "tracestate": state}.get)
        assert got is not None and got.headers() == {"traceparent": PARENT}
    # A later version is passed on as version 00, flags kept.
    later = from_headers({"traceparent": f"cc-{TRACE}-{SPAN}-09-more"}.get)
    assert later is not None and later.headers() == {"traceparent": f"00-{TRACE}-{SPAN}-09"}


def test_radixgates_own_span_takes_the_callers_place_as_the_workers_parent() -> None:
    caller = TraceContext(TRACE, SPAN, 0, state="a=1")
    own = caller.child("1111111111111111", sampled=True)
    assert (own.own, own.parent_id, own.sampled, own.trace_id) == (True, SPAN, True, TRACE)
    assert own.headers() == {"traceparent": f"00-{TRACE}-1111111111111111-01", "tracestate": "a=1"}
    assert not TraceContext(TRACE, SPAN, 1).child("2222222222222222", sampled=False).sampled
