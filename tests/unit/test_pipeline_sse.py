"""Stream accounting and event decoding (proxy/sse.py, sse_frames.py) and the forwarded body (rid splice)."""

import json

import pytest

from proxy.errors import UpstreamError
from proxy.pipeline import body_with_rid, error_event
from proxy.records import wants_usage_hidden
from proxy.request import Dialect, GenerateRequest
from proxy.sse import ErrorEvent, EventDecoder, StreamAccountant, TextDelta, first_token_counts, meta_from
from proxy.sse_frames import DONE_EVENT, drop_usage_events, iter_payloads, last_output_payload


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def native_chunk(text: str, ids: list[int], finish: object = None, **meta: object) -> dict[str, object]:
    info = {"id": "r1", "finish_reason": finish, "prompt_tokens": 10, "completion_tokens": len(ids),
            "cached_tokens": 4, **meta}
    return {"text": text, "output_ids": ids, "meta_info": info}


def test_native_stream_marks_every_data_event_and_reads_meta_at_the_end() -> None:
    acct = StreamAccountant(Dialect.SGLANG)
    assert acct.feed(sse(native_chunk("a", [1])))
    assert acct.feed(sse(native_chunk("ab", [1, 2])) + sse(native_chunk("abc", [1, 2, 3], {"type": "length"},
                                                                      queue_time=0.25)))
    assert not acct.feed(b"data: [DONE]\n\n")
    meta = acct.final()
    assert acct.done and acct.token_events == 3
    assert (meta.prompt_tokens, meta.cached_tokens, meta.completion_tokens) == (10, 4, 3)
    assert meta.finish_reason == "length" and meta.queue_time == 0.25


def test_error_event_is_noticed_and_carries_no_token() -> None:
    acct = StreamAccountant(Dialect.SGLANG)
    assert not acct.feed(sse({"error": {"message": "boom", "code": 500}}))
    assert acct.error == {"message": "boom", "code": 500}
    assert acct.final().error is not None


def test_openai_role_only_and_usage_chunks_are_not_tokens() -> None:
    acct = StreamAccountant(Dialect.CHAT)
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    word = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
    usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1,
                                      "prompt_tokens_details": {"cached_tokens": 5}}}
    assert not acct.feed(sse(role))
    assert acct.feed(sse(word))
    assert not acct.feed(sse(usage) + b"data: [DONE]\n\n")
    meta = acct.final()
    assert (meta.prompt_tokens, meta.cached_tokens, meta.completion_tokens) == (7, 5, 1)
    assert meta.finish_reason == "stop"


def test_comments_and_other_fields_are_skipped() -> None:
    assert iter_payloads(b": keep-alive\n\nevent: x\ndata: 1\n\n") == [b"1"]


def test_decoder_turns_cumulative_native_text_into_deltas() -> None:
    dec = EventDecoder(Dialect.SGLANG)
    events = dec.decode(sse(native_chunk("Hel", [1])) + sse(native_chunk("Hello", [1, 2])) + b"data: [DONE]\n\n")
    assert events == [TextDelta("Hel", (1,), 1), TextDelta("lo", (2,), 2)]


def test_decoder_accepts_incremental_native_chunks() -> None:
    dec = EventDecoder(Dialect.SGLANG)
    first = {"text": "Hel", "output_ids": [1], "meta_info": {"completion_tokens": 1}}
    second = {"text": "lo", "output_ids": [2], "meta_info": {"completion_tokens": 2}}
    assert dec.decode(sse(first) + sse(second)) == [TextDelta("Hel", (1,), 1), TextDelta("lo", (2,), 2)]


def test_decoder_reports_errors_and_openai_deltas() -> None:
    dec = EventDecoder(Dialect.COMPLETIONS)
    out = dec.decode(sse({"choices": [{"text": "x"}]}) + sse({"error": {"message": "gone", "code": 502}}))
    assert out == [TextDelta("x"), ErrorEvent("gone", 502)]


