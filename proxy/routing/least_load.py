"""least_load: power of d choices over each worker's outstanding work.

Rule: sample ``choices`` distinct healthy workers uniformly at random (the injected
``random.Random``) and pick the one with the smallest load, where
``load = in_flight + queued`` — our own outstanding requests on the worker plus the engine's
scraped waiting queue (0 before the first scrape). A stale snapshot counts as saturated: it is
chosen only when every sampled worker is stale. Ties go to the first sampled (itself random).
Branches: ``p2c`` (compared samples), ``only`` (one healthy worker).
Complexity: O(workers) for the healthy filter + O(choices) to compare.
Choose it: prompts that share little, uneven request sizes; it avoids herding that a strict
"global least" causes when the load signal lags.
Params: ``choices`` (int, default 2; ≥ 2; ``choices`` ≥ workers means exact least-load).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config import ConfigError
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
class LeastLoadParams:
    choices: int = 2

    def validate(self) -> None:
        if self.choices < 2:
            raise ConfigError("routing.params.choices: must be >= 2")


def load_of(worker: WorkerSnapshot) -> tuple[int, int]:
    """Sort key: stale workers after every fresh one, then outstanding work."""
    return (1 if worker.stale else 0, worker.in_flight + (worker.queued or 0))


class LeastLoad(IgnoresFeedback):
    name = "least_load"

    def __init__(self, params: LeastLoadParams, rng: random.Random) -> None:
        self._choices = params.choices
        self._rng = rng

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        if len(candidates) == 1:
            return Decision(candidates[0].url, "only")
        sampled = self._rng.sample(candidates, min(self._choices, len(candidates)))
        best = min(sampled, key=load_of)  # min() keeps the first of equal keys
        return Decision(best.url, "p2c", reason=f"load={load_of(best)[1]}")

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        pass


SPEC = PolicySpec("least_load", LeastLoadParams, lambda params, rng: LeastLoad(params, rng))
