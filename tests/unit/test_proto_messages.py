"""radixgate.v1 messages ⇄ the proxy's GenerateRequest, stage timings and worker snapshots."""

from __future__ import annotations

import json

import grpc
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy.errors import BadRequest, PayloadTooLarge
from proxy.frontends.grpc_messages import (
    final_message,
    stage_timings,
    to_generate_request,
    tokens_added,
    worker_state,
)
from proxy.request import Dialect
from proxy.routing.base import WorkerSnapshot
from proxy.sse import TextDelta
from proxy.timing import RequestTiming

LIMIT = 1000


def convert(msg: pb.GenerateRequest, timeout_s: float | None = None):  # type: ignore[no-untyped-def]
    return to_generate_request(msg, timeout_s=timeout_s, max_prompt_chars=LIMIT)


def test_text_prompt_becomes_a_streamed_native_generate_with_typed_sampling_params() -> None:
    msg = pb.GenerateRequest(
        model="m",
        text="hello",
        sampling=pb.SamplingParams(max_new_tokens=8, temperature=0.0, stop=["\n"], seed=7),
        session_key="s1",
        priority=3,
        request_id="r-1",
    )
    req = convert(msg, timeout_s=2.5)
    assert req.dialect is Dialect.SGLANG
    assert (req.model, req.text, req.input_ids, req.messages) == ("m", "hello", None, None)
    assert (req.session_key, req.priority, req.rid, req.timeout_s) == ("s1", 3, "r-1", 2.5)
    assert req.frontend == "grpc" and req.stream
    assert req.payload == {
        "text": "hello",
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, "stop": ["\n"], "sampling_seed": 7},
        "stream": True,
        "rid": "r-1",
    }


def test_token_ids_prompt_is_forwarded_as_input_ids_without_a_rid_when_none_was_given() -> None:
    req = convert(pb.GenerateRequest(input_ids=pb.TokenIds(ids=[1, 2, 3])))
    assert req.input_ids == [1, 2, 3]
    assert req.payload == {"input_ids": [1, 2, 3], "sampling_params": {}, "stream": True}
    assert req.rid is None and req.session_key is None


def test_chat_prompt_becomes_an_openai_chat_body_with_openai_names() -> None:
    msg = pb.GenerateRequest(
        model="m",
        chat=pb.ChatMessages(messages=[pb.ChatMessage(role="system", content="be brief"),
                                       pb.ChatMessage(role="user", content="hi")]),
        sampling=pb.SamplingParams(max_new_tokens=4, top_k=20, seed=1, extra_json='{"n": 1}'),
    )
    req = convert(msg)
    assert req.dialect is Dialect.CHAT
    assert req.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert req.payload == {
        "model": "m",
        "messages": req.messages,
        "max_tokens": 4,
        "top_k": 20,
        "seed": 1,
        "n": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_the_unary_form_asks_the_worker_for_one_whole_answer() -> None:
    native = to_generate_request(pb.GenerateRequest(text="x"), timeout_s=None, max_prompt_chars=1000, stream=False)
    assert not native.stream and native.payload == {"text": "x", "sampling_params": {}, "stream": False}
    chat = to_generate_request(pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="hi")])),
                               timeout_s=None, max_prompt_chars=1000, stream=False)
    assert not chat.stream and chat.payload["stream"] is False and "stream_options" not in chat.payload


