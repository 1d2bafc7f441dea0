"""Does the simulator predict a real engine under load? Replays real-engine traces; prints sim/real.

    .venv/bin/python -m loadtests.fidelity [--results loadtests/results/gpu-fleet] [--profile P]

The real side is committed: ``requests.jsonl`` / ``summary.jsonl`` of the fleet benchmark
(``loadtests/gpu/fleet.py``) run on the H200 by ``loadtests/gpu/run_fleet.sh calibrate``. Every
cell whose placement is fixed by the trace alone is replayed: ``direct0`` (one engine alone on the
GPU) and ``oracle`` (group g on engine g mod N, N engine processes sharing the GPU). For each
phase the replay rebuilds the very prompts the real run sent (same seed, same text generator,
same BPE tokenizer, so the same token ids) and the same arrival times, and runs N simulated
engines (``proxy.sim`` scheduler and step model) on a virtual clock with one
``SharedGpu`` between them: no sockets, no sleeping, seconds of CPU for minutes of traffic, on any
machine. Printed per (cell, rate): real and simulated TTFT p50/p95, ITL p50, e2e p50, and the
ratio; points where the real engine is overloaded (TTFT p50 > 3 s) are checked for being
overloaded in the simulator too. ``--fit`` searches the profile's host-overhead and sharing
constants for the smallest error (the README of simworker says which were fitted so).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.gpu.fleet import TOKENIZER, Shape, phase_order, phase_texts, text_key, trace
from loadtests.gpu.fleet_report import argv_value, on_profile_gpu, pct
from loadtests.jsonl import exists, read_jsonl
from proxy.sim import perf
from proxy.sim.config import SimConfig
from proxy.sim.engine import Engine
from proxy.sim.gpu_share import GpuSteps, gpu_pool
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder

RESULTS = Path(__file__).parent / "results" / "gpu-fleet"
OVERLOAD_S = 3.0
TOLERANCE = 0.30


@dataclass
class Point:
    cell: str
    router: str
    rate: float
    real: dict[str, float]
    sim: dict[str, float]


def metrics(ttft: Sequence[float], itl: Sequence[float], e2e: Sequence[float]) -> dict[str, float]:
    return {"ttft_p50": pct(list(ttft), 0.5), "ttft_p95": pct(list(ttft), 0.95),
            "itl_p50": pct(list(itl), 0.5), "e2e_p50": pct(list(e2e), 0.5)}


def decoding_mean(spans: Sequence[tuple[float, float | None, float | None]], engines: int) -> float:
    """Mean requests decoding per engine (first token out, not yet done) over the busy part of a
    phase: from 40% of its arrival span to its last arrival, sampled every 0.25 s. ``spans`` are
    (arrival, first token, done) on one clock. Near a lone engine's capacity, one request more in
    the simulated KV-bound batch was what made the simulator optimistic (``gpu-fleet-alone-1``'s
    NOTE: the engine's safety margin, read wrong)."""
    if not spans:
        return math.nan
    arrivals = [a for a, _, _ in spans]
    start, end = min(arrivals), max(arrivals)
    t, counts = start + 0.4 * (end - start), []
    while t <= end:
        counts.append(sum(1 for _, f, d in spans if f is not None and f <= t and (d is None or d > t)))
        t += 0.25
    return statistics.mean(counts) / engines if counts else math.nan


def batch_entry(sched: Any, step: Any, now: float) -> list[Any]:
    """A simulated step as the GPU shim's batch log records a real one (its end set when it ends)."""
    first = sum(1 for req, n in step.prefill if req.prefilled + n >= len(req.input_ids))
    cache = sched.cache
    # The engine keeps a prompt in its waiting queue until a step takes a chunk of it: one matched
    # to the cache but skipped (over the KV-read budget) still waits, as it does here.
    taken = {id(req) for req, _ in step.prefill}
    skipped = sum(1 for r in sched.prefilling if r.prefilled == r.cached_tokens and id(r) not in taken)
    return [now, None, len(step.decode), len(step.prefill),
            len(step.decode) + sum(n for _, n in step.prefill),
            sum(step.work.decode_contexts) - len(step.decode) + sum(c.context_before for c in step.work.prefill),
            first, (cache.available_tokens + cache.evictable_tokens) // cache.page_size,
            len(sched.waiting) + skipped, len(sched.running) + len(sched.prefilling), 0]


def replay(prompts: list[list[int]], times: list[float], placement: list[int], n_engines: int,
           output_tokens: int, profile: perf.Profile, config: SimConfig, horizon_s: float,
           shared_gpu: bool = True, into: list[tuple[int, SimRequest]] | None = None,
           steps_into: list[tuple[int, float, int]] | None = None,
           batches_into: list[tuple[int, list[Any]]] | None = None) -> dict[str, float]:
    """N engines sharing one GPU on a virtual clock. A request unanswered ``horizon_s`` after the
    last arrival counts as infinitely slow, as the fleet benchmark cancels it then. ``into``
    receives (engine, request) of every request, for per-request analysis; ``steps_into``
    (engine, end, tokens) of every step that gave a token, as the GPU shim's step clock sees them;
    ``batches_into`` (engine, entry) of every step as the GPU shim's batch log has them
    (``loadtests/gpu/batch_log.FIELDS``)."""
    engines = [Engine(dataclasses.replace(config), profile=profile) for _ in range(n_engines)]
    stamps: dict[int, list[float]] = defaultdict(list)
    reqs: list[SimRequest] = []
    gpus: GpuSteps[int] = gpu_pool(profile, n_engines, shared_gpu)  # by engine index
    in_flight: dict[int, Any] = {}
    first = [True] * n_engines
    open_batches: dict[int, list[Any]] = {}
    now, k = 0.0, 0
    stop_at = (times[-1] if times else 0.0) + horizon_s
    while now <= stop_at:
        while k < len(times) and times[k] <= now:
            req = SimRequest(rid=str(k), input_ids=prompts[k], max_new_tokens=output_tokens)
            engines[placement[k]].scheduler.submit(req, times[k])
            reqs.append(req)
            if into is not None:
                into.append((placement[k], req))
            k += 1
        for i in gpus.done(now):
            if batches_into is not None:
                entry = open_batches.pop(i)
                entry[1] = now
                batches_into.append((i, entry))
            advanced = engines[i].scheduler.finish_step(in_flight.pop(i), now)
            for req in advanced:
                stamps[id(req)].append(now)
            if steps_into is not None and advanced:
                steps_into.append((i, now, len(advanced)))
        for i, e in enumerate(engines):
            if i in in_flight or not e.scheduler.has_work():
                continue
            step = e.scheduler.next_step(now)
            if step is None:
                continue
            if first[i]:
                step.work = dataclasses.replace(step.work, first_step=False)
                first[i] = False
            host, device = perf.step_parts(profile, step.work)
            in_flight[i] = step
            if batches_into is not None:
                open_batches[i] = batch_entry(e.scheduler, step, now)
            gpus.submit(i, now, host, device)
        events = [gpus.next_event()] + ([times[k]] if k < len(times) else [])
        if not in_flight and k >= len(times):
            break
        now = min(events)
    ttft, itl, e2e = [], [], []
    for req in reqs:
        if req.first_token_at is None or req.finished_at is None:
            ttft.append(math.inf)
            continue
        ttft.append(req.first_token_at - req.arrival)
        e2e.append(req.finished_at - req.arrival)
        marks = stamps[id(req)]
        gaps = [b - a for a, b in itertools.pairwise(marks)]
        if gaps:
            itl.append(statistics.median(gaps))
    out = metrics(ttft, itl, e2e)
    out["decoding"] = decoding_mean([(r.arrival, r.first_token_at, r.finished_at) for r in reqs], n_engines)
    # prefix reuse captured, as the fleet benchmark counts it from the engines (matched / prompt)
    prompt_tokens = sum(len(r.input_ids) for r in reqs)
    out["reuse"] = sum(r.cached_tokens for r in reqs) / prompt_tokens if prompt_tokens else 0.0
    return out


def real_points(results: Path) -> list[tuple[dict[str, Any], str, float, dict[str, float]]]:
    """(cell, router, rate, real metrics) for every fixed-placement phase of the committed run
    (none for a run that came back without its requests or summary, e.g. one cut short)."""
    if not (exists(results / "requests.jsonl") and exists(results / "summary.jsonl")):
        return []
    recs = read_jsonl(results / "requests.jsonl")
    cells = read_jsonl(results / "summary.jsonl")
    traces = read_jsonl(results / "engines.jsonl") if exists(results / "engines.jsonl") else []
    out = []
    for cell in cells:
        if cell.get("prompts", "text") != "text":
            continue  # the replay renders text prompts only
        for router in cell["routers"]:
            if router not in ("oracle", "direct0"):
                continue
            for rate in cell["rates"]:
                if f"{rate:g}" not in cell["summary"].get(router, {}):
                    continue  # not run (a cell cut short by its time limit)
                rows = [r for r in recs if r["router"] == router and r["rate"] == rate
                        and r["workload"] == cell["shape"]["workload"]
                        and _phase_of(cell, router, rate) == r["phase"]]
                ttft = [r["ttft"] if r["ok"] and r["ttft"] is not None else math.inf for r in rows]
                ok = [r for r in rows if r["ok"]]
                real = metrics(ttft, [r["itl"] for r in ok if r["itl"] is not None],
                               [r["e2e"] for r in ok if r["e2e"] is not None])
                reuse = cell["summary"][router][f"{rate:g}"].get("reuse")  # the engines' own count
                real["reuse"] = math.nan if reuse is None else float(reuse)
                real["decoding"] = _real_decoding(traces, router, rate, _phase_of(cell, router, rate))
                out.append((cell, router, rate, real))
    return out


def _real_decoding(traces: list[dict[str, Any]], router: str, rate: float, phase: int) -> float:
    """``decoding_mean`` of a phase from the engines' own request traces (``engines.jsonl``)."""
    for row in traces:
        if row["router"] == router and row["rate"] == rate and row["phase"] == phase:
            spans = [(r["at"], r.get("first"), r.get("done")) for e in row["engines"] for r in e["requests"]]
            return decoding_mean(spans, len(row["engines"]))
    return math.nan


def _phase_of(cell: dict[str, Any], router: str, rate: float) -> int:
    """The phase number fleet.py gave (router, rate) in this cell (its first round, same order)."""
    base = int(argv_value(cell["argv"], "--phase-base", "0"))
    order = phase_order(cell["routers"], cell["rates"], int(cell.get("repeat", 1)))
    for k, (r, _, name) in enumerate(order):
        if name == router and r == rate:
            return base + 1 + k
    raise KeyError((router, rate))


def simulate(points: list[tuple[dict[str, Any], str, float, dict[str, float]]], profile: perf.Profile,
             encoder: Encoder, cache: dict[Any, Any], shared_gpu: bool = True) -> list[Point]:
    out = []
    for cell, router, rate, real in points:
        argv = cell["argv"]
        shape = Shape(**cell["shape"])
        seed = cell["seed"]
        phase_s = float(argv_value(argv, "--phase-s", "30"))
        drain_s = float(argv_value(argv, "--drain-s", "20"))
        arrivals = trace(rate, phase_s, shape, seed)
        phase = text_key(cell.get("text", "fresh"), int(argv_value(argv, "--phase-base", "0")), rate,
                         _phase_of(cell, router, rate))
        key = (phase, rate, shape, seed)  # one phase number can recur in runs of other seeds
        if key not in cache:
            cache[key] = [encoder.encode(s + "\n\n" + q) for s, q in phase_texts(arrivals, shape, phase)]
        n = cell["workers"]
        placement = [0 if router == "direct0" else g % n for _, g in arrivals]
        config = SimConfig(profile="h200-transformers-7b", max_total_tokens=48_000, page_size=32,
                           max_running_requests=64)
        sim = replay(cache[key], [t for t, _ in arrivals], placement, n if router == "oracle" else 1,
                     shape.output_tokens, profile, config, drain_s, shared_gpu)
        label = f"{'fleet x' + str(n) if router == 'oracle' else 'one engine'} {shape.workload}"
        out.append(Point(label, router, rate, real, sim))
    return out


def error(points: list[Point]) -> float:
    """Mean absolute log ratio over the points below overload, plus a penalty for each overload
    point the simulator does not overload."""
    total, n = 0.0, 0
    for p in points:
        if p.real["ttft_p50"] > OVERLOAD_S:
            total += 0.0 if p.sim["ttft_p50"] > OVERLOAD_S else 1.0
            continue
        for key in ("ttft_p50", "ttft_p95", "itl_p50"):
            if p.sim[key] <= 0 or math.isinf(p.sim[key]):
                total += 3.0
            else:
                total += abs(math.log(p.sim[key] / p.real[key]))
            n += 1
    return total / max(1, n)


def judge(p: Point) -> str:
    """``within ±30%`` (TTFT p50, p95 and ITL p50), ``overloaded in both``, or a MISS."""
    if p.real["ttft_p50"] > OVERLOAD_S:
        return "overloaded in both" if p.sim["ttft_p50"] > OVERLOAD_S else "MISS: sim not overloaded"
    for key in ("ttft_p50", "ttft_p95", "itl_p50"):
        r, s = p.real[key], p.sim[key]
        if math.isinf(r) or math.isinf(s) or not r or abs(s / r - 1) > TOLERANCE:
            return "MISS"
    return "within ±30%"


def tally(points: list[Point]) -> str:
    """Acceptable (within ±30% or overloaded in both) of the points, fleet and one engine."""
    parts = []
    for label, fleet in (("fleet", True), ("one engine", False)):
        scored = [p for p in points if p.cell.startswith("fleet") == fleet]
        good = sum(1 for p in scored if not judge(p).startswith("MISS"))
        parts.append(f"{label} {good} of {len(scored)}")
    return "acceptable: " + ", ".join(parts)


def report(points: list[Point]) -> str:
    def f(v: float) -> str:
        return "inf" if math.isinf(v) else f"{v:.3f}"

    lines = ["| cell | rate /s | TTFT p50 real / sim / ratio | TTFT p95 real / sim / ratio | ITL p50 real / sim / ratio "
             "| e2e p50 real / sim | reuse real / sim | decoding per engine real / sim | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        cols = []
        for key in ("ttft_p50", "ttft_p95", "itl_p50"):
            r, s = p.real[key], p.sim[key]
            ratio = s / r if r and not math.isinf(r) and not math.isinf(s) else math.nan
            cols.append(f"{f(r)} / {f(s)} / {ratio:.2f}")
        verdict = judge(p)
        lines.append(f"| {p.cell} | {p.rate:g} | " + " | ".join(cols)
                     + f" | {f(p.real['e2e_p50'])} / {f(p.sim['e2e_p50'])}"
                     + f" | {p.real.get('reuse', math.nan):.0%} / {p.sim.get('reuse', math.nan):.0%}"
                     + f" | {p.real.get('decoding', math.nan):.1f} / {p.sim.get('decoding', math.nan):.1f} | {verdict} |")
    return "\n".join(lines)


def fit(points: list[tuple[dict[str, Any], str, float, dict[str, float]]], base: perf.Profile,
        encoder: Encoder) -> perf.Profile:
    """Two grid searches: the per-step costs on the one-engine points (sharing plays no part
    there), then the GPU-sharing constant on the fleet points."""
    cache: dict[Any, Any] = {}
    alone = [p for p in points if p[1] == "direct0"]
    fleet = [p for p in points if p[1] == "oracle"]
    best, best_err = base, math.inf
    grid = itertools.product((0.04, 0.05, 0.06), (0.004, 0.006, 0.008), (0.0, 1e-6), (0.22, 0.3))
    for step, seq, ctx, mfu in grid:
        cand = dataclasses.replace(base, step_overhead_s=step, seq_overhead_s=seq, ctx_overhead_s=ctx, mfu=mfu)
        err = error(simulate(alone, cand, encoder, cache))
        print(f"step {step} seq {seq} ctx {ctx} mfu {mfu}: one-engine error {err:.3f}", flush=True)
        if err < best_err:
            best, best_err = cand, err
    best_err = math.inf
    for excl in (0.0, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0):
        cand = dataclasses.replace(best, gpu_exclusive_host=excl)
        err = error(simulate(fleet, cand, encoder, cache))
        print(f"exclusive {excl}: fleet error {err:.3f}", flush=True)
        if err < best_err:
            shared, best_err = cand, err
    return shared


SWEEP_GRID: dict[str, tuple[float, ...]] = {
    "seq_gpu_share": (0.6, 0.8, 1.0), "seq_overhead_s": (0.003, 0.004, 0.005), "gpu_exclusive_host": (0.0, 0.07),
    "step_overhead_s": (0.04, 0.05), "mfu": (0.22, 0.3)}


def sweep(points: list[tuple[dict[str, Any], str, float, dict[str, float]]], base: perf.Profile,
          encoder: Encoder, grid: dict[str, tuple[float, ...]] | None = None) -> None:
    """Print the fleet error (the oracle phases given) and the one-engine error (the ``direct0``
    phases given; run 1's when none is) over a grid of the constants that shape a loaded fleet,
    best total first."""
    cache: dict[Any, Any] = {}
    fleet = [p for p in points if p[1] == "oracle"]
    alone = [p for p in points if p[1] == "direct0"] or [p for p in real_points(RESULTS) if p[1] == "direct0"]
    rows = []
    grid = grid or SWEEP_GRID
    for values in itertools.product(*grid.values()):
        fields: dict[str, Any] = dict(zip(grid, values, strict=True))  # Profile fields of several types
        cand = dataclasses.replace(base, **fields)
        f, a = error(simulate(fleet, cand, encoder, cache)), error(simulate(alone, cand, encoder, cache))
        label = " ".join(f"{k}={v}" for k, v in fields.items())
        print(f"fleet {f:.3f} one-engine {a:.3f}: {label}", flush=True)
        rows.append((f + a, f, a, label))
    print("best first:")
    for _, fleet_err, alone_err, label in sorted(rows)[:10]:
        print(f"fleet {fleet_err:.3f} one-engine {alone_err:.3f}: {label}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, nargs="+", default=[RESULTS])
    p.add_argument("--profile", default=perf.GPU_FLEET_PROFILE,
                   help="the simulated engines (figures dated before 2026-12-04: h200-transformers-7b-slices; before 2026-12-03 night: h200-transformers-7b)")
    p.add_argument("--fit", action="store_true")
    p.add_argument("--sweep", action="store_true", help="grid of the loaded-fleet constants, best first")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a profile field")
    p.add_argument("--grid", action="append", default=[], metavar="FIELD=V1,V2",
                   help="with --sweep: the values of one field to sweep (replaces the default grid)")
    a = p.parse_args()
    encoder = Encoder(str(TOKENIZER))
    profile = perf.overridden(perf.PROFILES[a.profile], a.set)
    points = [pt for results in on_profile_gpu(a.results, profile.gpu.name) for pt in real_points(results)]
    if a.sweep:
        grid = {k: tuple(float(v) for v in vs.split(",")) for k, vs in (g.split("=", 1) for g in a.grid)}
        sweep(points, profile, encoder, grid or None)
        return
    if a.fit:
        profile = fit(points, profile, encoder)
        print("best:", profile)
    sims = simulate(points, profile, encoder, {})
    print(f"profile {profile.name}; real: {' '.join(map(str, a.results))}; error {error(sims):.3f}")
    print(report(sims))
    print(tally(sims))


if __name__ == "__main__":
    main()
