"""The simulator against a real engine on routed phases: each request replayed where it really went.

    .venv/bin/python -m loadtests.fidelity_placed --results loadtests/results/gpu-fleet-replicas-2 [--set F=V]
    .venv/bin/python -m loadtests.fidelity_placed --engines --phase 2805 --results loadtests/results/gpu-fleet-default-2
    .venv/bin/python -m loadtests.fidelity_placed --grid seq_overhead_s=0.001,0.002 --grid gpu_exclusive_host=0.15,0.27 --results DIR...

``loadtests/fidelity.py`` replays the phases whose placement the trace alone fixes (the oracle, one
engine alone); this replays routed phases on the placement their engines logged
(``fidelity_replay.py``: what is matched and how a round is judged) and prints the tables: every
round judged, a grid of profile settings, per engine, each run or round on its own machine's step
cost (``--calibrate``; how it is read: ``fidelity_machine.py``), one engine alone held out on a
phase of its own run (``--lone-holdout``); the GPU against its own rounds (``fidelity_rounds.py``);
request and step costs (``fidelity_steps.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loadtests import fidelity_steps, fleet_windows
from loadtests.fidelity import OVERLOAD_S, TOLERANCE
from loadtests.fidelity_machine import (
    fleet_overhead,
    machine_of,
    own_step_profile,
    previous_profiles,
    round_overhead,
    round_profile,
)
from loadtests.fidelity_replay import (
    RANK_SLACK,
    Placed,
    alone,
    judge,
    mean_of,
    placed_phases,
    simulate,
    tail_bands,
)
from loadtests.fidelity_rounds import against_rounds, groups_report, repeatability
from loadtests.fidelity_steps import regress, steps_report
from loadtests.fit_steps import lone_overhead
from loadtests.gpu.fleet import TOKENIZER
from loadtests.gpu.fleet_report import gpu_model, on_profile_gpu, pct, run_gpu
from proxy.sim import perf
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder


def report(results: Sequence[Path], profile: perf.Profile,
           profile_of: Callable[[Placed], perf.Profile] | None = None) -> str:
    """The rounds replayed on their placements and judged; ``profile_of``: each round's own."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    lines = ["| run | router | rate /s | prompts | engine TTFT p50 real / sim / ratio | p95 real / sim / ratio "
             "| ITL p50 real / sim / ratio | reuse real / sim | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    logs: list[float] = []
    tails: list[tuple[float, float]] = []  # (real, sim) TTFT p95 of the routed rounds
    within = rounds = itl_within = itl_rounds = near = 0
    for path in results:
        for p in placed_phases(path):
            sim = simulate(p, profile if profile_of is None else profile_of(p), encoder, cache)
            close: list[bool] = []
            ok, cols = judge(p, sim, logs, close)
            near += not ok and close[0]
            if not alone(p):
                tails.append((pct(p.ttft, 0.95), sim["ttft_p95"]))
            real_itl = p.itl_p50
            itl_ratio = sim["itl_p50"] / real_itl if real_itl > 0 else math.nan
            if math.isfinite(itl_ratio):
                itl_rounds += 1
                itl_within += abs(itl_ratio - 1) <= TOLERANCE
            lines.append(f"| {path.name} | {p.router} | {p.rate:g} | {p.cell['prompts']} | " + " | ".join(cols)
                         + f" | {real_itl:.3f} / {sim['itl_p50']:.3f} / {itl_ratio:.2f}"
                         + f" | {p.reuse:.0%} / {sim['reuse']:.0%} | {'within ±30%' if ok else 'MISS'} |")
            rounds += 1
            within += ok
    mean = sum(logs) / len(logs) if logs else math.nan
    return (f"profile {profile.name}: {within} of {rounds} rounds within ±30%, mean |log(sim / real)| of TTFT p50 "
            f"and p95 {mean:.3f}; ITL p50 within ±30% in {itl_within} of {itl_rounds}; of the misses "
            f"{near} with both simulated values within {100 * RANK_SLACK:.0f} percentile points of the GPU's\n"
            f"{tail_bands(tails)}\n"
            + "\n".join(lines))


