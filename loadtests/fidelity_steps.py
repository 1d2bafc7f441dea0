"""What a request and an engine step cost, on the GPU against the replay of the same placements: one
linear TTFT model fitted on both (``--regress``), the step clock by its content and the engines
busy beside it (``--steps``), and the fixed host cost at which the replay steps as a run's engines
did (``calibrate_host``, ``--calibrate``). The command line is ``fidelity_placed.py``'s."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.fidelity_replay import (
    Placed,
    alone,
    engine_count,
    mean_of,
    placed_phases,
    simulate,
    warmup_phases,
)
from loadtests.gpu.fleet import TOKENIZER, Shape
from loadtests.gpu.fleet_report import pct
from proxy.diagnose.shadow_ttft import least_squares
from proxy.sim import perf
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder

Row = tuple[int, float, float | None, float | None, int, int]  # engine, at, first, done, prompt, cached

# The step clock is matched by its mean step, which sets how many steps an engine runs a second and so
# how fast its queue drains; near a knee a few percent there is the tail. Matched by the median
# instead (before 2026-12-07), the replay's steps came out 5-10% slow on average (fuller steps cost it
# more than the engine), and its queues long: held out on the phase before, 184 of 271 H100 fleet
# rounds within ±30% against 205 by the mean (the tight pools 40 of 76 against 50). ``--step-statistic``.
STEP_STATISTIC = "mean"


def step_statistic(seconds: Sequence[float]) -> float:
    """The steps' mean (or median: ``STEP_STATISTIC``); nan for none."""
    if not seconds:
        return math.nan
    return math.fsum(seconds) / len(seconds) if STEP_STATISTIC == "mean" else pct(list(seconds), 0.5)


def _real_rows(p: Placed, base: int = 0) -> list[Row]:
    """The phase's requests as its GPU engines reported them, engines numbered from ``base``."""
    return [(base + e, at, first, done, prompt, cached)
            for e, at, (prompt, cached, first, done) in zip(p.engine, p.at, p.engine_rows, strict=True)]


def _sim_rows(replayed: Sequence[tuple[int, SimRequest]], base: int = 0) -> list[Row]:
    """The same for the replay's (engine, request) pairs."""
    return [(base + e, r.arrival, r.first_token_at, r.finished_at, len(r.input_ids), r.cached_tokens)
            for e, r in replayed]


def _features(rows: Sequence[Row]) -> tuple[list[list[float]], list[float]]:
    """Per answered request: [1, its uncached tokens / 1000, requests running on its engine at its
    arrival / 10, requests there still without a first token / 10] and its engine TTFT."""
    x, y = [], []
    by_engine: dict[int, list[Row]] = {}
    for r in rows:
        by_engine.setdefault(r[0], []).append(r)
    for same in by_engine.values():
        for _, at, first, _, prompt, cached in same:
            if first is None:
                continue
            running = sum(1 for o in same if o[2] is not None and o[2] <= at < (o[3] if o[3] is not None else math.inf))
            waiting = sum(1 for o in same if o[1] < at and (o[2] is None or o[2] > at))
            x.append([1.0, (prompt - cached) / 1000, running / 10, waiting / 10])
            y.append(first - at)
    return x, y


def _itl_features(rows: Sequence[Row], tokens: int, samples: int = 10) -> tuple[list[list[float]], list[float]]:
    """Per request of one phase that decoded: [1, requests decoding on its own engine, decoding on
    the others, waiting for a first token on its own, waiting on the others], each averaged over
    ``samples`` instants inside its decode, and its time per output token. Engines that share a
    GPU slow each other: the split says by how much, against what each engine's own batch costs."""
    starts: dict[int, list[float]] = {}
    ends: dict[int, list[float]] = {}
    arrivals: dict[int, list[float]] = {}
    for engine, at, first, done, _, _ in rows:
        arrivals.setdefault(engine, []).append(at)
        if first is not None:
            starts.setdefault(engine, []).append(first)
            ends.setdefault(engine, []).append(done if done is not None else math.inf)
    for table in (starts, ends, arrivals):
        for times in table.values():
            times.sort()

    def count(table: dict[int, list[float]], engine: int, t: float) -> int:
        return bisect.bisect_right(table.get(engine, []), t)

    x, y = [], []
    for engine, _, first, done, _, _ in rows:
        if first is None or done is None or done <= first:
            continue
        sums = [0.0, 0.0, 0.0, 0.0]
        for i in range(1, samples + 1):
            t = first + (done - first) * i / (samples + 1)
            for e in arrivals:
                decoding = count(starts, e, t) - count(ends, e, t)
                waiting = count(arrivals, e, t) - count(starts, e, t)
                own = 0 if e == engine else 1
                sums[own] += decoding
                sums[2 + own] += waiting
        x.append([1.0, *(v / samples for v in sums)])
        y.append((done - first) / max(1, tokens - 1))
    return x, y


