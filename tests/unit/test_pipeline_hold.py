"""How long the pipeline holds a request for a prefix being prefilled (``Decision.hold_s``)."""

from __future__ import annotations

import pytest

from proxy.pipeline import hold_limit


@pytest.mark.parametrize(("why", "hold_max_s", "hold_s", "remaining_s", "limit"), [
    ("a policy without an estimate: routing.hold_max_s", 1.0, None, 30.0, 1.0),
    ("a hold worth less than hold_max_s ends at its worth", 1.0, 0.12, 30.0, 0.12),
    ("a hold worth more is still capped by hold_max_s", 1.0, 5.0, 30.0, 1.0),
    ("the deadline comes first", 1.0, 0.5, 0.2, 0.2),
    ("a hold worth nothing is no hold", 1.0, 0.0, 30.0, 0.0),
    ("holds off", 0.0, 0.3, 30.0, 0.0),
])
def test_a_hold_waits_for_the_least_of_hold_max_s_its_worth_and_the_deadline(
        why: str, hold_max_s: float, hold_s: float | None, remaining_s: float, limit: float) -> None:
    assert hold_limit(hold_max_s, hold_s, remaining_s) == limit, why