def test_meta_from_a_non_stream_openai_body() -> None:
    body = {"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    m = meta_from(Dialect.CHAT, body)
    assert (m.prompt_tokens, m.completion_tokens, m.cached_tokens, m.finish_reason) == (3, 2, None, "length")


def test_mid_stream_error_event_is_valid_sse_and_ends_with_done() -> None:
    raw = error_event(UpstreamError("worker died"))
    payloads = iter_payloads(raw)
    assert json.loads(payloads[0])["error"]["message"] == "worker died"
    assert payloads[-1] == b"[DONE]"


def request(body: bytes, **kw: object) -> GenerateRequest:
    return GenerateRequest(dialect=Dialect.SGLANG, payload=json.loads(body), body=body, **kw)  # type: ignore[arg-type]


def test_rid_is_spliced_into_the_callers_own_bytes() -> None:
    body = b'  {"text": "hi",   "sampling_params": {"max_new_tokens": 3}}'
    out = body_with_rid(request(body), "abc")
    assert out.endswith(body[3:])  # everything the caller sent is still there, byte for byte
    assert json.loads(out) == {"rid": "abc", "text": "hi", "sampling_params": {"max_new_tokens": 3}}


def test_a_caller_rid_is_forwarded_unchanged() -> None:
    body = b'{"text":"hi","rid":"mine"}'
    assert body_with_rid(request(body, rid="mine"), None) == body


@pytest.mark.parametrize("body", [b'{"text":["a","b"]}', b'{"input_ids":[[1,2],[3]]}'])
def test_batches_are_forwarded_without_a_rid(body: bytes) -> None:
    assert body_with_rid(request(body), "abc") == body


def test_payload_without_bytes_is_serialised_with_the_rid() -> None:
    req = GenerateRequest(dialect=Dialect.CHAT, payload={"messages": [{"role": "user", "content": "x"}]})
    assert json.loads(body_with_rid(req, "r")) == {"messages": [{"role": "user", "content": "x"}], "rid": "r"}


def test_native_events_are_counted_per_event_even_when_coalesced() -> None:
    acct = StreamAccountant(Dialect.SGLANG)
    tricky = native_chunk("she wrote data: x", [1, 2])  # "data:" inside the text is not an event
    run = sse(native_chunk("a", [1])) + sse(tricky) + sse(native_chunk("abc", [1, 2, 3], "stop")) + b"data: [DONE]\n\n"
    assert acct.feed(run)
    assert (acct.events, acct.token_events, acct.done) == (4, 3, True)
    assert acct.final().completion_tokens == 3


def test_an_error_event_after_tokens_in_one_run_is_seen() -> None:
    acct = StreamAccountant(Dialect.SGLANG)
    assert acct.feed(sse(native_chunk("a", [1])) + sse({"error": {"message": "x", "code": 503}}))
    assert acct.token_events == 1 and acct.error == {"message": "x", "code": 503}
    meta = acct.final()
    assert meta.completion_tokens == 1 and meta.error is not None


def test_the_last_output_payload_is_found_from_the_end_of_a_run() -> None:
    run = (b'data: {"n":1}\n\n' b'event: x\ndata: {"n":2}\nid: 7\n\n' b": keep-alive\n\n"
           b'data: {"error":{"message":"m"}}\n\n' b"data: [DONE]\n\n")
    assert last_output_payload(run) == b'{"n":2}'
    assert last_output_payload(run) == [p for p in iter_payloads(run) if p.startswith(b'{"n"')][-1]
    assert last_output_payload(b"data: [DONE]\n\n") is None
    assert last_output_payload(b"") is None


def test_done_written_by_the_model_is_text_not_the_end_of_the_stream() -> None:
    acct = StreamAccountant(Dialect.SGLANG)
    quoting = native_chunk("the server sends data: [DONE] at the end", [1, 2])
    assert acct.feed(sse(native_chunk("a", [1])) + sse(quoting))
    assert not acct.done
    assert acct.feed(sse(native_chunk("b", [1, 2, 3])) + b"data: [DONE]\n\n")
    assert acct.done and acct.token_events == 3
    starts_with_done = StreamAccountant(Dialect.SGLANG)
    assert not starts_with_done.feed(b"data: [DONE]\n\n") and starts_with_done.done


def test_first_token_counts_come_from_the_first_native_event() -> None:
    first = {"text": "a", "meta_info": {"prompt_tokens": 120, "cached_tokens": 96, "completion_tokens": 1}}
    second = {"text": "ab", "meta_info": {"prompt_tokens": 120, "cached_tokens": 0, "completion_tokens": 2}}
    data = f"data: {json.dumps(first)}\n\ndata: {json.dumps(second)}\n\n".encode()
    assert first_token_counts(Dialect.SGLANG, data) == (120, 96)


@pytest.mark.parametrize("dialect", [Dialect.COMPLETIONS, Dialect.CHAT])
def test_openai_streams_report_no_counts_at_the_first_token(dialect: Dialect) -> None:
    data = b'data: {"choices": [{"text": "a", "index": 0}], "usage": {"prompt_tokens": 3}}\n\n'
    assert first_token_counts(dialect, data) == (None, None)


@pytest.mark.parametrize("data", [b"data: {not json\n\n", b"data: [1, 2]\n\n", b'data: {"text": "a"}\n\n',
                                  b"data: [DONE]\n\n"])
def test_first_token_counts_of_odd_native_events_are_unknown(data: bytes) -> None:
    assert first_token_counts(Dialect.SGLANG, data) == (None, None)


@pytest.mark.parametrize("ids", [[1e999], ["7"], [1.5], [True]])
def test_output_ids_that_are_not_integers_are_a_value_error(ids: list[object]) -> None:
    with pytest.raises(ValueError, match="output_ids"):
        EventDecoder(Dialect.SGLANG).decode(sse({"text": "a", "output_ids": ids, "meta_info": {}}))


def test_an_openai_stream_that_did_not_ask_for_usage_asks_the_worker_for_it() -> None:
    body = b'{"model":"m","prompt":"hi","stream":true}'
    req = GenerateRequest(dialect=Dialect.COMPLETIONS, payload=json.loads(body), body=body, stream=True)
    assert wants_usage_hidden(req)
    out = body_with_rid(req, "r", ask_usage=True)
    assert out.endswith(body[1:])  # spliced: the caller's bytes stay as they were
    assert json.loads(out) == {**json.loads(body), "rid": "r", "stream_options": {"include_usage": True}}


def test_a_callers_own_stream_options_are_merged_not_duplicated() -> None:
    body = b'{"prompt":"hi","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}'
    req = GenerateRequest(dialect=Dialect.COMPLETIONS, payload=json.loads(body), body=body, stream=True)
    assert wants_usage_hidden(req)
    out = body_with_rid(req, None, ask_usage=True)
    assert out.count(b"stream_options") == 1
    # Per-chunk usage stays off: without include_usage the caller would have had none.
    assert json.loads(out)["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}


@pytest.mark.parametrize(("dialect", "payload", "hidden"), [
    (Dialect.CHAT, {"stream": True}, True),
    (Dialect.CHAT, {"stream": True, "stream_options": {"include_usage": True}}, False),
    (Dialect.CHAT, {"stream": False}, False),
    (Dialect.SGLANG, {"stream": True}, False),
    (Dialect.COMPLETIONS, {"stream": True, "stream_options": "bad"}, False),
])
def test_which_streams_get_usage_asked_for_and_hidden(dialect: Dialect, payload: dict[str, object],
                                                       hidden: bool) -> None:
    req = GenerateRequest(dialect=dialect, payload=payload, stream=bool(payload["stream"]))
    assert wants_usage_hidden(req) is hidden


def test_usage_only_chunks_are_dropped_and_everything_else_kept() -> None:
    text = b'data: {"choices":[{"index":0,"text":"a","finish_reason":"length"}],"usage":null}\n\n'
    usage = b'data: {"id":"x","choices": [],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    assert drop_usage_events(text + usage + DONE_EVENT) == text + DONE_EVENT
    assert drop_usage_events(usage) == b""
    assert drop_usage_events(text) is text
    # A completion whose text says "choices":[] is output, not a usage chunk.
    tricky = b'data: {"choices":[{"index":0,"text":"\\"choices\\":[]"}],"usage":null}\n\n'
    assert drop_usage_events(tricky + DONE_EVENT) == tricky + DONE_EVENT
