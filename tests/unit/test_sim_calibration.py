"""The calibrated profiles stay calibrated: replays of measured and published figures (virtual time)."""

from __future__ import annotations

import pytest

from loadtests.calibrate_sim import TOLERANCE, calibration_cases, sglang_cases


@pytest.mark.parametrize(("what", "measured", "simulated"), calibration_cases())
def test_the_transformers_profile_replays_each_h200_measurement_within_20_percent(
    what: str, measured: float, simulated: float
) -> None:
    assert abs(simulated / measured - 1) <= TOLERANCE, what


def test_the_sglang_h100_profile_matches_published_figures_and_bounds() -> None:
    rows = [r for r in sglang_cases() if r[0] == "llama-3.1-8b-h100"]
    assert any(kind == "=" for _, _, kind, *_ in rows)
    for _, what, kind, published, simulated, _ in rows:
        if kind == "=":
            assert abs(simulated / published - 1) <= TOLERANCE, what
        elif kind == "<":
            assert simulated < published, what
