"""RunReader (proxy/frontends/grpc_deltas.py) reads runs exactly as json.loads + EventDecoder does."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.frontends.grpc_deltas import RunRead, RunReader
from proxy.frontends.grpc_messages import tokens_added
from proxy.request import Dialect
from proxy.sse import ErrorEvent, EventDecoder


def reference(dialect: Dialect, runs: list[bytes]) -> list[RunRead | type[Exception]]:
    """What the frontend computed before: json.loads every event, then tokens_added per delta."""
    decoder, emitted, out = EventDecoder(dialect), 0, []
    for data in runs:
        try:
            events = decoder.decode(data)
        except (ValueError, TypeError) as e:
            out.append(type(e))
            break
        parts, tokens, error = [], 0, None
        for event in events:
            if isinstance(event, ErrorEvent):
                error = event
                break
            added = tokens_added(event, emitted)
            emitted += added
            tokens += added
            parts.append(event.text)
        out.append(RunRead("".join(parts), tokens, error))
    return out


def fast(dialect: Dialect, runs: list[bytes]) -> list[RunRead | type[Exception]]:
    reader, out = RunReader(dialect), []
    for data in runs:
        try:
            out.append(reader.read(data))
        except (ValueError, TypeError) as e:
            out.append(type(e))
            break
    return out


def sse(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"


def native(text: str, ids: list[int], completion: int | None = None, **extra: Any) -> bytes:
    info: dict[str, Any] = {"id": "r1", "finish_reason": None, "prompt_tokens": 5, "cached_tokens": 0}
    if completion is not None:
        info["completion_tokens"] = completion
    obj = {"text": text, "output_ids": ids, "meta_info": info, **extra}
    return json.dumps(obj, separators=(",", ":")).encode("utf-8", "surrogatepass")


def cumulative(words: list[str], **extra: Any) -> list[bytes]:
    return [native("".join(words[: i + 1]), list(range(1, i + 2)), i + 1, **extra) for i in range(len(words))]


def test_a_cumulative_native_stream_becomes_per_run_deltas_and_token_counts() -> None:
    chunks = cumulative(["Hel", "lo", " wor", "ld"])
    runs = [sse(chunks[0]), sse(chunks[1]) + sse(chunks[2]), sse(chunks[3]) + b"data: [DONE]\n\n"]
    assert fast(Dialect.SGLANG, runs) == [RunRead("Hel", 1, None), RunRead("lo wor", 2, None),
                                          RunRead("ld", 1, None)]


@pytest.mark.parametrize("words", [
    ["line\n", "two \"quoted\"", " back\\slash"],  # escapes in new text: the reference path
    ["caf\u00e9 ", "na\u00efve ", "\U0001f600"],  # raw UTF-8 (and ensure_ascii below)
    ["\ud83d", "\ude00 pair split over chunks"],  # lone surrogates: json combines escaped pairs
    ["", "", "x"],  # empty chunks
])
@pytest.mark.parametrize("ensure_ascii", [False, True])
def test_awkward_text_reads_as_json_loads_reads_it(words: list[str], ensure_ascii: bool) -> None:
    chunks = [json.dumps(json.loads(c), ensure_ascii=ensure_ascii).encode("utf-8", "surrogatepass")
              for c in cumulative(words)]
    runs = [sse(c) for c in chunks] + [b"".join(sse(c) for c in chunks)]
    assert fast(Dialect.SGLANG, runs) == reference(Dialect.SGLANG, runs)


@pytest.mark.parametrize("case", [
    b'{"text":"a","output_ids":[1],"meta_info":{"completion_tokens":1},"text":"zz"}',  # repeated key
    b'{"text":"a","output_ids":[1],"error":{"message":"boom","code":503}}',  # error beside text
    b'{"text":"a","output_ids":[1.5],"meta_info":{}}',  # not an integer id
    b'{"text":"a","output_ids":[01],"meta_info":{}}',  # not JSON
    b'{"text":"a","output_ids":[1,"x"],"meta_info":{}}',  # int("x") raises
    b'{"text":"a","output_ids":[1,null],"meta_info":{}}',  # int(None) raises
    b'{"text":"a\x01","output_ids":[1],"meta_info":{}}',  # raw control character
    b'{"text":"a","output_ids":[1],}',  # trailing comma
    b'{"text":"a","output_ids":[1],"meta_info":{"completion_tokens":true}}',  # a bool is no count
    b'{"text":"a","output_ids":[1]}',
    b'{"text":"a\xff","output_ids":[1],"meta_info":{}}',  # not UTF-8
    b'{"error":{"message":"queue full","code":503}}',
    b'[1, 2]',
])
def test_odd_chunks_after_a_good_one_read_as_the_reference_reads_them(case: bytes) -> None:
    runs = [sse(native("a", [1], 1)), sse(case), sse(native("ab", [1, 2], 2))]
    assert fast(Dialect.SGLANG, runs) == reference(Dialect.SGLANG, runs)


@pytest.mark.parametrize("runs", [
    [sse(native("a", [1], 1)), sse(native("ab", [1, 2], 5)),  # more ids than tokens counted
     sse(b'{"text":"abc","output_ids":[1,2,"x"],"meta_info":{"completion_tokens":3}}')],
    [sse(native("a", [1, 2], 5)), sse(native("ab", [1], 1)),  # an id list that shrank
     sse(b'{"text":"abc","output_ids":[1,"x",3],"meta_info":{"completion_tokens":3}}')],
    [sse(native("", [], 0)), sse(b'{"text":"a","output_ids":["x"],"meta_info":{}}')],  # after an empty list
])
def test_ids_already_counted_are_not_converted_again_as_in_the_reference(runs: list[bytes]) -> None:
    """EventDecoder converts (and may fail on) only the ids past the ones it has counted; odd id lists
    move that mark, and the fast path keeps it where the reference has it."""
    expected = reference(Dialect.SGLANG, runs)
    assert fast(Dialect.SGLANG, runs) == expected
    assert expected[-1] in (RunRead("c", 0, None), ValueError)


def meta_stream(meta: str, counts: tuple[str, ...] = ("1", "2", "3", "4")) -> list[bytes]:
    """Cumulative chunks whose meta_info is ``meta`` with {i} = each of ``counts`` in turn."""
    return [sse(b'{"text":"%s","output_ids":[%s],"meta_info":%s}' % (
        ("ab" * i).encode(), ",".join(["7"] * i).encode(), meta.replace("{i}", count).encode()))
        for i, count in enumerate(counts, 1)]


@pytest.mark.parametrize("counts", [("1", "2", "3", "4"), ("1", "2", "2.5", "-0"), ("1", "2", '"3"', "null")])
def test_a_count_slot_holding_something_else_is_read_by_json(counts: tuple[str, ...]) -> None:
    runs = meta_stream('{"completion_tokens":{i}}', counts)
    assert fast(Dialect.SGLANG, runs) == reference(Dialect.SGLANG, runs)


@pytest.mark.parametrize("meta", [
    '{"completion_tokens":{i}}',  # the usual: only the count changes, read from the template
    '{"completion_tokens":{i},"id":"r"}',
    '{"x":{"completion_tokens":{i}},"completion_tokens":1}',  # a nested key of the same name varies
    '{"completion_tokens":1,"x":{"completion_tokens":{i}}}',
    '{"completion\\u005ftokens":1,"x":{"completion_tokens":{i}}}',  # the real key escaped
    '{"completion_tokens":{i}.0}',  # a float is no count
    '{"x":{"completion_tokens":{i}}}',  # no count of meta_info's own
    '{"completion_tokens" : {i} }',
])
def test_a_meta_info_template_is_used_only_where_it_reads_meta_infos_own_count(meta: str) -> None:
    runs = meta_stream(meta)
    expected = reference(Dialect.SGLANG, runs)
    assert fast(Dialect.SGLANG, runs) == expected
    assert [r.text for r in expected if isinstance(r, RunRead)] == ["ab"] * 4


def test_an_error_event_ends_the_run_and_what_came_before_it_is_kept() -> None:
    runs = [sse(native("a", [1], 1)) + sse(b'{"error":{"message":"gone","code":502}}') + sse(native("ab", [1, 2], 2))]
    assert fast(Dialect.SGLANG, runs) == [RunRead("a", 1, ErrorEvent("gone", 502))]


def test_incremental_native_chunks_and_openai_chunks_take_the_reference_path() -> None:
    incremental = [sse(native("Hel", [1], 1)), sse(native("lo", [2], 2))]
    assert fast(Dialect.SGLANG, incremental) == [RunRead("Hel", 1, None), RunRead("lo", 1, None)]
    chat = [sse(json.dumps({"choices": [{"delta": {"content": "hi"}}]}).encode()),
            sse(json.dumps({"choices": [], "usage": {"completion_tokens": 3}}).encode())]
    assert fast(Dialect.CHAT, chat) == reference(Dialect.CHAT, chat) == [RunRead("hi", 1, None), RunRead("", 2, None)]


# -- properties -------------------------------------------------------------------------------------

texts = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from('"\\\n\t\x00 é😀\ud83d\ude00'), max_size=6)
meta_values = st.one_of(st.none(), st.integers(-3, 40), st.booleans(), st.floats(allow_nan=False), st.text(max_size=3))


@st.composite
def native_streams(draw: st.DrawFn) -> list[bytes]:
    """Chunks as SGLang (or something stranger) might write them, split into runs at random."""
    incremental = draw(st.booleans()) and draw(st.booleans())
    text, ids, chunks = "", [], []
    for _ in range(draw(st.integers(1, 8))):
        piece = draw(texts)
        new_ids = draw(st.lists(st.integers(0, 2**40), max_size=3))
        text, ids = text + piece, ids + new_ids
        obj: dict[str, Any] = {"text": piece if incremental else text,
                               "output_ids": new_ids if incremental else list(ids)}
        info: dict[str, Any] = {"id": "r", "finish_reason": draw(st.none() | st.just({"type": "length"}))}
        if draw(st.integers(0, 4)):
            info["completion_tokens"] = len(ids) if draw(st.integers(0, 3)) else draw(meta_values)
        info.update(draw(st.dictionaries(st.sampled_from(["prompt_tokens", "e2e_latency", "x"]), meta_values,
                                         max_size=2)))
        obj["meta_info"] = info
        if draw(st.integers(0, 9)) == 0:
            obj.pop(draw(st.sampled_from(["output_ids", "meta_info", "text"])))
        if draw(st.integers(0, 14)) == 0:
            obj = {"error": {"message": draw(st.text(max_size=4)), "code": draw(st.sampled_from([500, 503, None]))}}
        keys = list(obj)
        if draw(st.integers(0, 5)) == 0:
            keys = draw(st.permutations(keys))
        ordered = {k: obj[k] for k in keys}
        separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
        raw = json.dumps(ordered, separators=separators, ensure_ascii=draw(st.booleans()))
        chunks.append(raw.encode("utf-8", "surrogatepass"))
    chunks.append(b"[DONE]")
    runs, i = [], 0
    while i < len(chunks):
        n = draw(st.integers(1, 4))
        runs.append(b"".join(sse(c) for c in chunks[i:i + n]))
        i += n
    return runs


@settings(max_examples=300, deadline=None)
@given(native_streams())
def test_reads_equal_the_json_loads_reference(runs: list[bytes]) -> None:
    assert fast(Dialect.SGLANG, runs) == reference(Dialect.SGLANG, runs)


@settings(max_examples=300, deadline=None)
@given(native_streams(), st.data())
def test_a_corrupted_byte_reads_as_the_reference_reads_it(runs: list[bytes], data: st.DataObject) -> None:
    """Malformed input: both raise, or both read the same thing (never a different answer)."""
    i = data.draw(st.integers(0, len(runs) - 1))
    run = bytearray(runs[i])
    at = data.draw(st.integers(0, len(run) - 1))
    op = data.draw(st.sampled_from(["replace", "insert", "delete"]))
    byte = data.draw(st.sampled_from(b'"\\,:[]{}0123456789 \x01\xc3\xffae'))
    if op == "replace":
        run[at] = byte
    elif op == "insert":
        run.insert(at, byte)
    else:
        del run[at]
    runs = [*runs[:i], bytes(run), *runs[i + 1:]]
    assert fast(Dialect.SGLANG, runs) == reference(Dialect.SGLANG, runs)
