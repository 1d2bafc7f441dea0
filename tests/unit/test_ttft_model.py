"""The online TTFT model: recursive least squares plus per-worker speed factors."""

from __future__ import annotations

import random

import pytest

from proxy.routing.ttft_model import Features, OnlineLinear, TtftModel, TtftPrior


def test_least_squares_recovers_a_noiseless_linear_law() -> None:
    fit = OnlineLinear([0.0, 0.0, 0.0], prior_variance=10.0, forgetting=1.0)
    rng = random.Random(0)
    for _ in range(200):
        x = [1.0, rng.uniform(0, 10), rng.uniform(0, 5)]
        fit.update(x, 0.05 + 0.2 * x[1] + 0.03 * x[2])
    assert fit.theta == pytest.approx([0.05, 0.2, 0.03], abs=1e-3)


@pytest.mark.parametrize("per_waiting_s", [0.0, 0.3])
def test_the_model_learns_prefill_rate_decode_interference_and_admission_cost(per_waiting_s: float) -> None:
    model = TtftModel(TtftPrior(base_s=0.0, prefill_tokens_per_s=50_000, decode_s_per_running=0.0))
    rng = random.Random(1)
    for _ in range(3000):
        x = Features(rng.uniform(0, 8000), rng.uniform(0, 4000), rng.uniform(0, 4000), rng.uniform(0, 64),
                     rng.randint(0, 8))
        # Stale queue figures matter half as much as fresh work; an engine that admits few
        # requests per step charges each waiting one (0.3 s), one that batches them charges none.
        model.learn("w", x, 0.01 + (x.uncached + x.unseen + 0.5 * x.queued) / 20_000 + 0.002 * x.running
                    + per_waiting_s * x.waiting)
    base, per_uncached, per_unseen, per_queued, per_running, per_waiting, _ = model.coefficients()
    assert per_uncached == pytest.approx(1 / 20_000, rel=0.1)
    assert per_unseen == pytest.approx(1 / 20_000, rel=0.1)
    assert per_queued == pytest.approx(0.5 / 20_000, rel=0.15)
    assert per_running == pytest.approx(0.002, rel=0.15)
    assert per_waiting == pytest.approx(per_waiting_s, abs=0.01)
    assert base == pytest.approx(0.01, abs=0.01)


def test_one_stalled_request_moves_the_fit_only_a_little() -> None:
    model = TtftModel(TtftPrior())
    x = Features(2000, 0, 0, 10)
    before = model.fleet_predict(x)
    model.learn("w", x, 1000.0)  # a 1000 s outlier
    assert model.fleet_predict(x) < 20 * before


def test_speed_factors_stay_relative_to_the_fleet() -> None:
    model = TtftModel(TtftPrior(), factor_alpha=0.2)
    x = Features(4000, 0, 0, 5)
    for _ in range(100):
        for url, slow in (("a", 3.0), ("b", 1.0), ("c", 1.0)):
            model.learn(url, x, slow * model.fleet_predict(x))
    assert model.factor("a") > 2 * model.factor("b")
    assert sum(model.factor(u) for u in "abc") / 3 == pytest.approx(1.0)
    model.forget("a")
    assert model.known() == ["b", "c"]


def test_an_uncached_token_never_becomes_free_when_queueing_explains_every_ttft() -> None:
    # Under overload TTFT follows the queue alone; the fit would put c1 at 0 and make recomputing a
    # prefix elsewhere look free. It stays at a quarter of the prior at least.
    prior = TtftPrior(base_s=0.0, prefill_tokens_per_s=10_000, decode_s_per_running=0.0)
    model = TtftModel(prior)
    rng = random.Random(2)
    for _ in range(3000):
        x = Features(rng.uniform(0, 8000), rng.uniform(0, 40_000), 0.0, rng.uniform(0, 64))
        model.learn("w", x, 0.5 + x.unseen / 5_000)
    assert model.coefficients()[1] == pytest.approx(1 / 40_000)
    assert model.seconds_per_token("w") >= 1 / 40_000 * 0.99


def test_with_own_at_least_ahead_a_requests_own_token_costs_what_one_ahead_does() -> None:
    # The same overload as above: TTFT follows the unseen tokens ahead (1/5,000 s each) alone.
    # Off (the default), c1 rests on its floor; on, it is held at c2, so recomputing a prefix
    # elsewhere costs what waiting behind that many tokens does.
    prior = TtftPrior(base_s=0.0, prefill_tokens_per_s=10_000, decode_s_per_running=0.0)
    models = {flag: TtftModel(prior, own_at_least_ahead=flag) for flag in (False, True)}
    rng = random.Random(2)
    for _ in range(3000):
        x = Features(rng.uniform(0, 8000), rng.uniform(0, 40_000), 0.0, rng.uniform(0, 64))
        for m in models.values():
            m.learn("w", x, 0.5 + x.unseen / 5_000)
    off, on = (models[f].coefficients() for f in (False, True))
    assert off[1] == pytest.approx(1 / 40_000) and off[2] == pytest.approx(1 / 5_000, rel=0.05)
    assert on[1] == pytest.approx(on[2]) and on[1] == pytest.approx(1 / 5_000, rel=0.05)
    # What /metrics shows (radixgate_routing_ttft_model): the terms as used, and where a floor binds.
    terms = models[True].terms()
    assert (terms["uncached_token"], terms["unseen_token"]) == (on[1], on[2])
    assert terms["uncached_token_fit"] < terms["uncached_token"] / 4  # the fit alone: far under the floor
