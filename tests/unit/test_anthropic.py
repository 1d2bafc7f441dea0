"""The Anthropic Messages API's pure parts: the turns a request keys by, its errors' shape, and
what an answer (whole or streamed) tells the accountant."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.anthropic import conversation
from proxy.errors import BadRequest, NoHealthyWorker, Overloaded, UpstreamError, to_body
from proxy.records import body_with_rid, wants_usage_hidden
from proxy.request import Dialect, GenerateRequest
from proxy.sse import StreamAccountant, meta_from
from proxy.sse_frames import error_event


def test_system_and_messages_read_as_chat_turns() -> None:
    assert conversation({"max_tokens": 5, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}) == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    msgs = conversation({"max_tokens": 5, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                         "messages": [
                             {"role": "user", "content": [{"type": "text", "text": "q"}]},
                             {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                "input": {"x": 1}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                           "content": "42"}]},
                         ]})
    assert msgs == [{"role": "system", "content": "a\nb"}, {"role": "user", "content": "q"},
                    {"role": "assistant", "content": '{"name": "f", "parameters": {"x": 1}}'}, {"role": "tool", "content": "42"}]


@pytest.mark.parametrize(("payload", "field"), [
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 4, "messages": []}, "messages"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages[0].content[0]"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages[0].content[0].text"),
    ({"max_tokens": 4, "system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
])
def test_malformed_requests_name_their_field(payload: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as e:
        conversation(payload)
    assert e.value.message.startswith(field + ":"), e.value.message


@pytest.mark.parametrize(("err", "kind"), [
    (BadRequest("x"), "invalid_request_error"), (Overloaded("x"), "rate_limit_error"),
    (NoHealthyWorker("x"), "overloaded_error"), (UpstreamError("x"), "api_error"),
])
def test_errors_answer_in_anthropics_shape(err: Exception, kind: str) -> None:
    body = to_body(err, dialect=Dialect.MESSAGES.error_style)  # type: ignore[arg-type]
    assert body.payload == {"type": "error", "error": {"type": kind, "message": "x"}}
    event = error_event(err, "anthropic")  # type: ignore[arg-type]
    assert event.startswith(b"event: error\ndata: ") and b"[DONE]" not in event
    assert json.loads(event.split(b"data: ", 1)[1]) == body.payload


def test_the_rid_rides_along_and_usage_is_never_asked_for() -> None:
    payload = {"max_tokens": 3, "messages": [{"role": "user", "content": "x"}], "stream": True}
    req = GenerateRequest(dialect=Dialect.MESSAGES, payload=payload, stream=True, body=json.dumps(payload).encode())
    assert json.loads(body_with_rid(req, "abc"))["rid"] == "abc"
    assert not wants_usage_hidden(req)  # message_delta carries the usage whatever the caller asked


USAGE = {"input_tokens": 120, "output_tokens": 7, "cache_read_input_tokens": 64}


def test_a_whole_message_gives_its_stop_reason_and_usage() -> None:
    m = meta_from(Dialect.MESSAGES, {"id": "msg_1", "type": "message", "content": [], "stop_reason": "max_tokens",
                                     "usage": USAGE})
    assert (m.finish_reason, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == ("length", 120, 64, 7)
    assert meta_from(Dialect.MESSAGES, {"stop_reason": "end_turn", "usage": USAGE}).finish_reason == "stop"


def _event(kind: str, **body: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body})}\n\n".encode()


def test_a_stream_counts_deltas_as_tokens_and_ends_at_message_stop() -> None:
    acct = StreamAccountant(Dialect.MESSAGES)
    zero = {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
    assert not acct.feed(_event("message_start", message={"id": "msg_1", "usage": zero}) + _event("ping"))
    assert not acct.feed(_event("content_block_start", index=0, content_block={"type": "text", "text": ""}))
    assert acct.feed(_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hel"}))
    assert not acct.feed(_event("content_block_delta", index=0, delta={"type": "text_delta", "text": ""}))
    assert acct.feed(_event("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": "{"}))
    acct.feed(_event("content_block_stop", index=0)
              + _event("message_delta", delta={"stop_reason": "end_turn"}, usage=USAGE))
    assert not acct.done
    acct.feed(_event("message_stop"))
    assert acct.done and acct.error is None and acct.token_events == 2
    m = acct.final()
    assert (m.finish_reason, m.prompt_tokens, m.cached_tokens, m.completion_tokens) == ("stop", 120, 64, 7)


def test_an_error_event_fails_the_stream() -> None:
    acct = StreamAccountant(Dialect.MESSAGES)
    acct.feed(_event("content_block_delta", index=0, delta={"type": "text_delta", "text": "x"}))
    acct.feed(_event("error", error={"type": "api_error", "message": "engine died"}))
    assert acct.error is not None and acct.error["message"] == "engine died"
    assert acct.final().error is not None
