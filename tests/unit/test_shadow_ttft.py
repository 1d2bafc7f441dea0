"""The shadow replay's TTFT model (proxy/diagnose/shadow_ttft.py): features, fit, prediction."""

from __future__ import annotations

import random

import pytest

from proxy.diagnose.shadow_ttft import Placed, TtftModel, fit, p95, run


def test_a_request_finds_ahead_the_uncached_tokens_still_without_a_first_token_and_the_requests_decoding() -> None:
    placed = [Placed(0.0, "a", 1000, 1.0), Placed(0.1, "a", 500, 1.0), Placed(0.2, "b", 300, 1.0),
              Placed(0.6, "a", 200, 1.0)]
    seen = []

    def ttft(i: int, x: tuple[float, float, float]) -> float:
        seen.append(x)
        return 0.5  # every first token 0.5 s after dispatch, done 1 s later

    assert run(placed, ttft) == [0.5] * 4
    # at 0.1 on a: the first request (no token until 0.5) is ahead, not yet decoding
    # at 0.6 on a: both earlier ones have their first token (0.5, 0.6) and are still decoding
    assert seen == [(1000, 0, 0), (500, 1000, 0), (300, 0, 0), (200, 0, 2)]


def test_the_fit_recovers_the_costs_that_made_the_ttfts_and_predicts_another_placement() -> None:
    rng = random.Random(3)
    truth = TtftModel((0.02, 1e-4, 5e-5, 0.0))
    placed = [Placed(0.05 * i, rng.choice("ab"), float(rng.choice((100, 2400))), 0.3) for i in range(200)]
    measured = truth.ttfts(placed)
    model = fit(placed, measured)
    assert model is not None
    for got, want in zip(model.coefficients, truth.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-3, abs=1e-7)
    # every request on one worker: more ahead of each, a higher p95 than spread over two
    piled = [Placed(p.at, "a", p.uncached, p.decode_s) for p in placed]
    assert p95(model.ttfts(piled)) > p95(model.ttfts(placed))


def test_no_cost_is_negative_and_too_few_requests_fit_nothing() -> None:
    rng = random.Random(4)
    placed = [Placed(0.05 * i, "a", float(rng.randrange(100, 3000)), 0.2) for i in range(60)]
    # TTFT falling with the uncached tokens: nonsense for an engine, so that cost is dropped
    measured = [max(0.01, 0.5 - p.uncached * 1e-4) for p in placed]
    model = fit(placed, measured)
    assert model is not None and all(b >= 0 for b in model.coefficients)
    assert fit(placed[:10], measured[:10]) is None
