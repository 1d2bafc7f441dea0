"""Pure shaping of the simulated worker's Anthropic Messages API: bodies, conversations, payloads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.sim import messages_protocol as mp
from proxy.sim import tokenizer
from proxy.sim.protocol import BadRequest, chat_prompt_ids, render_chat
from proxy.sim.scheduler import SimRequest

BASE = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def test_a_body_keeps_its_settings_and_names_its_rid() -> None:
    body = mp.parse_body({**BASE, "stop_sequences": ["halt", "end"], "stream": True, "rid": "r1",
                          "temperature": 0.5, "top_p": 1, "top_k": 40})
    assert (body.rid, body.model, body.max_tokens, body.stream, body.stop) == ("r1", "m", 8, True, ("halt", "end"))
    fresh, other = mp.parse_body(BASE), mp.parse_body({**BASE, "rid": 7})  # a non-string rid is not a name
    assert len(fresh.rid) == 32 and int(fresh.rid, 16) >= 0 and other.rid != fresh.rid
    assert fresh.stream is False and fresh.stop == () and fresh.system is None


def test_count_tokens_bodies_need_no_max_tokens() -> None:
    counting = {k: v for k, v in BASE.items() if k != "max_tokens"}
    assert mp.parse_body(counting, counting=True).messages == [{"role": "user", "content": "hi"}]
    with pytest.raises(BadRequest, match="max_tokens"):
        mp.parse_body(counting)


@pytest.mark.parametrize("body", [
    None, [], {**BASE, "model": None}, {**BASE, "model": ""},
    {**BASE, "max_tokens": 0}, {**BASE, "max_tokens": -3}, {**BASE, "max_tokens": 1.5}, {**BASE, "max_tokens": True},
    {**BASE, "max_tokens": "8"}, {**BASE, "messages": []}, {**BASE, "messages": "hi"},
    {**BASE, "messages": [{"role": "system", "content": "x"}]}, {**BASE, "messages": [{"role": "user"}]},
    {**BASE, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
    {**BASE, "messages": [{"role": "user", "content": ["text"]}]},
    {**BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
    {**BASE, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": 5}]}]},
    {**BASE, "system": 5}, {**BASE, "system": [{"type": "text", "text": None}, "x"]},
    {**BASE, "stream": "yes"}, {**BASE, "stop_sequences": "halt"}, {**BASE, "stop_sequences": [1]},
    {**BASE, "temperature": "hot"}, {**BASE, "top_k": False},
])
def test_malformed_bodies_are_refused(body: Any) -> None:
    with pytest.raises(BadRequest):
        mp.parse_body(body)


def _chat(**extra: Any) -> list[dict[str, Any]]:
    return mp.chat_messages(mp.parse_body({**BASE, **extra}))


def test_the_system_prompt_comes_first_as_a_string_or_joined_text_blocks() -> None:
    assert _chat(system="be brief")[0] == {"role": "system", "content": "be brief"}
    blocks = [{"type": "text", "text": "one"}, {"type": "image", "source": {}}, {"type": "text", "text": "two"}]
    assert _chat(system=blocks) == [{"role": "system", "content": "one\ntwo"}, {"role": "user", "content": "hi"}]
    assert _chat(system="") == _chat(system=[]) == _chat() == [{"role": "user", "content": "hi"}]


def test_text_blocks_join_as_chat_parts_and_a_single_one_is_a_string() -> None:
    one = [{"role": "user", "content": [{"type": "text", "text": "solo"}]}]
    assert _chat(messages=one) == [{"role": "user", "content": "solo"}]
    several = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image", "source": {"url": "u"}},
                                            {"type": "text", "text": ""}, {"type": "text", "text": "b"}]}]
    [message] = _chat(messages=several)
    assert message["role"] == "user" and [p["text"] for p in message["content"]] == ["a", "b"]
    # The chat path joins the parts with one space: the same prompt as the text "a b".
    assert render_chat([message]) == render_chat([{"role": "user", "content": "a b"}])
    nothing = [{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "thinking"}]}]
    assert _chat(messages=nothing) == [{"role": "user", "content": "q"}]  # nothing to render: dropped


def test_tool_use_is_assistant_text_and_tool_results_are_tool_turns() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": "let me look"},
                                          {"type": "tool_use", "id": "t1", "name": "get", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"},
                                     {"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]},
                                     {"type": "tool_result", "tool_use_id": "t3"},
                                     {"type": "text", "text": "thanks"}]},
        {"role": "assistant", "content": [{"type": "tool_result", "content": [{"type": "text", "text": "p"},
                                                                              {"type": "text", "text": "q"}]}]},
    ]
    out = _chat(messages=messages)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "tool", "tool", "user", "assistant"]
    call = out[1]["content"][1]["text"]
    assert out[1]["content"][0]["text"] == "let me look"
    assert json.loads(call) == {"name": "get", "parameters": {"city": "Oslo"}}
    assert out[2]["content"] == "rain" and out[4]["content"] == ""
    assert [p["text"] for p in out[3]["content"]] == ["x", "y"]
    assert out[5]["content"] == "thanks"  # after the tool turns its blocks came with
    assert out[6]["content"] == "Tool result: p\nq"  # an assistant's tool_result stays its own text


def test_the_prompt_is_the_chat_prompt_of_the_same_conversation() -> None:
    body = mp.parse_body({**BASE, "system": [{"type": "text", "text": "sys"}],
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "q one"}]},
                                       {"role": "assistant", "content": "a one"},
                                       {"role": "user", "content": "q two"}]})
    chat = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q one"},
            {"role": "assistant", "content": "a one"}, {"role": "user", "content": "q two"}]
    assert chat_prompt_ids(mp.chat_messages(body)) == chat_prompt_ids(chat) == tokenizer.encode(render_chat(chat))


def _finished(reason: dict[str, Any]) -> SimRequest:
    req = SimRequest(rid="r", input_ids=[1, 2], max_new_tokens=4)
    req.state, req.finish_reason = "finished", reason
    return req


def test_stop_reasons_follow_the_finish_reason() -> None:
    assert mp.stop_reason(_finished({"type": "length", "length": 4})) == ("max_tokens", None)
    assert mp.stop_reason(_finished({"type": "stop", "matched": "halt"})) == ("stop_sequence", "halt")
    assert mp.stop_reason(_finished({"type": "stop", "matched": 128009})) == ("end_turn", None)  # an EOS id
    abort = {"type": "abort", "message": "Aborted by request.", "status_code": None, "err_type": None}
    assert mp.stop_reason(_finished(abort)) == ("end_turn", None)


def test_a_message_object_has_anthropics_shape() -> None:
    tokens = mp.usage(10, 3, 4)
    assert tokens == {"input_tokens": 10, "output_tokens": 3, "cache_read_input_tokens": 4}
    message = mp.message_object("msg_1", "m", "the cat", "end_turn", None, tokens)
    assert message == {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                       "content": [{"type": "text", "text": "the cat"}], "stop_reason": "end_turn",
                       "stop_sequence": None, "usage": tokens}
    assert mp.message_object("msg_1", "m", "", "end_turn", None, tokens)["content"] == []
    assert mp.new_message_id().startswith("msg_") and mp.new_message_id() != mp.new_message_id()


def test_stream_events() -> None:
    start = mp.message_start_event("msg_1", "m")
    assert start["type"] == "message_start" and start["message"]["content"] == []
    assert start["message"]["stop_reason"] is None and start["message"]["stop_sequence"] is None
    assert start["message"]["usage"] == {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
    assert mp.block_start_event() == {"type": "content_block_start", "index": 0,
                                      "content_block": {"type": "text", "text": ""}}
    assert mp.text_delta_event("x") == {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": "x"}}
    assert mp.block_stop_event() == {"type": "content_block_stop", "index": 0}
    assert mp.message_delta_event("stop_sequence", "s", mp.usage(1, 2, 0)) == {
        "type": "message_delta", "delta": {"stop_reason": "stop_sequence", "stop_sequence": "s"},
        "usage": {"input_tokens": 1, "output_tokens": 2, "cache_read_input_tokens": 0}}
    assert mp.message_stop_event() == {"type": "message_stop"}
    assert mp.error_event("gone") == {"type": "error", "error": {"type": "api_error", "message": "gone"}}


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (404, "not_found_error"),
                                              (503, "overloaded_error"), (500, "api_error"), (502, "api_error")])
def test_error_bodies_name_anthropics_error_types(status: int, kind: str) -> None:
    assert mp.error_body("why", status) == {"type": "error", "error": {"type": kind, "message": "why"}}
