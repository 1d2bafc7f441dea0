"""The engine's step costs on this machine, fitted to its own batch log: the simulator calibrated per machine.

    .venv/bin/python -m loadtests.fit_steps --results loadtests/results/gpu-fleet-batches-1 [--phases 201,202]

The same engine on the same arrivals stepped 1.7x slower on one H200 machine than on another
(runs 39 and 57, ``docs/gpu-fleet.md``), so no one profile is within ±30% of both. The GPU shim logs
every batch its engine ran (``loadtests/gpu/batch_log.py``: what it held and how long it took);
this fits the profile's step-cost constants to those durations, for one engine alone on the GPU
(a shared GPU adds its slicing, which this does not fit): a step costs ``step_overhead_s``, plus
``seq_overhead_s`` per sequence and ``ctx_overhead_s`` per context token read, plus the roofline of
its work at ``mfu`` (``perf.step_parts``; with ``dense_attention`` its attention at ``attn_eff``).
For each point of a grid of ``mfu`` (and ``attn_eff``) the three constants are a non-negative
least-squares fit to what is left; the best grid point wins. It prints the fit, the
``--set`` options that give ``loadtests.fidelity`` / ``fidelity_placed`` this machine's engine, and
the ``--profile-set`` options that give it to the simulated workers (``python -m proxy.sim``).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.gpu.batch_log import FIELDS
from loadtests.gpu.fleet_report import argv_value
from loadtests.jsonl import exists, read_text
from proxy.diagnose.shadow_ttft import least_squares
from proxy.sim import perf

F = {name: k for k, name in enumerate(FIELDS)}
MFU_GRID = (0.12, 0.14, 0.16, 0.18, 0.2, 0.22, 0.24, 0.26, 0.28, 0.3, 0.34, 0.38, 0.44, 0.5, 0.55, 0.6, 0.65)
ATTN_GRID = (0.25, 0.29, 0.33, 0.37, 0.41, 0.45)
FITTED = ("step_overhead_s", "seq_overhead_s", "ctx_overhead_s")


@dataclasses.dataclass(frozen=True)
class StepFit:
    mfu: float
    step_overhead_s: float
    seq_overhead_s: float
    ctx_overhead_s: float
    rms_s: float  # of a step's duration, fitted against measured
    steps: int
    attn_eff: float = 0.0  # with the profile's dense_attention; else 0 (not fitted)

    def options(self, flag: str = "--set") -> str:
        names = ("mfu", *FITTED) + (("attn_eff",) if self.attn_eff else ())
        return " ".join(f"{flag} {k}={getattr(self, k):.3g}" for k in names)


def work_of(batch: Sequence[Any]) -> perf.StepWork:
    """A logged batch as the simulator's step: the log has totals only, so the prompt tokens are
    split evenly over its prefills and the KV read over its decodes (a cached prefix a prefill
    reads counts as decode context: the same bytes moved)."""
    decodes, prefills = int(batch[F["decodes"]]), int(batch[F["prefills"]])
    new, kv = int(batch[F["q_tokens"]]) - decodes, int(batch[F["kv_read"]])
    cached = 0 if decodes else kv // max(1, prefills)  # a prefill-only step's reads are its prefixes
    chunks = [perf.PrefillChunk(max(1, new // prefills), cached)] * prefills if prefills else []
    ctx = [kv // decodes] * decodes if decodes else []
    return perf.StepWork(prefill=chunks, decode_contexts=ctx)


def _nonneg_fit(rows: list[list[float]], y: list[float]) -> tuple[list[float], float]:
    """The best fit over every subset of columns whose coefficients come out non-negative (the
    others held at 0): a cost is never negative, and with three columns the subsets are few."""
    best: tuple[list[float], float] = ([0.0] * len(rows[0]), math.sqrt(sum(v * v for v in y) / len(y)))
    for k in range(1, len(rows[0]) + 1):
        for cols in itertools.combinations(range(len(rows[0])), k):
            full = least_squares(rows, y, list(cols))
            if full is None or min(full) < 0:
                continue
            rms = math.sqrt(sum((v - sum(f * x for f, x in zip(full, r, strict=True))) ** 2
                                for r, v in zip(rows, y, strict=True)) / len(y))
            if rms < best[1]:
                best = (full, rms)
    return best


def fit_steps(batches: Sequence[Sequence[Any]], profile: perf.Profile,
              mfus: Sequence[float] = MFU_GRID, attn_effs: Sequence[float] = ATTN_GRID) -> StepFit:
    """``profile``'s step constants fitted to one engine's logged batches (those that ended); with
    its ``dense_attention`` the attention's efficiency too (a grid, as ``mfu``)."""
    done = [b for b in batches if b[F["end"]] is not None and b[F["decodes"]] + b[F["prefills"]] > 0]
    if len(done) < 3:
        raise ValueError(f"{len(done)} finished batches: too few to fit")
    works = [work_of(b) for b in done]
    rows = [[1.0, float(len(w.prefill) + len(w.decode_contexts)),
             float(sum(w.decode_contexts) + sum(c.context_before for c in w.prefill))] for w in works]
    best: StepFit | None = None
    for mfu, eff in itertools.product(mfus, attn_effs if profile.dense_attention else (0.0,)):
        bare = dataclasses.replace(profile, mfu=mfu, attn_eff=eff, step_overhead_s=0.0, seq_overhead_s=0.0,
                                   ctx_overhead_s=0.0, warmup_s=0.0)
        y = [b[F["end"]] - b[F["t"]] - perf.step_seconds(bare, w) for b, w in zip(done, works, strict=True)]
        coef, rms = _nonneg_fit(rows, y)
        if best is None or rms < best.rms_s:
            best = StepFit(mfu, coef[0], coef[1], coef[2], rms_s=rms, steps=len(done), attn_eff=eff)
    assert best is not None
    return best