def test_extra_json_passes_other_sampling_params_through_untouched() -> None:
    extra = {"regex": "[a-z]+", "json_schema": None, "custom": {"nested": [1, 2]}}
    req = convert(pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=0.5, extra_json=json.dumps(extra))))
    assert req.payload["sampling_params"] == {"top_p": 0.5, **extra}


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (pb.GenerateRequest(model="m"), "prompt"),
        (pb.GenerateRequest(text=""), "text"),
        (pb.GenerateRequest(input_ids=pb.TokenIds()), "input_ids.ids"),
        (pb.GenerateRequest(input_ids=pb.TokenIds(ids=[5, -1])), "input_ids.ids"),
        (pb.GenerateRequest(chat=pb.ChatMessages()), "chat.messages"),
        (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(content="x")])), "chat.messages[0].role"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(temperature=-1)), "sampling.temperature"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(temperature=float("nan"))), "sampling.temperature"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=0)), "sampling.top_p"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_k=0)), "sampling.top_k"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(min_p=1.5)), "sampling.min_p"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(repetition_penalty=0)), "sampling.repetition_penalty"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(stop_token_ids=[-3])), "sampling.stop_token_ids"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(extra_json="{oops")), "sampling.extra_json"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(extra_json="[1]")), "sampling.extra_json"),
        (pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=0.9, extra_json='{"top_p": 1}')),
         "sampling.extra_json"),
        (pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x")]),
                            sampling=pb.SamplingParams(extra_json='{"stream": false}')), "sampling.extra_json"),
    ],
)
def test_a_bad_argument_is_refused_with_a_message_naming_the_field(msg: pb.GenerateRequest, field: str) -> None:
    with pytest.raises(BadRequest) as info:
        convert(msg)
    assert info.value.message.startswith(f"{field}:")
    assert info.value.grpc_code is grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "msg",
    [
        pb.GenerateRequest(text="x" * (LIMIT + 1)),
        pb.GenerateRequest(input_ids=pb.TokenIds(ids=[1] * (LIMIT + 1))),
        pb.GenerateRequest(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="x" * LIMIT),
                                                          pb.ChatMessage(role="user", content="y")])),
    ],
)
def test_a_prompt_over_the_limit_is_too_large(msg: pb.GenerateRequest) -> None:
    with pytest.raises(PayloadTooLarge):
        convert(msg)


def test_a_prompt_at_the_limit_is_accepted() -> None:
    assert convert(pb.GenerateRequest(text="x" * LIMIT)).text == "x" * LIMIT


def test_every_stage_the_timing_record_names_has_a_field_in_stage_timings() -> None:
    fields = set(pb.StageTimings.DESCRIPTOR.fields_by_name)
    assert {f"{name}_s" for name in RequestTiming(received=0.0).stages()} <= fields


def test_stage_timings_set_only_stages_that_happened() -> None:
    timing = RequestTiming(received=1.0, admitted=1.5, dispatched=1.75)
    out = stage_timings(timing.stages())
    assert out.admission_wait_s == pytest.approx(0.5)
    assert out.proxy_overhead_s == pytest.approx(0.25)
    assert not out.HasField("ttft_s") and not out.HasField("e2e_s")


def test_final_message_reports_tokens_worker_and_timings() -> None:
    final = final_message(
        finish_reason="length", prompt_tokens=10, cached_tokens=None, completion_tokens=4,
        worker="http://w", request_id="r", stages={"e2e": 0.125},
    )
    assert (final.finish_reason, final.prompt_tokens, final.cached_tokens, final.completion_tokens) == (
        "length", 10, 0, 4)
    assert (final.worker, final.request_id, final.timings.e2e_s) == ("http://w", "r", 0.125)


def test_worker_state_leaves_never_scraped_engine_fields_unset() -> None:
    fresh = worker_state(WorkerSnapshot(url="http://a", in_flight=2, models=("m",)))
    assert (fresh.url, fresh.healthy, fresh.in_flight, list(fresh.models)) == ("http://a", True, 2, ["m"])
    assert not fresh.HasField("running") and not fresh.HasField("token_usage")
    scraped = worker_state(WorkerSnapshot(url="http://b", healthy=False, running=3, queued=0, token_usage=0.5,
                                          max_running_requests=8, max_total_tokens=4096, stale=True))
    assert (scraped.healthy, scraped.stale, scraped.running, scraped.queued) == (False, True, 3, 0)
    assert scraped.HasField("queued") and scraped.token_usage == 0.5 and scraped.max_total_tokens == 4096


@pytest.mark.parametrize(
    ("delta", "emitted", "added"),
    [
        (TextDelta("ab", (), completion_tokens=5), 3, 2),  # cumulative count wins
        (TextDelta("", (), completion_tokens=4), 4, 0),  # a usage-only chunk repeating the count
        (TextDelta("", (), completion_tokens=7), 0, 7),  # OpenAI usage chunk after uncounted deltas
        (TextDelta("abc", (11, 12, 13)), 9, 3),  # token ids without a count
        (TextDelta("x"), 2, 1),  # OpenAI delta: one token per chunk
        (TextDelta(""), 2, 0),
    ],
)
def test_tokens_added_by_a_delta(delta: TextDelta, emitted: int, added: int) -> None:
    assert tokens_added(delta, emitted) == added
