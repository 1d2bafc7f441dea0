"""File descriptors for the connections the config allows (limits.plan_file_descriptors)."""

from __future__ import annotations

import pytest

from proxy.limits import FD_RESERVE, FdPlan, plan_file_descriptors


@pytest.mark.parametrize(("max_connections", "upstream", "soft", "hard", "plan"), [
    # The soft limit is raised to cover clients + worker pools + the reserve.
    (4096, 512, 1024, 1_048_576, FdPlan(4096 + 512 + FD_RESERVE, 4096)),
    # A soft limit already large enough is kept (never lowered).
    (100, 10, 50_000, 1_048_576, FdPlan(50_000, 100)),
    # The hard limit cannot cover them: the gate is lowered to what fits under it.
    (4096, 512, 1024, 2048, FdPlan(2048, 2048 - 512 - FD_RESERVE)),
    # Even worker pools alone do not fit: at least one client connection.
    (4096, 4096, 1024, 2048, FdPlan(2048, 1)),
    # No limit of our own: take what the system allows.
    (0, 512, 1024, 65_536, FdPlan(65_536, 0)),
    # An unlimited hard limit (RLIM_INFINITY, passed as -1): ask for what is needed.
    (4096, 512, 1024, -1, FdPlan(4096 + 512 + FD_RESERVE, 4096)),
])
def test_the_plan_raises_the_soft_limit_or_lowers_the_gate_to_fit(
        max_connections: int, upstream: int, soft: int, hard: int, plan: FdPlan) -> None:
    assert plan_file_descriptors(max_connections, upstream, soft, hard) == plan