def lone_overhead(batches: Sequence[Sequence[Any]], profile: perf.Profile) -> float | None:
    """The step's fixed cost (``step_overhead_s``) at which ``profile``'s median step residual on one
    engine's logged batches is nil: the machine's host speed, its other constants kept (the
    machines differed by their fixed cost, 53-87 ms a step, runs 57-59). One figure, so a warm-up
    phase can read it; a light one's small steps read it worst for the knee
    (``fidelity_placed --lone-holdout``). None with fewer than 10 finished batches."""
    done = [b for b in batches if b[F["end"]] is not None and b[F["decodes"]] + b[F["prefills"]] > 0]
    if len(done) < 10:
        return None
    bare = dataclasses.replace(profile, step_overhead_s=0.0, warmup_s=0.0)
    left = statistics.median(b[F["end"]] - b[F["t"]] - perf.step_seconds(bare, work_of(b)) for b in done)
    return round(max(0.0, float(left)), 4)


def phase_batches(engines: Sequence[dict[str, Any]]) -> list[list[list[Any]]]:
    """Each engine's logged batches of one phase (its ``engines`` as ``fleet.py`` writes them) from
    the phase's first arrival on. A fresh engine's first batches, the readiness probe's cold first
    forward (2 s for 770 tokens on run 115, all four engines at once), come before it in a
    warm-up's log: not the machine's speed, and they made that warm-up's first busy windows 4% full
    (its fixed cost read 103 ms for the run's 73)."""
    first = min((r["at"] for e in engines for r in e.get("requests") or []), default=-math.inf)
    return [[b for b in e.get("batches") or [] if b[F["t"]] >= first] for e in engines]


def lone_phase_batches(results: Path, log: str = "engines.jsonl") -> dict[int, list[list[Any]]]:
    """phase -> every logged batch of each phase run on one engine alone (``run_fleet.sh alone``);
    ``log``: "warmup.jsonl" for their warm-ups'. Empty where the run has no such log."""
    out: dict[int, list[list[Any]]] = {}
    if not exists(results / log):
        return out
    for line in read_text(results / log).splitlines():
        doc = json.loads(line)
        if len(doc["engines"]) == 1:
            out.setdefault(doc["phase"], []).extend(phase_batches(doc["engines"])[0])
    return out


def lone_batches(results: Path, phases: set[int] | None = None, log: str = "engines.jsonl") -> list[list[Any]]:
    """Every logged batch of the lone phases (``lone_phase_batches``) in ``phases``, or of all."""
    return [b for phase, rows in lone_phase_batches(results, log).items() if phases is None or phase in phases
            for b in rows]