def grid(results: Sequence[Path], profile: perf.Profile, axes: Sequence[str]) -> str:
    """One line per combination of ``FIELD=V1,V2`` settings: the fleet's rounds (one engine alone
    left out: its machine's host judges it) within ±30%, their mean |log(sim / real)| and the tail
    (``tail_bands``). Phases and prompts are read once for every combination."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    phases = [p for path in results for p in placed_phases(path) if not alone(p)]
    names, values = zip(*((a.partition("=")[0], a.partition("=")[2].split(",")) for a in axes), strict=True)
    lines = []
    for combo in itertools.product(*values):
        settings = [f"{n}={v}" for n, v in zip(names, combo, strict=True)]
        cand = perf.overridden(profile, settings)
        within, logs, tails = 0, list[float](), list[tuple[float, float]]()
        for p in phases:
            sim = simulate(p, cand, encoder, cache)
            ok, _ = judge(p, sim, logs)
            tails.append((pct(p.ttft, 0.95), sim["ttft_p95"]))
            within += ok
        mean = sum(logs) / len(logs) if logs else math.nan
        lines.append(f"{' '.join(settings)}: {within} of {len(phases)} within ±30%, mean |log| {mean:.3f}; "
                     + tail_bands(tails))
        print(lines[-1], flush=True)
    return "\n".join(lines)


def per_engine(results: Sequence[Path], profile: perf.Profile, phase: int | None = None) -> str:
    """Per routed round and engine, real against simulated: requests, engine TTFT p50 / p95, the
    mean decode time (first token to done) and reuse. Where a round's totals miss, this says on
    which engine and whether in queueing (TTFT) or in decoding."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    lines = ["| run | router | phase | engine | requests | TTFT p50 real / sim | p95 real / sim "
             "| decode s real / sim | reuse real / sim |", "|---|---|---|---|---|---|---|---|---|"]
    for path in results:
        for p in placed_phases(path):
            if phase is not None and p.phase != phase:
                continue
            into: list[tuple[int, SimRequest]] = []
            simulate(p, profile, encoder, cache, into=into)
            # ``into`` is in arrival order, as the replay submitted them
            order = sorted(range(len(p.at)), key=lambda k: p.at[k])
            ttft = p.ttft
            for engine in sorted(set(p.engine)):
                mine = [(k, sim) for k, (n, sim) in zip(order, into, strict=True) if n == engine]
                real_rows = [p.engine_rows[k] for k, _ in mine]
                sims = [sim for _, sim in mine]
                real_ttft = [ttft[k] for k, _ in mine]
                sim_ttft = [math.inf if r.first_token_at is None else r.first_token_at - r.arrival for r in sims]
                real_decode = [d - f for _, _, f, d in real_rows if f is not None and d is not None]
                sim_decode = [r.finished_at - r.first_token_at for r in sims
                              if r.first_token_at is not None and r.finished_at is not None]
                prompt = sum(r[0] for r in real_rows) or 1
                sim_prompt = sum(len(r.input_ids) for r in sims) or 1
                lines.append(
                    f"| {path.name} | {p.router} | {p.phase} | {engine} | {len(mine)} "
                    f"| {pct(real_ttft, 0.5):.2f} / {pct(sim_ttft, 0.5):.2f} "
                    f"| {pct(real_ttft, 0.95):.2f} / {pct(sim_ttft, 0.95):.2f} "
                    f"| {mean_of(real_decode):.2f} / {mean_of(sim_decode):.2f} "
                    f"| {sum(r[1] for r in real_rows) / prompt:.0%} / {sum(r.cached_tokens for r in sims) / sim_prompt:.0%} |")
    return "\n".join(lines)


