"""Open-loop arrival times: Poisson processes and rate ladders.

Open loop means arrivals do not wait for responses, so a slow system builds a queue instead of
slowing the load down (closed-loop benchmarks hide exactly the tail we want to see). Times are
offsets in seconds from the start of the run, sorted; draw them from an injected
``random.Random`` so a run repeats.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


def poisson_times(rate_per_s: float, count: int, rng: random.Random, start: float = 0.0) -> list[float]:
    """``count`` arrival offsets of a Poisson process of ``rate_per_s`` (exponential gaps)."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be > 0")
    times: list[float] = []
    t = start
    for _ in range(count):
        t += rng.expovariate(rate_per_s)
        times.append(t)
    return times


def poisson_stream(rate_per_s: float, rng: random.Random, start: float = 0.0) -> Iterator[float]:
    """An endless Poisson arrival generator (bound it with ``itertools.islice`` or a deadline)."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be > 0")
    t = start
    while True:
        t += rng.expovariate(rate_per_s)
        yield t


@dataclass(frozen=True)
class Step:
    rate_per_s: float
    times: list[float]


def rate_ladder(rates: Sequence[float], per_step: int, rng: random.Random) -> list[Step]:
    """One Poisson step of ``per_step`` arrivals per rate; each step starts at offset 0."""
    return [Step(rate, poisson_times(rate, per_step, rng)) for rate in rates]
