"""Prefix keys: canonical prompts, block layout, chained hashes."""

from __future__ import annotations

import pytest

from proxy.request import Dialect, GenerateRequest
from proxy.routing.prefix_key import (
    BLOCKS_PER_DOUBLING,
    block_chars,
    block_ends,
    block_tokens_for,
    blocks_within,
    build_route_request,
    prefix_tokens,
    render_messages,
)

KW = {"block_tokens": 16, "chars_per_token": 4.0, "max_blocks": 2048}


def text_request(text: str, model: str = "m", **kw: object) -> GenerateRequest:
    return GenerateRequest(dialect=Dialect.SGLANG, payload={}, model=model, text=text, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("page_sizes", "expected"),
    [
        ([], 16),
        ([1], 16),
        ([1, 1, 1], 16),
        ([8], 16),
        ([32], 32),
        ([64], 64),
        ([12, 8], 24),
        ([0, -1, 64], 64),
    ],
)
def test_block_size_is_the_smallest_multiple_of_every_page_size_of_at_least_16(page_sizes, expected) -> None:
    assert block_tokens_for(page_sizes) == expected


def test_block_chars_scale_block_tokens_by_chars_per_token() -> None:
    assert block_chars(16, 4.0) == 64
    assert block_chars(16, 3.5) == 56
    assert block_chars(1, 0.1) == 1


def test_the_first_blocks_are_one_unit_and_later_runs_double() -> None:
    ends = block_ends(10, 10**9, 2 * BLOCKS_PER_DOUBLING + 2 * BLOCKS_PER_DOUBLING)
    sizes = [b - a for a, b in zip([0, *ends], ends, strict=False)]
    assert sizes[: 2 * BLOCKS_PER_DOUBLING] == [10] * (2 * BLOCKS_PER_DOUBLING)
    assert sizes[2 * BLOCKS_PER_DOUBLING : 3 * BLOCKS_PER_DOUBLING] == [20] * BLOCKS_PER_DOUBLING
    assert sizes[3 * BLOCKS_PER_DOUBLING :] == [40] * BLOCKS_PER_DOUBLING


@pytest.mark.parametrize("n", [0, 1, 63, 64, 65, 95, 96, 97, 200, 500])
def test_prefix_tokens_agrees_with_the_block_layout(n) -> None:
    ends = block_ends(16, 10**12, n)
    assert prefix_tokens(n, 16) == (ends[-1] if ends else 0)


FIRST = 2 * BLOCKS_PER_DOUBLING  # one-unit blocks before the first doubling


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [(0, 0), (15, 0), (16, 1), (FIRST * 16 - 1, FIRST - 1), (FIRST * 16, FIRST), (FIRST * 16 + 31, FIRST), (FIRST * 16 + 32, FIRST + 1)],
)
def test_blocks_within_counts_the_leading_blocks_that_fit(tokens, expected) -> None:
    assert blocks_within(tokens, 16, 1000) == expected


def test_blocks_within_never_exceeds_its_limit() -> None:
    assert blocks_within(10**9, 16, 7) == 7


def test_a_32k_token_prompt_takes_a_few_hundred_blocks_not_two_thousand() -> None:
    route = build_route_request(text_request("x" * 128_000), **KW)
    assert route.prompt_tokens == 32_000
    assert 60 < len(route.block_hashes) < 300


def test_only_full_blocks_are_hashed() -> None:
    assert build_route_request(text_request("a" * 63), **KW).block_hashes == ()
    assert len(build_route_request(text_request("a" * 64), **KW).block_hashes) == 1
    assert len(build_route_request(text_request("a" * 127), **KW).block_hashes) == 1


def test_a_prompt_that_extends_another_shares_its_leading_hashes() -> None:
    base = build_route_request(text_request("system prompt " * 40), **KW)
    longer = build_route_request(text_request("system prompt " * 40 + "question?" * 30), **KW)
    assert longer.block_hashes[: len(base.block_hashes)] == base.block_hashes
    assert len(longer.block_hashes) > len(base.block_hashes)


def test_prompts_that_differ_early_share_no_later_hash() -> None:
    a = build_route_request(text_request("A" + "x" * 2000), **KW)
    b = build_route_request(text_request("B" + "x" * 2000), **KW)
    assert not set(a.block_hashes) & set(b.block_hashes)


