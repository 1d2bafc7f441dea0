"""Predicted TTFT of the shadow replay (``shadow.py``): a linear model fitted on the window itself.

A request's TTFT on its worker is modelled as ``b0 + b1 * uncached + b2 * ahead + b3 * decoding``:
its own uncached prompt tokens, the uncached tokens of requests sent to that worker before it and
still without a first token, and the requests there past their first token and not yet done.
(Counting the waiting ones there too, as first, made that term grow with the queue as ``ahead``
does; past capacity the fit put TTFT on it, which no saved prefill shortens, and a switch from
round robin that measured 0.25x its p95 was predicted at 1.03x; now 0.89x.) The coefficients are
fitted (least squares, none negative) on the window's own requests, each at its real worker with
its real TTFT; a policy's placements are then run through the model in dispatch order, each
predicted first token deciding what the later requests find ahead of them (a request's decode
lasts what it measured). So the prediction is what this fleet, as the window measured it, would
have done with that placement; what the window did not exercise (a load it never saw) it can
only extrapolate.

Pure: placements in, seconds out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Fewer measured TTFTs than this fit nothing worth reporting.
MIN_FIT = 20


@dataclass(frozen=True, slots=True)
class Placed:
    at: float  # dispatch time
    worker: str
    uncached: float  # prompt tokens its worker's cache (model) did not hold
    decode_s: float  # first token to done, as measured


Features = tuple[float, float, float]  # uncached, uncached ahead, decoding


def run(placed: Sequence[Placed], ttft_of: Callable[[int, Features], float]) -> list[float]:
    """Each request's TTFT, in ``placed`` order (dispatch order), from ``ttft_of(i, features)``."""
    # per worker: (first token time, done time, uncached) of the requests sent there so far
    on: dict[str, list[tuple[float, float, float]]] = {}
    out = []
    for i, p in enumerate(placed):
        mine = [e for e in on.get(p.worker, []) if e[1] > p.at]
        on[p.worker] = mine
        ahead = sum(u for first, _, u in mine if first > p.at)
        decoding = sum(1 for first, _, _ in mine if first <= p.at)
        ttft = max(0.0, ttft_of(i, (p.uncached, ahead, float(decoding))))
        mine.append((p.at + ttft, p.at + ttft + p.decode_s, p.uncached))
        out.append(ttft)
    return out


@dataclass(frozen=True, slots=True)
class TtftModel:
    coefficients: tuple[float, float, float, float]  # b0 (s), per uncached token, per token ahead, per decoding

    def predict(self, x: Features) -> float:
        b = self.coefficients
        return b[0] + b[1] * x[0] + b[2] * x[1] + b[3] * x[2]

    def ttfts(self, placed: Sequence[Placed]) -> list[float]:
        return run(placed, lambda _, x: self.predict(x))


def fit(placed: Sequence[Placed], measured: Sequence[float]) -> TtftModel | None:
    """Least squares of ``measured`` (the TTFT of ``placed[i]``) on its features, no coefficient
    negative (a negative one is dropped and the rest refitted); None with too few requests."""
    if len(placed) < MIN_FIT or len(placed) != len(measured):
        return None
    rows: list[Features] = []

    def as_measured(i: int, x: Features) -> float:
        rows.append(x)
        return measured[i]

    run(placed, as_measured)
    active = [0, 1, 2, 3]
    for _ in range(4):
        b = least_squares([[1.0, *x] for x in rows], list(measured), active)
        if b is None:
            return None
        negative = [j for j in active if j > 0 and b[j] < 0]
        if not negative:
            return TtftModel((max(0.0, b[0]), b[1], b[2], b[3]))
        active = [j for j in active if j not in negative]
    return None


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def least_squares(x: list[list[float]], y: list[float], active: list[int] | None = None) -> list[float] | None:
    """Coefficients over the ``active`` columns (default all; the others 0), by the normal
    equations, each column scaled to unit size first (token counts and 1s differ by 10^4); None
    when they are singular."""
    if active is None:
        active = list(range(len(x[0])))
    scale = [max(1e-12, max(abs(row[j]) for row in x)) for j in active]
    n = len(active)
    a = [[sum(row[active[r]] * row[active[c]] for row in x) / (scale[r] * scale[c]) for c in range(n)]
         + [sum(row[active[r]] * t for row, t in zip(x, y, strict=True)) / scale[r]] for r in range(n)]
    for col in range(n):  # Gaussian elimination with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-12:
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col], strict=True)]
    out = [0.0] * len(x[0])
    for k, j in enumerate(active):
        out[j] = a[k][n] / a[k][k] / scale[k]
    return out