def calibrated_report(results: Sequence[Path], profile: perf.Profile, router: str | None = None,
                      by: str = "steps") -> str:
    """``report`` with each run replayed on its own machine's step cost, on ``router``'s phases
    alone where named: ``by`` "steps" bisects replays to the step clock (``calibrate_host``),
    "batches" fills the busy windows of the engines' batch logs (``fleet_windows.calibrate``),
    "warmup" the warm-up's windows, "warmup-steps" bisects replays of the warm-up to its step clock
    (both hold every round out), "rounds" so each round its own windows (the machine's speed round
    by round)."""
    if by == "rounds":
        return round_calibrated_report(results, profile)
    if by == "previous":
        return previous_calibrated_report(results, profile)
    if by == "own-steps":
        return (f"step_overhead_s per round from its own step clock (its busy steps' {fidelity_steps.STEP_STATISTIC})\n"
                + report(results, profile, profile_of=lambda p: own_step_profile(p, profile)))
    out = []
    whose = "its warm-up's" if by.startswith("warmup") else f"the {router} phases'" if router else "its"
    source = (f"{fidelity_steps.STEP_STATISTIC} step beside 3 busy neighbours" if by in ("steps", "warmup-steps")
              else f"batches filling the GPU to {fleet_windows.target(profile)} where every engine stepped")
    for path in results:
        if by in ("batches", "warmup", "warmup-steps") and any(alone(p) for p in placed_phases(path)):
            # one engine alone is read from its own steps, the fleet's rounds from its windows
            lone = fleet_windows.calibrate(path, profile, router=router, warmup=by.startswith("warmup"), lone=True)
            fleet = fleet_overhead(path, profile, by, router)
            out.append(f"{path.name}: step_overhead_s {lone} alone, {fleet} in the fleet (the profile's "
                       f"{profile.step_overhead_s:.4f}), from {whose} steps alone and {source}")
            of = machine_of(profile, by)
            out.append(report([path], profile, functools.partial(of, path)))
            continue
        overhead = fleet_overhead(path, profile, by, router)
        if overhead is None:
            out.append(f"{path.name}: no {by} log to calibrate on; {profile.name} as it is")
            out.append(report([path], profile))
            continue
        out.append(f"{path.name}: step_overhead_s {overhead:.4f} (the profile's {profile.step_overhead_s:.4f}), "
                   f"from {whose} {source}")
        out.append(report([path], dataclasses.replace(profile, step_overhead_s=overhead)))
    return "\n".join(out)


def previous_calibrated_report(results: Sequence[Path], profile: perf.Profile) -> str:
    """``report`` with each round on the fixed cost of the phase just before it (``previous_profiles``)."""
    out = []
    for path in results:
        of = previous_profiles(path, profile)
        out.append(f"{path.name}: step_overhead_s per round from the phase before it: "
                   + ", ".join(f"{k} {v.step_overhead_s:.4f}" for k, v in sorted(of.items())))
        out.append(report([path], profile, functools.partial(_of_phase, of, profile)))
    return "\n".join(out)


def _of_phase(of: dict[int, perf.Profile], default: perf.Profile, p: Placed) -> perf.Profile:
    return of.get(p.phase, default)


def round_calibrated_report(results: Sequence[Path], profile: perf.Profile) -> str:
    """``report`` with each round on the step's fixed cost of its own batch log (``round_overhead``):
    what the replay holds once it knows how fast the machine ran that round, from the batches the
    engines ran, not from the TTFTs it is judged on."""
    return (f"step_overhead_s per round, from its engines' batches filling the GPU to {fleet_windows.target(profile)} "
            f"where every engine stepped\n" + report(results, profile, profile_of=lambda p: round_profile(p, profile)))


