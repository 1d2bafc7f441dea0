"""The routing simulator judged by its decisions and by its spread (fidelity_routing, fleet_sim)."""

from __future__ import annotations

import math

from loadtests.fidelity_routing import best_agreement, busiest, whole_share
from loadtests.gpu.fleet_sim import spread_tally


def test_agreement_ignores_how_the_engines_are_numbered() -> None:
    gpu = [0, 0, 1, 1, 2, 3, 3, 2]
    renamed = [{0: 2, 1: 3, 2: 0, 3: 1}[e] for e in gpu]
    assert best_agreement(gpu, renamed, 4) == 1.0
    moved = [*renamed[:-2], renamed[0], renamed[0]]  # the last two sent where the first went
    assert best_agreement(gpu, moved, 4) == 0.75


def test_agreement_counts_a_split_group_once_per_request() -> None:
    # the simulator sent everything to one engine: at best the GPU's largest engine matches
    assert best_agreement([0, 0, 0, 1, 2, 3], [1] * 6, 4) == 0.5
    assert math.isnan(best_agreement([], [], 4))


def test_whole_and_busiest() -> None:
    groups = [7, 7, 7, 7, 9, 9]
    assert whole_share(groups, [0, 0, 0, 1, 2, 2]) == 5 / 6
    assert whole_share(groups, [3, 3, 3, 3, 1, 1]) == 1.0
    assert busiest([0, 0, 0, 1, 2, 3], 4) == 2.0
    assert busiest([0, 1, 2, 3], 4) == 1.0


def test_spread_tally_counts_the_gpu_inside_the_range_and_scores_the_odds() -> None:
    rows = [
        # ttft inside its range, smg above it; the simulator sure ttft is faster, and it was
        ("a", {"ttft": (1.0, [0.8, 0.9, 1.1, 1.2]), "smg": (3.0, [1.5, 1.6, 1.7, 1.8])}),
        # both inside; the simulator sure ttft is slower, and on the GPU it was faster
        ("b", {"ttft": (1.0, [1.9, 2.0, 2.1, 0.9]), "smg": (1.5, [1.0, 1.1, 1.2, 1.6])}),
    ]
    line = spread_tally(rows)
    assert "smg: GPU inside the simulated range in 1 of 2 (a new draw 60%)" in line
    assert "ttft: GPU inside the simulated range in 2 of 2" in line
    # paired by jitter seed: cell a 4 of 4 faster (it was: 0), cell b 1 of 4 (it was: (1/4 - 1)^2)
    assert "Brier 0.281 over 2 cells" in line
    # odds 1 and 1/4: p(1 - p) is 0 and 3/16, so a calibrated forecaster expects 0.094 on average
    assert "if the GPU's round were one more draw, 0.094 ± " in line
    assert "odds 3:1 or longer in 2, the GPU's round agreed in 1" in line


def test_spread_tally_leaves_out_what_did_not_finish() -> None:
    rows = [("a", {"ttft": (math.inf, [1.0, 2.0]), "smg": (1.0, [math.inf, 1.0, 1.5])})]
    line = spread_tally(rows)
    assert "ttft:" not in line and "smg: GPU inside the simulated range in 1 of 1" in line
    assert "Brier" not in line


def test_odds_that_match_the_outcomes_score_what_calibration_expects() -> None:
    """Outcomes drawn with the odds given: the Brier score lands within a few standard deviations
    of the expectation; the same odds against outcomes that always go the unlikely way do not."""
    import random

    from loadtests.gpu.fleet_sim import calibrated_brier

    rng = random.Random(3)
    odds = [rng.choice((0.125, 0.25, 0.5, 0.75, 0.875)) for _ in range(400)]
    expected, sd = calibrated_brier(odds)
    drawn = sum((p - (rng.random() < p)) ** 2 for p in odds) / len(odds)
    contrary = sum((p - (p < 0.5)) ** 2 for p in odds) / len(odds)
    assert abs(drawn - expected) < 3 * sd
    assert contrary - expected > 10 * sd
    assert calibrated_brier([0.5]) == (0.25, 0.0)
