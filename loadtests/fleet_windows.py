"""The GPU's time by the profile's cost model, where every engine sharing it was stepping: the step
cost checked under sharing without a replay, and each machine's speed read from its batch log.

    .venv/bin/python -m loadtests.fleet_windows --results loadtests/results/gpu-fleet-h100-* [--width 1]

The fleet benchmark runs four engine processes on one GPU, and each logs the batches its scheduler
ran (``loadtests/gpu/batch_log.py``). In a window in which every one of them was stepping without a
gap the GPU is hardly ever idle, so the GPU-seconds the profile charges for the batches run in it
(a step's device time plus the share ``gpu_exclusive_host`` of its host time, as the shared GPU of
``proxy/sim/gpu_share.py`` holds it; a batch cut by the window's edge counts in part) should add
up to the window: their ratio, the window's *occupancy*, says how much of a saturated GPU's time
the cost model accounts for, with no step forming, sharing order or queue of the simulator's in
between. A least-squares fit of the windows' length on what their batches held (steps, decodes,
prompt tokens, attention pairs) gives the GPU's own price of each, per workload (``cost_fit``).

A slower machine runs the same batches in more time, so its occupancy drops; the step's fixed cost
that brings a run back to its profile's ``target`` occupancy is that machine's (``machine_overhead``): the simulator
calibrated to the machine of the day from the batches its engines ran, in a second and with no
replay, beside ``fidelity_steps.calibrate_host``, which bisects replays to the step clock.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.fit_steps import lone_batches, lone_overhead, phase_batches, work_of
from loadtests.gpu.batch_log import FIELDS
from loadtests.gpu.fleet_report import on_profile_gpu
from loadtests.jsonl import read_text
from proxy.diagnose.shadow_ttft import least_squares
from proxy.sim import perf

F = {name: k for k, name in enumerate(FIELDS)}
GAP_S = 0.01  # an engine's next batch starts within this of its last one's end: it was stepping
# The median run's occupancy with a profile as fitted, on that profile's GPU: the share of a
# saturated GPU's time the model accounts for on the machines it was fitted to, which a
# calibration brings a run back to (``target``). H100, h100-transformers-16l-dense-fit: runs 86-107
# with full reports (1-s windows), 0.97. H200, h200-transformers-7b-dense: runs 93-95
# (gpu-fleet-h200-1..3: 0.977, 0.988, 1.008), so that the H200 runs after them are held out.
OCCUPANCY = 0.97
OCCUPANCY_OF = {"h200-transformers-7b-dense": 0.988}
COSTS = ("step", "decode", "per 1k prompt tokens", "per 1M attention pairs")

Batch = Sequence[Any]
Window = list[tuple[float, Batch]]  # (the share of the batch inside the window, the batch)


def _spans(batches: Sequence[Batch]) -> list[tuple[float, float]]:
    """When an engine was stepping: its batches joined where the next began within ``GAP_S``."""
    spans: list[list[float]] = []
    for b in batches:
        if b[F["end"]] is None:
            continue
        if spans and b[F["t"]] - spans[-1][1] <= GAP_S:
            spans[-1][1] = max(spans[-1][1], b[F["end"]])
        else:
            spans.append([b[F["t"]], b[F["end"]]])
    return [(a, e) for a, e in spans]


def busy_windows(engines: Sequence[Sequence[Batch]], width: float) -> list[Window]:
    """Consecutive windows of ``width`` seconds in which every engine was stepping throughout, each
    with the batches that ran in it."""
    if len(engines) < 2 or not all(engines):
        return []
    spans = [_spans(b) for b in engines]
    if not all(spans):
        return []
    done = sorted((b for bs in engines for b in bs if b[F["end"]] is not None), key=lambda b: b[F["t"]])
    out: list[Window] = []
    t, stop = max(s[0][0] for s in spans), min(s[-1][1] for s in spans)
    while t + width <= stop:
        if all(any(a <= t and e >= t + width for a, e in sp) for sp in spans):
            win: Window = []
            for b in done:
                start, end = b[F["t"]], b[F["end"]]
                if start >= t + width:
                    break
                if end > t and end > start:
                    win.append(((min(end, t + width) - max(start, t)) / (end - start), b))
            out.append(win)
        t += width
    return out


def gpu_seconds(profile: perf.Profile, batch: Batch) -> float:
    """What the profile says one logged batch held the shared GPU for."""
    host, device = perf.step_parts(profile, work_of(batch))
    return profile.gpu_exclusive_host * host + device


def occupancy(profile: perf.Profile, windows: Sequence[Window], width: float) -> float:
    """The GPU-seconds the profile charges the windows' batches, over the windows' time."""
    if not windows:
        return math.nan
    charged = sum(share * gpu_seconds(profile, b) for win in windows for share, b in win)
    return charged / (width * len(windows))


def _contents(batch: Batch) -> list[float]:
    q, decodes = int(batch[F["q_tokens"]]), int(batch[F["decodes"]])
    # dense attention (perf.step_parts): every query token of the step against every key it reads
    return [1.0, float(decodes), (q - decodes) / 1000, q * (int(batch[F["kv_read"]]) + q) / 1e6]


def cost_fit(windows: Sequence[Window], width: float) -> dict[str, float] | None:
    """Seconds of GPU per step, per decode, per 1,000 prompt tokens and per million attention pairs
    (``COSTS``), fitted so that the windows' batches fill their windows (the occupancy taken as 1:
    a window's idle moments land in the per-step cost). None with too few windows."""
    rows = []
    for win in windows:
        row = [0.0] * len(COSTS)
        for share, b in win:
            for i, v in enumerate(_contents(b)):
                row[i] += share * v
        rows.append(row)
    if len(rows) < 2 * len(COSTS):
        return None
    c = least_squares(rows, [width] * len(rows))
    return None if c is None else dict(zip(COSTS, c, strict=True))