def lone_holdout(results: Sequence[Path], profile_of: Callable[[Path], perf.Profile], rate: float) -> str:
    """One engine alone held out on a phase of its own run: each run's lone phase nearest ``rate``
    (a stand-in for a warm-up at that rate) gives the machine's fixed cost (``lone_overhead``),
    judged on the run's other lone phases, beside the profile as fitted and each phase on its own
    steps. Acceptable: TTFT p50 and p95 within ±30%, or p50 past ``OVERLOAD_S`` in both."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    counts = {"as fitted": 0, "the warm-up stand-in's": 0, "each phase's own": 0}
    judged = 0
    lines = []
    for path in results:
        phases = sorted((p for p in placed_phases(path) if alone(p) and p.batches), key=lambda p: p.phase)
        if len(phases) < 2:
            continue
        profile = profile_of(path)
        warm = min(phases, key=lambda p: (abs(p.rate - rate), p.phase))
        # a warm-up of under 10 steps reads nothing: the profile's then
        fixed = lone_overhead(warm.batches[0], profile)
        fixed = profile.step_overhead_s if fixed is None else fixed
        lines.append(f"{path.name}: phase {warm.phase} ({warm.rate:g}/s) reads step_overhead_s {fixed}")
        for p in phases:
            if p is warm:
                continue
            judged += 1
            for name, cost in (("as fitted", profile.step_overhead_s), ("the warm-up stand-in's", fixed),
                               ("each phase's own", round_overhead(p, profile))):
                sim = simulate(p, dataclasses.replace(profile, step_overhead_s=cost), encoder, cache)
                counts[name] += judge(p, sim, [])[0] or min(pct(p.ttft, 0.5), sim["ttft_p50"]) > OVERLOAD_S
    head = "; ".join(f"{name} fixed cost {n} of {judged}" for name, n in counts.items())
    return f"lone phases held out, the stand-in at the rate nearest {rate:g}/s: {head}\n" + "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, nargs="+", required=True)
    p.add_argument("--profile", default=perf.GPU_FLEET_PROFILE,
                   help="the simulated engines (figures dated before 2026-12-04: h200-transformers-7b-slices; before 2026-12-03 night: h200-transformers-7b)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                   help="sweep: one summary line per combination, the fleet's rounds only (repeatable)")
    p.add_argument("--regress", type=float, metavar="MIN_RATE", default=None,
                   help="fit one linear TTFT model on the real and on the simulated requests of phases at this rate or more")
    p.add_argument("--engines", action="store_true",
                   help="per routed round and engine: TTFT, decode time and reuse, real against simulated")
    p.add_argument("--phase", type=int, default=None, help="with --engines: only this phase")
    p.add_argument("--steps", action="store_true",
                   help="step cost by its content and the engines sharing the GPU, real against simulated "
                        "(runs whose shim recorded its steps)")
    p.add_argument("--calibrate", nargs="?", const="", default=None, metavar="ROUTER",
                   help="replay each run with the step's fixed host cost fitted to its own step clock "
                        "(the mean step beside 3 busy neighbours), not the profile's; ROUTER: fitted on "
                        "that router's phases alone")
    p.add_argument("--calibrate-by", choices=("steps", "batches", "warmup", "warmup-steps", "previous", "rounds", "own-steps"),
                   default="steps",
                   help="with --calibrate: fit the fixed cost to the step clock by replays (steps), to the "
                        "engines' batch logs where every engine stepped (batches, loadtests.fleet_windows), to "
                        "the warm-up's alone (warmup: every round held out), to the warm-up's step clock by replays "
                        "(warmup-steps: held out too), to the batch log of the phase just before each round, its "
                        "warm-up for a cell's first (previous: held out, and near in time), or to each round's "
                        "own batch log (rounds) or its own step clock (own-steps; ROUTER ignored with the last five)")
    p.add_argument("--step-statistic", choices=("mean", "median"), default=fidelity_steps.STEP_STATISTIC,
                   help="with --calibrate by a step clock (steps, warmup-steps, previous, own-steps): match the "
                        "replay's busy steps to the engines' by their mean (throughput) or median (before 2026-12-07)")
    p.add_argument("--repeatability", action="store_true",
                   help="the real engine against itself: rounds of one router in one cell, pair by pair")
    p.add_argument("--against-rounds", action="store_true",
                   help="traces run two rounds or more: the simulator against the GPU's median and the GPU's "
                        "rounds against it (with --calibrate batches|warmup, each run on its machine)")
    p.add_argument("--lone-holdout", type=float, metavar="RATE", default=None,
                   help="one engine alone: each run's lone phase nearest RATE fixes the machine's step cost, "
                        "judged on the run's other lone phases (runs on H100s read the 16-layer fit)")
    p.add_argument("--groups", action="store_true",
                   help="per shared-prefix round: groups kept on one engine, and prefixes prefilled again")
    a = p.parse_args()
    fidelity_steps.STEP_STATISTIC = a.step_statistic
    if a.groups:
        print(groups_report(a.results))
        return
    if a.lone_holdout is not None:
        h100 = perf.PROFILES["h100-transformers-16l-dense-fit"]
        print(lone_holdout(a.results, lambda run: h100 if run_gpu(run) == gpu_model(h100.gpu.name)
                           else perf.overridden(perf.PROFILES[a.profile], a.set), a.lone_holdout))
        return
    if a.repeatability:
        print(repeatability(a.results))
        return
    profile = perf.overridden(perf.PROFILES[a.profile], a.set)
    a.results = on_profile_gpu(a.results, profile.gpu.name)
    if a.grid:
        grid(a.results, profile, a.grid)  # prints as it goes
        return
    if a.steps:
        print(steps_report(a.results, profile))
        return
    if a.regress is not None:
        print(regress(a.results, profile, a.regress))
        return
    if a.engines:
        print(per_engine(a.results, profile, a.phase))
        return
    if a.against_rounds:
        print(against_rounds(a.results, profile, None if a.calibrate is None else machine_of(profile, a.calibrate_by)))
        return
    print(report(a.results, profile) if a.calibrate is None
          else calibrated_report(a.results, profile, a.calibrate or None, a.calibrate_by))


if __name__ == "__main__":
    main()