def decode_residual(batches: Sequence[Sequence[Any]], profile: perf.Profile) -> tuple[int, float] | None:
    """(steps, median seconds measured less ``profile``'s) over one engine's finished decode-only
    steps: what its decode cost beyond what the model charges for the same batch and KV read.
    None without any such step."""
    rest = [b[F["end"]] - b[F["t"]] - perf.step_seconds(profile, work_of(b)) for b in batches
            if b[F["end"]] is not None and b[F["prefills"]] == 0 and b[F["decodes"]] > 0]
    return (len(rest), statistics.median(rest)) if rest else None


def lone_workloads(results: Path) -> dict[int, tuple[str, float]]:
    """phase -> (workload, rate) of the phases run on one engine alone, from the run's summary
    (a cell's phases follow its ``--phase-base``, one per rate and round)."""
    out: dict[int, tuple[str, float]] = {}
    for line in read_text(results / "summary.jsonl").splitlines():
        cell = json.loads(line)
        if cell.get("workers") != 1:
            continue
        base = int(argv_value(cell["argv"], "--phase-base", "0"))
        rates = list(cell["rates"]) * int(cell.get("repeat", 1))
        for k, rate in enumerate(rates, start=1):
            out[base + k] = (cell["shape"].get("workload", "shared"), float(rate))
    return out


def decode_by_workload(results: Path, profile: perf.Profile) -> str:
    """Whether decode costs more beside shared prefixes (an early H200 run read ITL 120 ms on shared
    prompts, 82 ms on unique ones, where the model charges context tokens alike whoever else holds
    them): each lone phase's median decode-step residual against ``profile`` at the run's own
    fixed cost (``lone_overhead`` over all its lone phases, so the machine's speed is taken out),
    and the median of the shared phases' less the unique phases'."""
    workloads = lone_workloads(results)
    by_phase = {phase: rows for phase, rows in lone_phase_batches(results).items() if phase in workloads}
    fixed = lone_overhead([b for rows in by_phase.values() for b in rows], profile)
    if fixed is None:
        return f"{results.name}: no lone phase with a batch log"
    machine = dataclasses.replace(profile, step_overhead_s=fixed)
    parts: list[str] = []
    side: dict[str, list[float]] = {"shared": [], "unique": []}
    for phase in sorted(by_phase):
        got = decode_residual(by_phase[phase], machine)
        if got is None:
            continue
        workload, rate = workloads[phase]
        side.setdefault(workload, []).append(got[1])
        parts.append(f"{phase} {workload} {rate:g}/s {1000 * got[1]:+.0f} ms ({got[0]})")
    gap = (f"shared less unique {1000 * (statistics.median(side['shared']) - statistics.median(side['unique'])):+.1f} ms"
           if side["shared"] and side["unique"] else "one workload only")
    return f"{results.name} (step_overhead_s {fixed}): {gap}; " + "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--phases", default="", help="comma-separated phase numbers (default: every lone phase)")
    p.add_argument("--profile", default=perf.GPU_FLEET_PROFILE, help="the profile whose other fields stay")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a profile field before the fit (e.g. dense_attention=False)")
    p.add_argument("--decode-by-workload", action="store_true",
                   help="instead of a fit: each lone phase's decode steps against the profile at the run's "
                        "own fixed cost, shared prompts beside unique ones")
    a = p.parse_args()
    phases = {int(x) for x in a.phases.split(",") if x} or None
    profile = perf.overridden(perf.PROFILES[a.profile], a.set)
    if a.decode_by_workload:
        print(decode_by_workload(a.results, profile))
        return
    fit = fit_steps(lone_batches(a.results, phases), profile)
    was = " ".join(f"{k}={getattr(profile, k):.3g}" for k in ("mfu", *FITTED, "attn_eff"))
    print(f"{fit.steps} steps of one engine alone in {a.results.name}: rms {1000 * fit.rms_s:.1f} ms a step")
    print(f"profile {profile.name}: {was}")
    print(f"fitted: {fit.options()}")
    print(f"simulated workers: python -m proxy.sim --profile {profile.name} {fit.options('--profile-set')}")


if __name__ == "__main__":
    main()
