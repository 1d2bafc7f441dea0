"""Pure shaping of the simulated worker's Responses API: bodies, conversations, payloads, the store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.sim import responses_protocol as rp
from proxy.sim import tokenizer
from proxy.sim.protocol import DEFAULT_MAX_NEW_TOKENS, BadRequest, chat_prompt_ids, render_chat
from proxy.sim.responses import ResponseStore, Stored


def test_defaults_follow_sglangs_responses_request() -> None:
    body = rp.parse_body({"input": "hi", "rid": "ignored"})
    assert body.request_id.startswith("resp_") and len(body.request_id) == len("resp_") + 32
    assert (body.store, body.stream, body.background) == (True, False, False)
    assert body.max_output_tokens is None and body.max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert rp.parse_body({"input": "hi"}).request_id != body.request_id
    chosen = rp.parse_body({"input": "hi", "request_id": "resp_x", "max_output_tokens": 0, "store": False,
                            "stop": "halt", "temperature": 1, "metadata": {"k": "v"}})
    assert (chosen.request_id, chosen.max_new_tokens, chosen.store, chosen.stop) == ("resp_x", 0, False, ("halt",))
    assert chosen.temperature == 1.0 and chosen.metadata == {"k": "v"}


@pytest.mark.parametrize("body", [
    None, [], {"input": None}, {"input": 3}, {"input": []}, {"input": ["text"]},
    {"input": [{"role": "user"}]},
    {"input": [{"role": "robot", "content": "x"}]},
    {"input": [{"type": "reasoning", "role": "user", "content": "x"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
    {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
    {"input": "x", "store": "no"}, {"input": "x", "max_output_tokens": 1.5}, {"input": "x", "instructions": 1},
    {"input": "x", "temperature": True}, {"input": "x", "metadata": []}, {"input": "x", "stop": [1]},
])
def test_malformed_bodies_are_refused(body: Any) -> None:
    with pytest.raises(BadRequest):
        rp.parse_body(body)


def test_input_items_become_chat_messages() -> None:
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                             {"type": "text", "text": "b"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "c"}], "id": "msg_1"},
             {"role": "developer", "content": "d"}]
    assert rp.input_messages(items) == [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"},
                                        {"role": "developer", "content": "d"}]
    assert rp.input_messages("plain") == [{"role": "user", "content": "plain"}]


def _response(text: str) -> dict[str, Any]:
    body = rp.parse_body({"input": "q"})
    output = [rp.message_item("msg_1", text, "completed")] if text else []
    return rp.response_object(body, model="m", created_at=1, status="completed", output=output,
                              usage=rp.usage(3, 1, 2))


def test_a_follow_up_puts_the_previous_answer_where_the_assistant_turn_goes() -> None:
    first = rp.parse_body({"input": "q1", "instructions": "sys"})
    first_messages = rp.conversation(first, None)
    assert first_messages == [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]
    follow = rp.parse_body({"input": "q2", "previous_response_id": "resp_1"})
    messages = rp.conversation(follow, (first_messages, _response("the answer")))
    assert messages == [*first_messages, {"role": "assistant", "content": "the answer"},
                        {"role": "user", "content": "q2"}]
    # The prompt of the follow-up extends the first prompt token for token.
    before, after = chat_prompt_ids(first_messages), chat_prompt_ids(messages)
    assert after[: len(before)] == before
    assert after == tokenizer.encode(render_chat(messages))
    # A previous response without output adds no assistant turn.
    assert rp.conversation(follow, (first_messages, _response(""))) == [*first_messages,
                                                                       {"role": "user", "content": "q2"}]


def test_response_object_echoes_the_request_and_usage_adds_up() -> None:
    body = rp.parse_body({"input": "q", "instructions": "i", "max_output_tokens": 9, "top_p": 0.5, "user": "u"})
    done = rp.response_object(body, model="m", created_at=7, status="completed",
                              output=[rp.message_item("msg_1", "t", "completed")], usage=rp.usage(10, 4, 3))
    assert done["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
                             "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
                             "total_tokens": 13}
    assert (done["id"], done["instructions"], done["max_output_tokens"], done["top_p"], done["user"]) == \
        (body.request_id, "i", 9, 0.5, "u")
    assert done["text"] == {"format": {"type": "text"}} and rp.output_text(done) == "t"
    queued = rp.response_object(body, model="m", created_at=7, status="queued", output=[], usage=None)
    assert queued["text"] is None and queued["usage"] is None and rp.output_text(queued) == ""


def test_events_are_named_sse_blocks() -> None:
    event = {**rp.delta_event("msg_1", "hi"), "sequence_number": 4}
    block = rp.sse_event(event)
    assert block.startswith(b"event: response.output_text.delta\ndata: ") and block.endswith(b"\n\n")
    assert json.loads(block.split(b"data: ", 1)[1]) == event
    done = rp.done_events("msg_1", "all of it")
    assert [e["type"] for e in done] == ["response.output_text.done", "response.content_part.done",
                                         "response.output_item.done"]
    assert done[2]["item"]["content"] == [{"type": "output_text", "text": "all of it", "annotations": []}]
    assert rp.item_added_event("msg_1")["item"]["content"] == []


def test_id_errors_are_sglangs() -> None:
    assert rp.id_error("resp_1", known=True) is None
    body, status = rp.id_error("resp_1", known=False) or ({}, 0)
    assert status == 404 and body["message"] == "Response with id 'resp_1' not found."
    body, status = rp.id_error("bad", known=True) or ({}, 0)
    assert status == 400 and body["param"] == "response_id" and "begins with 'resp'" in body["message"]


def test_the_store_drops_the_least_recently_stored_first() -> None:
    store = ResponseStore(2)
    for name in ("a", "b"):
        store.put(name, Stored({"id": name}, []))
    store.put("a", Stored({"id": "a", "v": 2}, []))  # stored again: now the latest
    store.put("c", Stored({"id": "c"}, []))
    assert store.get("b") is None and len(store) == 2
    a = store.get("a")
    assert a is not None and a.response["v"] == 2 and store.get("c") is not None


def test_the_store_bound_is_a_validated_config_field_with_a_flag() -> None:
    from proxy.sim.__main__ import parse_args
    from proxy.sim.config import SimConfig
    from proxy.sim.fleet import cli_args

    with pytest.raises(ValueError, match="responses_store_max"):
        SimConfig(responses_store_max=0).validate()
    config = SimConfig(port=0, responses_store_max=3)
    assert "--responses-store-max" in cli_args(config) and parse_args(cli_args(config)) == config
