"""fidelity_replay.tail_bands and rank: where the simulator's misses lie, by the real engine's p95
and among its requests."""

from __future__ import annotations

import math

from loadtests.fidelity_replay import rank, tail_bands


def test_a_simulator_with_narrow_tails_reads_light_rounds_slow_and_heavy_ones_fast() -> None:
    real = [0.5, 0.8, 1.2, 2.0, 2.5, 4.0, 6.0, 9.0]
    line = tail_bands([(r, math.exp(0.8 * math.log(r) + 0.1)) for r in real])
    assert line.endswith("log-log slope 0.80")
    low, mid, high = line.split(": ", 1)[1].split("; ")[:3]
    assert low.startswith("0-1.5 s: 3 rounds") and float(low.rsplit(" ", 1)[1]) > 1.0
    assert mid.startswith("1.5-3 s: 2 rounds")
    assert high.startswith("3-inf s: 3 rounds") and float(high.rsplit(" ", 1)[1]) < 1.0


def test_a_constant_bias_is_the_same_in_every_band_with_slope_one() -> None:
    line = tail_bands([(r, 1.1 * r) for r in (0.7, 2.0, 5.0, math.inf)] + [(1.0, math.inf)])
    assert line.count("sim / real 1.10") == 3 and line.endswith("slope 1.00")


def test_too_few_rounds_say_so() -> None:
    assert tail_bands([(1.0, 1.2)]) == "tail: too few rounds"


def test_a_ratio_far_off_in_a_steep_middle_is_near_in_rank() -> None:
    # A knee's TTFTs: a fast half, then a slow one; the median sits on the step between them.
    ttfts = [0.2 + 0.01 * k for k in range(50)] + [1.0 + 0.05 * k for k in range(50)]
    p50 = sorted(ttfts)[50]
    assert p50 == 1.0
    off = 1.45 * p50  # 45% over: a miss in ratio ...
    assert 0.55 <= rank(ttfts, off) <= 0.60  # ... and yet the GPU's 59th percentile
    assert rank(ttfts, 0.1) == 0.0 and rank(ttfts, 99.0) == 1.0
    assert math.isnan(rank([], 1.0))
