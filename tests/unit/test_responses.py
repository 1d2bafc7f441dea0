"""The Responses API's pure parts: the conversation a request keys by, ids, where responses live,
and what a Responses answer (whole or streamed) tells the accountant."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.errors import BadRequest
from proxy.records import body_with_rid, wants_usage_hidden
from proxy.request import Dialect, GenerateRequest
from proxy.responses import ResponseHomes, check_id, conversation
from proxy.sse import StreamAccountant, meta_from


def test_instructions_and_a_string_input_read_as_a_system_and_a_user_turn() -> None:
    assert conversation({"instructions": "be brief", "input": "hi"}) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert conversation({"input": "hi"}) == [{"role": "user", "content": "hi"}]


def test_input_items_become_chat_turns_and_parts_their_text() -> None:
    msgs = conversation({"input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "x"},
        {"type": "function_call_output", "call_id": "x", "output": "42"},
    ]})
    assert msgs == [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                    {"role": "assistant", "content": "f({})"}, {"role": "tool", "content": "42"}]
    # A part without text keys by its JSON: two different images do not share a key.
    one = conversation({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u1"}]}]})
    two = conversation({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u2"}]}]})
    assert one != two


@pytest.mark.parametrize(("payload", "field"), [
    ({}, "input"), ({"input": []}, "input"), ({"input": 3}, "input"), ({"input": ["x"]}, "input[0]"),
    ({"input": [{"role": 5, "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    ({"input": [{"role": "user", "content": ["x"]}]}, "input[0].content[0]"),
    ({"input": "x", "instructions": 1}, "instructions"), ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "background": True, "stream": True}, "background"),
])
def test_malformed_requests_name_their_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as e:
        conversation(payload)
    assert e.value.message.startswith(field + ":"), e.value.message


@pytest.mark.parametrize("bad", ["", "a/b", "resp_1?x", "../x", "x" * 257, 7, None, "résp"])
def test_ids_that_could_not_travel_in_a_path_are_refused(bad: Any) -> None:
    with pytest.raises(BadRequest):
        check_id("response_id", bad)
    assert check_id("response_id", "resp_0aZ-._") == "resp_0aZ-._"


def test_homes_forget_the_least_recently_used_first() -> None:
    homes = ResponseHomes(2)
    homes.remember("a", "w1")
    homes.remember("b", "w2")
    assert homes.home("a") == "w1"  # a is used: b is now the oldest
    homes.remember("c", "w1")
    assert (homes.home("a"), homes.home("b"), homes.home("c")) == ("w1", None, "w1")
    homes.forget("a")
    assert homes.home("a") is None and len(homes) == 1
    with pytest.raises(ValueError):
        ResponseHomes(0)


def _req(**payload: Any) -> GenerateRequest:
    return GenerateRequest(dialect=Dialect.RESPONSES, payload=payload, stream=bool(payload.get("stream")),
                           body=json.dumps(payload).encode())


def test_the_request_id_is_the_rid_a_responses_worker_takes_and_usage_is_never_asked_for() -> None:
    req = _req(input="hi", stream=True)
    sent = json.loads(body_with_rid(req, "resp_abc"))
    assert sent["request_id"] == "resp_abc" and "rid" not in sent
    assert not wants_usage_hidden(req)  # response.completed carries usage whatever the caller asked
    assert Dialect.RESPONSES.new_rid().startswith("resp_") and Dialect.CHAT.new_rid()[:5] != "resp_"


USAGE = {"input_tokens": 120, "input_tokens_details": {"cached_tokens": 64, "cache_write_tokens": 0},
         "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 127}


def test_a_whole_answer_gives_its_id_status_and_usage() -> None:
    m = meta_from(Dialect.RESPONSES, {"id": "resp_1", "object": "response", "status": "completed", "usage": USAGE})
    assert (m.response_id, m.finish_reason, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == (
        "resp_1", "completed", 120, 64, 7)
    cut = meta_from(Dialect.RESPONSES, {"id": "resp_2", "status": "incomplete",
                                        "incomplete_details": {"reason": "max_output_tokens"}})
    assert cut.finish_reason == "length"
    queued = meta_from(Dialect.RESPONSES, {"id": "resp_3", "status": "queued", "usage": None})
    assert queued.finish_reason is None and queued.prompt_tokens is None


def _event(kind: str, n: int, **body: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': n, **body})}\n\n".encode()


def test_a_stream_counts_deltas_as_tokens_and_ends_at_response_completed() -> None:
    acct = StreamAccountant(Dialect.RESPONSES)
    start = {"id": "resp_9", "status": "in_progress", "usage": None}
    assert not acct.feed(_event("response.created", 0, response=start) + _event("response.in_progress", 1,
                                                                                response=start))
    assert not acct.feed(_event("response.output_item.added", 2, item={"type": "message"}))
    assert acct.feed(_event("response.output_text.delta", 3, delta="Hel"))
    assert not acct.feed(_event("response.output_text.delta", 4, delta=""))  # an empty delta: no token
    assert acct.feed(_event("response.output_text.delta", 5, delta="lo") + _event("response.output_text.done", 6,
                                                                                  text="Hello"))
    assert not acct.done
    acct.feed(_event("response.completed", 7, response={**start, "status": "completed", "usage": USAGE}))
    assert acct.done and acct.error is None and acct.token_events == 2
    m = acct.final()
    assert (m.response_id, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == ("resp_9", 120, 64, 7)


@pytest.mark.parametrize("end", [
    _event("error", 3, code=500, message="engine died", param=None),
    b'data: {"error": {"message": "engine died", "code": 500}}\n\n',
    _event("response.failed", 3, response={"id": "resp_9", "status": "failed",
                                           "error": {"code": "server_error", "message": "engine died"}}),
])
def test_a_stream_that_fails_ends_with_its_error(end: bytes) -> None:
    acct = StreamAccountant(Dialect.RESPONSES)
    acct.feed(_event("response.output_text.delta", 2, delta="x"))
    acct.feed(end)
    assert acct.error is not None and "engine died" in str(acct.error.get("message"))
    assert acct.final().error is not None


def test_output_sent_whole_at_the_end_marks_its_first_token_there() -> None:
    acct = StreamAccountant(Dialect.RESPONSES)
    assert not acct.feed(_event("response.created", 0, response={"id": "resp_1", "status": "in_progress"}))
    assert acct.feed(_event("response.completed", 1, response={"id": "resp_1", "status": "completed", "usage": USAGE}))
    empty = StreamAccountant(Dialect.RESPONSES)  # nothing generated: no token to mark
    assert not empty.feed(_event("response.completed", 0, response={"id": "resp_2", "status": "completed",
                                                                     "usage": {**USAGE, "output_tokens": 0}}))
