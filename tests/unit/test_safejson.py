"""safejson.loads: every failure is a ValueError (a table of inputs json.loads lets through or out)."""

from __future__ import annotations

import math

import pytest

from proxy import safejson


@pytest.mark.parametrize(("raw", "why"), [
    (b"[" * 100_000, "nested too deeply"),
    (b"[" * (safejson.MAX_DEPTH + 1) + b"]" * (safejson.MAX_DEPTH + 1), "nested too deeply"),
    (b'{"a": ' * 70 + b"1" + b"}" * 70, "nested too deeply"),
    (b'{"t": NaN}', "NaN"),
    (b"[Infinity]", "Infinity"),
    (b"-Infinity", "Infinity"),
    ('{"a": 1}'.encode("utf-16"), "utf-8"),
    ('{"a": 1}'.encode("utf-32-be"), "Expecting value"),
    (b"\xef\xbb\xbf{}", "byte-order mark"),
    (b'{"a": "\xff"}', "utf-8"),
    (b"{oops", "Expecting property name"),
], ids=["100k-brackets", "one-past-the-limit", "deep-objects", "NaN", "Infinity", "-Infinity", "utf-16",
        "utf-32", "bom", "invalid-utf8", "malformed"])
def test_what_json_loads_would_let_through_or_out_is_a_value_error(raw: bytes, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        safejson.loads(raw)


def test_ordinary_json_parses_as_json_loads_parses_it() -> None:
    assert safejson.loads(b'{"text": "caf\xc3\xa9", "ids": [1, 2], "x": {"y": [null, true, 1.5]}}') == {
        "text": "café", "ids": [1, 2], "x": {"y": [None, True, 1.5]}}
    deep = "[" * safejson.MAX_DEPTH + "]" * safejson.MAX_DEPTH
    assert safejson.loads(deep) is not None  # exactly at the limit is fine
    brackets_in_strings = '{"t": "' + "[" * 500 + '"}'
    assert safejson.loads(brackets_in_strings) == {"t": "[" * 500}


def test_an_out_of_range_number_is_grammatical_json_and_left_to_the_readers_of_numbers() -> None:
    assert math.isinf(safejson.loads(b"[1e999]")[0])
