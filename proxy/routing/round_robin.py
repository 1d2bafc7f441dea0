"""round_robin: the healthy workers in turn.

Rule: keep a counter; pick ``healthy[counter % len(healthy)]`` and advance. Load, cache contents and
staleness are ignored — this is the baseline every other policy must beat.
Complexity: O(workers) per decision (the healthy filter).
Choose it: as a baseline, or when prompts share nothing and workers are identical.
Params: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from proxy.routing.base import (
    Decision,
    IgnoresFeedback,
    NoWorkerAvailable,
    RouteRequest,
    WorkerSnapshot,
    healthy,
)
from proxy.routing.registry import PolicySpec


@dataclass(frozen=True)
class RoundRobinParams:
    pass


class RoundRobin(IgnoresFeedback):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        choice = candidates[self._next % len(candidates)]
        self._next += 1
        return Decision(choice.url, "rr")

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        pass


SPEC = PolicySpec("round_robin", RoundRobinParams, lambda params, rng: RoundRobin())
