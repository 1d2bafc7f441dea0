"""What the relay checks in a worker's events and where it cuts a run (sse_frames: check_events, until_end)."""

from __future__ import annotations

import pytest

from proxy.sse_frames import MalformedEvent, check_events, until_end

EV = b'data: {"text": "a"}\n\n'
DONE = b"data: [DONE]\n\n"
ERR = b'data: {"error": {"message": "x", "code": 500}}\n\n'


@pytest.mark.parametrize("run", [EV, EV * 3, EV + DONE, DONE, b": comment\n\n" + EV, b"event: m\n" + EV,
                                 b'data:{"no": "space"}\n\n', ERR + DONE])
def test_runs_of_json_objects_and_done_pass(run: bytes) -> None:
    check_events(run)


@pytest.mark.parametrize("run", [b"data: not json\n\n", b"data: [1, 2]\n\n", EV + b"data: 42\n\n",
                                 b"event: m\ndata: <html>\n\n", b'data: {"a": 1}\ndata: oops\n\n'])
def test_a_payload_that_is_not_done_nor_an_object_is_malformed(run: bytes) -> None:
    with pytest.raises(MalformedEvent):
        check_events(run)


@pytest.mark.parametrize(("run", "kept"), [
    (EV + DONE, EV + DONE),
    (DONE + EV, DONE),
    (EV + DONE + EV + DONE, EV + DONE),
    (ERR + EV, ERR),
    (EV + ERR + DONE + EV, EV + ERR + DONE),
    (EV, EV),
])
def test_a_run_that_ends_the_stream_is_cut_after_its_end(run: bytes, kept: bytes) -> None:
    assert until_end(run) == kept