@pytest.mark.parametrize(
    ("change", "kwargs"),
    [("model", {"model": "other"}), ("salt", {"salt": "tenant-2"})],
)
def test_changing_model_or_salt_changes_every_hash(change, kwargs) -> None:
    text = "same prompt " * 100
    base = build_route_request(text_request(text), **KW)
    model = kwargs.get("model", "m")
    other = build_route_request(text_request(text, model=model), **KW, salt=kwargs.get("salt", ""))
    assert len(other.block_hashes) == len(base.block_hashes)
    assert not set(other.block_hashes) & set(base.block_hashes), change


@pytest.mark.parametrize("field", ["lora_path", "lora_id", "extra_key", "cache_salt"])
def test_a_prompt_under_another_adapter_or_cache_salt_shares_no_block(field: str) -> None:
    """The engine keys its prefix cache by these too: the same text under another one is a miss."""
    text = "same system prompt " * 100
    def route(payload: dict[str, object]) -> tuple[int, ...]:
        req = GenerateRequest(dialect=Dialect.SGLANG, payload=payload, model="m", text=text)
        return build_route_request(req, **KW).block_hashes
    plain, a, a_again, b = route({}), route({field: "a"}), route({field: "a"}), route({field: "b"})
    assert a == a_again and len(a) == len(plain)
    assert not set(a) & set(b) and not set(a) & set(plain)
    assert route({field: ["a", "b"]}) == a  # a batch routes as its first prompt
    scoped = build_route_request(GenerateRequest(dialect=Dialect.SGLANG, payload={field: "a"}, model="m", text=text), **KW)
    assert scoped.cache_scoped and not build_route_request(text_request(text), **KW).cache_scoped
    # No scope, or an empty or unusable one: hashed exactly as before the scope existed.
    assert route({field: ""}) == route({field: None}) == route({field: {"x": 1}}) == route({field: True}) == plain


def test_max_blocks_caps_the_hashes() -> None:
    route = build_route_request(text_request("y" * 10_000), block_tokens=16, chars_per_token=4.0, max_blocks=5)
    assert len(route.block_hashes) == 5


def test_token_ids_are_hashed_in_block_tokens_and_counted_exactly() -> None:
    ids = list(range(100))
    req = GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", input_ids=ids)
    route = build_route_request(req, **KW)
    assert route.prompt_tokens == 100
    assert len(route.block_hashes) == 6
    assert route.prompt_text == ""
    longer = build_route_request(GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", input_ids=[*ids, 7] * 2), **KW)
    assert longer.block_hashes[:6] == route.block_hashes


def test_huge_token_ids_still_hash() -> None:
    req = GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", input_ids=[2**40] * 32)
    assert len(build_route_request(req, **KW).block_hashes) == 2


def test_a_follow_up_chat_turn_extends_the_previous_rendering() -> None:
    turn1 = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi " * 50}]
    turn2 = [*turn1, {"role": "assistant", "content": "Hello " * 40}, {"role": "user", "content": "More " * 30}]
    assert render_messages(turn2).startswith(render_messages(turn1))
    r1 = build_route_request(GenerateRequest(dialect=Dialect.CHAT, payload={}, model="m", messages=turn1), **KW)
    r2 = build_route_request(GenerateRequest(dialect=Dialect.CHAT, payload={}, model="m", messages=turn2), **KW)
    assert r1.block_hashes and r2.block_hashes[: len(r1.block_hashes)] == r1.block_hashes


def test_chat_content_parts_and_tool_calls_are_part_of_the_prompt() -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u1"}}]}]
    other = [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u2"}}]}]
    assert render_messages(parts) != render_messages(other)
    tools = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f"}}]}]
    assert '"name":"f"' in render_messages(tools)


def test_the_route_request_carries_session_priority_and_text() -> None:
    route = build_route_request(text_request("hello", session_key="s1", priority=3), **KW)
    assert (route.session_key, route.priority, route.prompt_text, route.model) == ("s1", 3, "hello", "m")
    assert route.block_tokens == 16


@pytest.mark.parametrize(
    "kwargs", [{"block_tokens": 0, "chars_per_token": 4.0, "max_blocks": 1}, {"block_tokens": 16, "chars_per_token": 0, "max_blocks": 1}]
)
def test_nonsense_block_parameters_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        build_route_request(text_request("x"), **kwargs)