def regress(results: Sequence[Path], profile: perf.Profile, min_rate: float) -> str:
    """The same linear TTFT model fitted on the real engines' requests and on their placed replays
    (phases at ``min_rate`` or more): where the percentiles agree, do the costs? (The ``ttft``
    policy learns these; a simulator whose prefill is cheap next to its queueing teaches it to
    spill.) Then the time per output token split by whose requests share the GPU (phases of
    several engines)."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    real: list[Row] = []
    sim: list[Row] = []
    itl: dict[str, tuple[list[list[float]], list[float]]] = {"real": ([], []), "sim": ([], [])}
    phases = (p for path in results for p in placed_phases(path) if p.rate >= min_rate)
    for n, p in enumerate(phases):
        base = 1000 * (n + 1)  # engines of different phases never mix
        phase_real = _real_rows(p, base)
        got: list[tuple[int, SimRequest]] = []
        simulate(p, profile, encoder, cache, into=got)
        phase_sim = _sim_rows(got, base)
        real.extend(phase_real)
        sim.extend(phase_sim)
        if engine_count(p.cell) > 1:
            tokens = Shape(**p.cell["shape"]).output_tokens
            for name, rows in (("real", phase_real), ("sim", phase_sim)):
                fx, fy = _itl_features(rows, tokens)
                itl[name][0].extend(fx)
                itl[name][1].extend(fy)
    lines = [f"engine TTFT ~ c0 + per 1,000 uncached tokens + per 10 running + per 10 waiting (phases >= {min_rate:g}/s)"]
    for name, rows in (("real", real), ("sim", sim)):
        x, y = _features(rows)
        c = (least_squares(x, y) if x else None) or [math.nan] * 4
        # a request reaching an engine with nothing waiting and at most 3 running: the sharing of
        # the GPU at its lightest, where no queue of its own explains the TTFT
        idle = [t for row, t in zip(x, y, strict=True) if row[3] == 0 and row[2] <= 0.3]
        lines.append(f"{name}: {len(y)} requests; c0 {c[0]:.3f} s, {c[1]:.3f} s per 1,000 uncached, "
                     f"{c[2]:.3f} s per 10 running, {c[3]:.3f} s per 10 waiting; "
                     f"median at an idle engine {pct(idle, 0.5):.3f} s ({len(idle)})")
    lines.append("time per output token ~ c0 + per request decoding on its engine / on the others "
                 "+ per request waiting there / on the others (ms)")
    for name, (x, y) in itl.items():
        c = (least_squares(x, y) if x else None) or [math.nan] * 5
        lines.append(f"{name}: {len(y)} requests, mean {1000 * mean_of(y):.0f}; c0 {1000 * c[0]:.0f}, decoding "
                     f"{1000 * c[1]:.1f} / {1000 * c[2]:.1f}, waiting {1000 * c[3]:.1f} / {1000 * c[4]:.1f}")
    return "\n".join(lines)


# A request's first token and the step that gave it are one instant on a simulated engine; on a
# GPU engine the shim stamps them a few ms apart (two threads).
STEP_MATCH_S = 0.03

StepRow = tuple[float, int, int, int]  # duration, requests decoding through it, uncached tokens it finished, others busy


def _covered(spans: Sequence[tuple[float, float]], t0: float, t1: float) -> bool:
    """Whether requests in flight (arrival to done, sorted by arrival) cover all of ``t0``-``t1``."""
    reach = t0
    for at, done in spans:
        if at > reach + STEP_MATCH_S:
            break
        reach = max(reach, done)
    return reach >= t1 - STEP_MATCH_S


def _step_rows(steps: Sequence[Sequence[tuple[float, int]]], rows: Sequence[Row]) -> list[StepRow]:
    """Per interval between two consecutive token-giving steps of one engine that had work in
    flight all along: its length, the requests that decoded through it (tokens given at its end
    less first tokens), the uncached prompt tokens of the requests whose first token ended it, and
    how many other engines had a request in flight at its middle. (A prefill chunk that finished
    no prompt gives no token: its time falls in the interval of the step after it.)"""
    by_engine: dict[int, list[Row]] = {}
    for r in rows:
        by_engine.setdefault(r[0], []).append(r)
    spans = {e: sorted((r[1], math.inf if r[3] is None else r[3]) for r in mine) for e, mine in by_engine.items()}
    out: list[StepRow] = []
    for e, st in enumerate(steps):
        mine = by_engine.get(e, [])
        for (t0, _), (t1, tokens) in itertools.pairwise(st):
            if not _covered(spans.get(e, []), t0, t1):
                continue  # idle for part of it
            first = [r for r in mine if r[2] is not None and abs(r[2] - t1) <= STEP_MATCH_S]
            mid = (t0 + t1) / 2
            busy = sum(1 for o, sp in spans.items() if o != e and any(at < mid < done for at, done in sp))
            out.append((t1 - t0, max(0, tokens - len(first)), sum(r[4] - r[5] for r in first), busy))
    return out


def _sim_step_rows(p: Placed, profile: perf.Profile, encoder: Encoder,
                   cache: dict[Any, list[list[int]]]) -> list[StepRow]:
    """``_step_rows`` of the round replayed on its own placement."""
    into: list[tuple[int, SimRequest]] = []
    sim_steps: list[tuple[int, float, int]] = []
    simulate(p, profile, encoder, cache, into=into, steps_into=sim_steps)
    per_engine: list[list[tuple[float, int]]] = [[] for _ in range(engine_count(p.cell))]
    for e, t, n in sim_steps:
        per_engine[e].append((t, n))
    return _step_rows(per_engine, _sim_rows(into))


StepCost = tuple[int, float, float, float, float]  # steps, median s, c0 s, s per request decoding, s per 1,000 tokens


def step_costs(results: Sequence[Path], profile: perf.Profile) -> dict[tuple[int, str], StepCost]:
    """What one engine step costs, by what is in it and how many other engine processes share the
    GPU meanwhile, on the GPU engines (their shim's step clock) and on the replay of the same
    placements: step seconds ~ c0 + per request decoding + per 1,000 uncached tokens prefilled.
    Keyed by (other engines busy, "real" or "sim")."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    got: dict[str, list[StepRow]] = {"real": [], "sim": []}
    for path in results:
        for p in placed_phases(path):
            if not any(p.steps):
                continue
            got["real"] += _step_rows(p.steps, _real_rows(p))
            got["sim"] += _sim_step_rows(p, profile, encoder, cache)
    out: dict[tuple[int, str], StepCost] = {}
    for busy in range(4):
        for side, rows in got.items():
            mine = [r for r in rows if r[3] == busy]
            c = (least_squares([[1.0, r[1], r[2] / 1000] for r in mine], [r[0] for r in mine])
                 if len(mine) >= 10 else None) or [math.nan] * 3
            out[(busy, side)] = (len(mine), pct([r[0] for r in mine], 0.5), c[0], c[1], c[2])
    return out


def calibrate_host(results: Path, profile: perf.Profile, busy: int = 3, tol_s: float = 0.001,
                   router: str | None = None, warmup: bool = False) -> float | None:
    """The step's fixed host cost (``step_overhead_s``) that makes the replayed engines' mean step
    beside ``busy`` busy neighbours what this run's engines clocked (their shim's step log): the
    simulator calibrated to the machine of the day from its step clock, never from the TTFTs it is
    then judged on. One H100 stepped 16% slower than another on the same engines (runs 90 and 91),
    which past the knee is a 1.5-2x longer tail. ``router``: fitted on that router's phases only, so
    the others' are judged on a machine fitted without them. ``warmup``: on the cells' warm-ups
    alone (``warmup_phases``), before any judged round ran, so every round is held out. None where
    the run logged no steps."""
    encoder = Encoder(str(TOKENIZER))
    phases = [p for p in (warmup_phases(results, encoder) if warmup else placed_phases(results))
              if router in (None, p.router)]
    return step_clock_overhead(phases, profile, encoder, busy, tol_s)


def step_clock_overhead(phases: Sequence[Placed], profile: perf.Profile, encoder: Encoder, busy: int = 3,
                        tol_s: float = 0.001) -> float | None:
    """``calibrate_host`` on these phases (the fleet's: one engine alone has no busy neighbours);
    None where they logged fewer than 10 steps beside ``busy`` busy neighbours."""
    cache: dict[Any, list[list[int]]] = {}
    phases = [p for p in phases if any(p.steps) and not alone(p)]
    real = [r for p in phases for r in _step_rows(p.steps, _real_rows(p)) if r[3] == busy]
    if len(real) < 10:
        return None
    target = step_statistic([r[0] for r in real])

    def sim_step(overhead: float) -> float:
        cand = dataclasses.replace(profile, step_overhead_s=overhead)
        return step_statistic([r[0] for p in phases for r in _sim_step_rows(p, cand, encoder, cache) if r[3] == busy])

    lo, hi = 0.0, 4 * profile.step_overhead_s  # the step grows with the fixed cost
    while hi - lo > tol_s:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sim_step(mid) < target else (lo, mid)
    return round((lo + hi) / 2, 4)


def steps_report(results: Sequence[Path], profile: perf.Profile) -> str:
    lines = ["| other engines busy | side | steps | median ms | c0 ms | ms per request decoding "
             "| ms per 1,000 uncached tokens |", "|---|---|---|---|---|---|---|"]
    for (busy, side), (n, median, c0, dec, tokens) in step_costs(results, profile).items():
        lines.append(f"| {busy} | {side} | {n} | {1000 * median:.0f} | {1000 * c0:.0f} | {1000 * dec:.1f} | "
                     f"{1000 * tokens:.0f} |")
    return f"profile {profile.name}\n" + "\n".join(lines)
