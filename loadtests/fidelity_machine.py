"""The machine of the day: at what fixed step cost (``step_overhead_s``) a GPU round is replayed.

An eager engine's step is mostly host time, and hosts of one kind differ (45-90 ms a step on the
H100s; one drifted 81 -> 45 ms within a call), so each replay needs its machine's speed, read from
what the engines logged without the TTFTs the round is judged on:

* ``fleet_overhead``: a run's fleet from its step clock (replays bisected, ``fidelity_steps``; the
  whole run's, or its warm-up's alone) or its busy windows (``fleet_windows``; misled by small steps);
* ``round_overhead``: a round from its own batches (a fit, not a prediction);
* ``own_step_profile``: a round from its own step clock (a fit too: the machine's speed that round);
* ``previous_profiles``: each round from the phase run just before it (held out, and near in time);
* ``machine_of``: a round's profile by one of those, for ``fidelity_placed``'s reports.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from pathlib import Path

from loadtests import fleet_windows
from loadtests.fidelity_replay import Placed, alone, placed_phases, warmup_phases
from loadtests.fidelity_steps import calibrate_host, step_clock_overhead
from loadtests.fit_steps import lone_overhead
from loadtests.gpu.fleet import TOKENIZER
from proxy.sim import perf
from proxy.sim.tokenizer import Encoder


def fleet_overhead(run: Path, profile: perf.Profile, by: str, router: str | None = None) -> float | None:
    """The fleet's fixed step cost on ``run``'s machine, read as ``by`` says (``calibrated_report``)."""
    if by in ("steps", "warmup-steps"):
        return calibrate_host(run, profile, router=router, warmup=by == "warmup-steps")
    return fleet_windows.calibrate(run, profile, router=router, warmup=by == "warmup")


def machine_of(profile: perf.Profile, by: str) -> Callable[[Path, Placed], perf.Profile]:
    """Each round's profile (given its run's directory) with its run's (``batches``, ``warmup``,
    ``warmup-steps``), its own (``rounds``, ``own-steps``) or the phase before it's (``previous``) fixed cost, a
    lone engine's from its lone steps; the profile's where there is none."""
    memo: dict[tuple[Path, bool], float | None] = {}
    before: dict[Path, dict[int, perf.Profile]] = {}

    def of(run: Path, p: Placed) -> perf.Profile:
        if by == "rounds":
            return round_profile(p, profile)
        if by == "own-steps":
            return own_step_profile(p, profile)
        if by == "previous":
            if run not in before:
                before[run] = previous_profiles(run, profile)
            return before[run].get(p.phase, profile)
        key = (run, alone(p))
        if key not in memo:
            memo[key] = (fleet_windows.calibrate(run, profile, warmup=by.startswith("warmup"), lone=True) if alone(p)
                         else fleet_overhead(run, profile, by))
        got = memo[key]
        return profile if got is None else dataclasses.replace(profile, step_overhead_s=got)

    return of


def round_overhead(p: Placed, profile: perf.Profile) -> float:
    """The step's fixed cost at which the profile fills the round's own busy windows
    (``fleet_windows.machine_overhead``), one engine alone's from its steps
    (``fit_steps.lone_overhead``); the profile's where it has none."""
    got = (lone_overhead(p.batches[0], profile) if alone(p) and p.batches
           else fleet_windows.machine_overhead(profile, fleet_windows.busy_windows(p.batches, 1.0), 1.0))
    return profile.step_overhead_s if got is None else got


def round_profile(p: Placed, profile: perf.Profile) -> perf.Profile:
    """``profile`` at the round's own fixed cost (``round_overhead``)."""
    return dataclasses.replace(profile, step_overhead_s=round_overhead(p, profile))


def own_step_profile(p: Placed, profile: perf.Profile) -> perf.Profile:
    """``profile`` at the fixed cost of the round's own step clock (``step_clock_overhead``: its busy
    steps, matched by ``STEP_STATISTIC``, which small steps do not mislead as busy windows), one engine alone's from
    its steps: how fast the machine ran that round, read from its steps and not from the TTFTs it is
    judged on. Near a knee the replayed tail moves several times as much as this cost, and the
    machine drifts by 20% between one 25-s phase and the next (run 128), so this asks whether the
    model queues right once it knows the speed; ``previous_profiles`` is the held-out prediction."""
    if alone(p):
        return round_profile(p, profile)
    fixed = step_clock_overhead([p], profile, _encoder())
    return profile if fixed is None else dataclasses.replace(profile, step_overhead_s=fixed)


@functools.cache
def _encoder() -> Encoder:
    return Encoder(str(TOKENIZER))


def previous_profiles(results: Path, profile: perf.Profile) -> dict[int, perf.Profile]:
    """phase -> ``profile`` at the fixed cost read from the phase run just before it on the same
    engines (``round_overhead`` of its batches; a cell's first round: the cell's warm-up): held
    out like the warm-up, and as near in time as a reading can be, so that a machine drifting
    within a call is followed (run 120: 67 ms a step in the first warm-up, 81 in the first judged
    phase, 45-49 in the last cell). A phase with nothing before it is left out (the profile's)."""
    encoder = Encoder(str(TOKENIZER))
    ordered = sorted([*warmup_phases(results, encoder), *placed_phases(results)], key=lambda p: p.phase)
    out: dict[int, perf.Profile] = {}
    for before, p in itertools.pairwise(ordered):
        if p.warmup_s is not None or p.phase != before.phase + 1 or not any(before.batches):
            continue
        if alone(before):
            out[p.phase] = round_profile(before, profile)
        elif (fixed := step_clock_overhead([before], profile, encoder)) is not None:
            # the fleet's from its step clock: its busy windows misread small steps (runs 121-124)
            out[p.phase] = dataclasses.replace(profile, step_overhead_s=fixed)
    return out