def target(profile: perf.Profile) -> float:
    """The occupancy a calibration brings a run back to: the profile's own median run's."""
    return OCCUPANCY_OF.get(profile.name, OCCUPANCY)


def machine_overhead(profile: perf.Profile, windows: Sequence[Window], width: float,
                     goal: float | None = None, tol_s: float = 0.0005) -> float | None:
    """The step's fixed cost (``step_overhead_s``) at which the profile fills the windows to
    ``goal`` (the profile's ``target``): the machine's speed of the day, from the batches its
    engines ran. None without windows."""
    if not windows:
        return None
    goal = target(profile) if goal is None else goal
    lo, hi = 0.0, 5 * max(profile.step_overhead_s, 0.01)  # occupancy grows with the fixed cost
    while hi - lo > tol_s:
        mid = (lo + hi) / 2
        fits = occupancy(dataclasses.replace(profile, step_overhead_s=mid), windows, width) < goal
        lo, hi = (mid, hi) if fits else (lo, mid)
    return round((lo + hi) / 2, 4)


def run_windows(results: Path, width: float, router: str | None = None,
                log: str = "engines.jsonl") -> dict[str, list[Window]]:
    """A run's busy windows by workload: "unique" where the engines reported (nearly) no cached
    prompt tokens in the phase, else "shared". ``router``: its phases only; ``log``: "warmup.jsonl"
    for the warm-up's (``fleet.py`` keeps it apart from the judged phases')."""
    out: dict[str, list[Window]] = {}
    path = results / log
    if not (path.exists() or path.with_suffix(".jsonl.gz").exists()):
        return out
    for line in read_text(path).splitlines():
        doc = json.loads(line)
        if router not in (None, doc.get("router")):
            continue
        engines = doc["engines"]
        asked = sum(r["prompt"] for e in engines for r in e["requests"])
        cached = sum(r.get("cached") or 0 for e in engines for r in e["requests"])
        form = "unique" if asked and cached < 0.05 * asked else "shared"
        out.setdefault(form, []).extend(busy_windows(phase_batches(engines), width))
    return out


def calibrate(results: Path, profile: perf.Profile, router: str | None = None, width: float = 1.0,
              warmup: bool = False, lone: bool = False) -> float | None:
    """``machine_overhead`` over every busy window of a run (``router``'s phases alone where named,
    so that the others are judged on a machine fitted without them; ``warmup``: the warm-up's
    alone, before any judged phase ran, so every phase is held out). ``lone``: one engine alone on
    the GPU has no shared windows; its fixed cost is read from its own steps instead
    (``fit_steps.lone_overhead`` over the run's phases of one engine)."""
    log = "warmup.jsonl" if warmup else "engines.jsonl"
    if lone:
        return lone_overhead(lone_batches(results, log=log), profile)
    return machine_overhead(profile, [w for ws in run_windows(results, width, router, log).values() for w in ws],
                            width)


def report(results: Sequence[Path], profile: perf.Profile, width: float) -> str:
    lines = [f"profile {profile.name} (step_overhead_s {profile.step_overhead_s}); {width:g}-s windows with "
             f"every engine stepping", "| run | workload | windows | occupancy | step_overhead_s to "
             f"{target(profile)} |", "|---|---|---|---|---|"]
    pooled: dict[str, list[Window]] = {}
    shares: list[float] = []  # each run-workload's occupancy
    for path in results:
        for form, windows in sorted(run_windows(path, width).items()):
            if not windows:
                continue
            pooled.setdefault(form, []).extend(windows)
            shares.append(occupancy(profile, windows, width))
            lines.append(f"| {path.name} | {form} | {len(windows)} | {shares[-1]:.3f} | "
                         f"{machine_overhead(profile, windows, width)} |")
    lines += ["", "| workload | windows | occupancy | " + " | ".join(f"GPU ms {c}" for c in COSTS) + " |",
              "|---|---|---|" + "---|" * len(COSTS)]
    for form, windows in sorted(pooled.items()):
        fit = cost_fit(windows, width)
        costs = " | ".join("-" if fit is None else f"{1000 * fit[c]:.2f}" for c in COSTS)
        lines.append(f"| {form} | {len(windows)} | {occupancy(profile, windows, width):.3f} | {costs} |")
    model = profile.model
    # the profile's own prices beside the fitted ones (a token's and a pair's where compute-bound)
    per_token = 2 * model.block_params * 1000 / (profile.gpu.peak_bf16_flops * profile.mfu)
    per_pair = model.attn_flops_per_pair * 1e6 / (profile.gpu.peak_bf16_flops * (profile.attn_eff or profile.mfu))
    floor = model.weight_bytes / (profile.gpu.hbm_bytes_per_s * profile.bw_eff)  # a small step reads the weights
    lines.append(f"| the profile | | | {1000 * (profile.gpu_exclusive_host * profile.step_overhead_s + floor):.2f} "
                 f"| {1000 * profile.seq_overhead_s * profile.seq_gpu_share:.2f} | {1000 * per_token:.2f} | "
                 f"{1000 * per_pair:.2f} |")
    if shares:
        lines.append(f"\nmedian occupancy over {len(shares)} run-workloads: {statistics.median(shares):.3f}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, nargs="+", required=True)
    p.add_argument("--profile", default="h100-transformers-16l-dense-fit")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    p.add_argument("--width", type=float, default=1.0, help="window seconds")
    a = p.parse_args()
    profile = perf.overridden(perf.PROFILES[a.profile], a.set)
    print(report(on_profile_gpu(a.results, profile.gpu.name), profile, a.width))


if __name__ == "__main__":
    main()
