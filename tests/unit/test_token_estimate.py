"""Bytes per token learned from engines' reports, and the token accounting it drives."""

from __future__ import annotations

import pytest

from proxy.request import Dialect, GenerateRequest
from proxy.routing.prefix_key import block_chars, build_route_request, prefix_tokens
from proxy.routing.token_estimate import BOUNDS, FORGETTING, MAX_MODELS, MIN_PROMPT_BYTES, TokenEstimate

KW = {"block_tokens": 16, "chars_per_token": 4.0, "max_blocks": 2048}


def text_request(text: str, model: str = "m") -> GenerateRequest:
    return GenerateRequest(dialect=Dialect.SGLANG, payload={}, model=model, text=text)


def test_a_model_without_reports_has_no_estimate_so_the_prior_counts() -> None:
    estimate = TokenEstimate(4.0)
    assert estimate.bytes_per_token("m") is None
    assert estimate.snapshot() == {}


@pytest.mark.parametrize(("reports", "expected"), [
    ([(3240, 1000)], 3.24),  # one report is the estimate
    ([(1200, 100), (1200, 100)], 12.0),  # another tokenizer's ratio, steady
    ([(1000, 1000), (10000, 1000)], (1000 * FORGETTING + 10000) / (1000 * FORGETTING + 1000)),  # ratio of sums
])
def test_the_estimate_is_the_decayed_ratio_of_reported_bytes_to_tokens(reports, expected) -> None:
    estimate = TokenEstimate(4.0)
    for prompt_bytes, tokens in reports:
        assert estimate.observe("m", prompt_bytes, tokens)
    assert estimate.bytes_per_token("m") == pytest.approx(expected)
    assert estimate.snapshot()["m"].reports == len(reports)


@pytest.mark.parametrize(("why", "prompt_bytes", "tokens"), [
    ("no report", 4000, None),
    ("a zero report", 4000, 0),
    ("a negative report", 4000, -5),
    ("a prompt too short for its template tokens not to dominate", MIN_PROMPT_BYTES - 1, 2),
    ("more tokens than bytes", 4000, 8000),
    ("an absurdly long token", 4000, 10),
])
def test_implausible_reports_are_ignored(why: str, prompt_bytes: int, tokens: int | None) -> None:
    estimate = TokenEstimate(4.0)
    assert not estimate.observe("m", prompt_bytes, tokens), why
    assert estimate.bytes_per_token("m") is None, why


def test_the_estimate_stays_within_bounds_and_follows_a_change_of_tokenizer() -> None:
    estimate = TokenEstimate(4.0)
    for _ in range(50):
        estimate.observe("m", 3000, 1000)
    for _ in range(500):
        estimate.observe("m", 12000, 1000)
    learned = estimate.bytes_per_token("m")
    assert learned is not None and 11.9 < learned <= 12.0
    assert BOUNDS[0] <= learned <= BOUNDS[1]


def test_each_model_learns_its_own_ratio() -> None:
    estimate = TokenEstimate(4.0)
    estimate.observe("a", 3240, 1000)
    estimate.observe("b", 9000, 1000)
    assert (estimate.bytes_per_token("a"), estimate.bytes_per_token("b")) == (pytest.approx(3.24), pytest.approx(9.0))


def test_the_models_remembered_are_bounded_oldest_report_first() -> None:
    estimate = TokenEstimate(4.0)
    for i in range(MAX_MODELS + 1):
        estimate.observe(f"m{i}", 4000, 1000)
    estimate.observe("m1", 4000, 1000)  # reported again: now the most recent
    estimate.observe("new", 4000, 1000)
    assert len(estimate.snapshot()) == MAX_MODELS
    assert estimate.bytes_per_token("m0") is None and estimate.bytes_per_token("m2") is None
    assert estimate.bytes_per_token("m1") is not None


def test_a_nonpositive_prior_is_refused() -> None:
    with pytest.raises(ValueError, match="prior"):
        TokenEstimate(0.0)


TEXT = "x" * 6400  # 6,400 bytes: 100 unit blocks of 64 bytes at the 4.0 prior


@pytest.mark.parametrize(("why", "bytes_per_token", "prompt_tokens", "block_tokens"), [
    ("no estimate yet: the prior counts", None, 1600, 16),
    ("the estimate equals the prior", 4.0, 1600, 16),
    ("a denser tokenizer (mixed prose, code, CJK)", 3.24, 1976, 20),
    ("a sparser tokenizer", 12.0, 534, 5),
    ("the sparsest plausible tokenizer", 32.0, 200, 2),
])
def test_text_tokens_follow_the_learned_estimate(why: str, bytes_per_token: float | None, prompt_tokens: int,
                                                 block_tokens: int) -> None:
    route = build_route_request(text_request(TEXT), bytes_per_token=bytes_per_token, **KW)  # type: ignore[arg-type]
    assert (route.prompt_tokens, route.block_tokens, route.prompt_bytes) == (prompt_tokens, block_tokens, 6400), why


def test_a_block_of_one_token_is_the_floor_even_for_a_tiny_unit() -> None:
    route = build_route_request(text_request("x" * 64), block_tokens=1, chars_per_token=1.0, max_blocks=2048,
                                bytes_per_token=32.0)
    assert route.block_tokens == 1


@pytest.mark.parametrize("bytes_per_token", [None, 1.5, 3.24, 4.0, 12.0])
def test_hashes_never_move_with_the_estimate(bytes_per_token: float | None) -> None:
    prior = build_route_request(text_request(TEXT), **KW)  # type: ignore[arg-type]
    learned = build_route_request(text_request(TEXT), bytes_per_token=bytes_per_token, **KW)  # type: ignore[arg-type]
    assert learned.block_hashes == prior.block_hashes
    assert block_chars(16, 4.0) == 64  # the byte unit is cut for the prior


def test_the_index_weighs_a_text_prompt_in_learned_tokens() -> None:
    # 100 unit blocks of 64 bytes at 3.24 bytes per token: ~1,975 tokens, not the prior's 1,600.
    route = build_route_request(text_request(TEXT), bytes_per_token=3.24, **KW)  # type: ignore[arg-type]
    covered = prefix_tokens(len(route.block_hashes), route.block_tokens)
    assert abs(covered - route.prompt_tokens) / route.prompt_tokens < 0.02


def test_token_id_prompts_ignore_the_estimate() -> None:
    req = GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", input_ids=list(range(1000)))
    route = build_route_request(req, bytes_per_token=12.0, **KW)  # type: ignore[arg-type]
    assert (route.prompt_tokens, route.block_tokens, route.prompt_bytes) == (1000, 16, 0)


def test_a_nonpositive_estimate_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes_per_token"):
        build_route_request(text_request(TEXT), bytes_per_token=0.0, **KW)  # type: ignore[arg-type]
