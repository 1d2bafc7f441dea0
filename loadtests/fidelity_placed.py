"""The simulator against a real engine on routed phases: each request replayed where it really went.

    .venv/bin/python -m loadtests.fidelity_placed --results loadtests/results/gpu-fleet-replicas-2 [--set F=V]
    .venv/bin/python -m loadtests.fidelity_placed --engines --phase 2805 --results loadtests/results/gpu-fleet-default-2
    .venv/bin/python -m loadtests.fidelity_placed --grid seq_overhead_s=0.001,0.002 --grid gpu_exclusive_host=0.15,0.27 --results DIR...

``loadtests/fidelity.py`` replays the phases whose placement the trace alone fixes (the oracle, one
engine alone). A routed phase's placement is in its ``engines.jsonl`` (each engine's requests with
their arrival, prompt and cached tokens, first token and end, on the engine's monotonic clock, the
client's clock too); matched to the client's ``requests.jsonl`` by prompt length and send time,
every request gets back its prompt text (same seed, same text generator, same tokenizer) and is
replayed on the simulated engine it really reached, at the time it reached it. What differs between
the two columns is then the engine model alone, not the router's choices nor the proxy's holds.
TTFT here is the engine's (arrival at the engine to first token), on both sides.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import itertools
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from loadtests import fleet_windows
from loadtests.fidelity import OVERLOAD_S, TOLERANCE, replay
from loadtests.fit_steps import lone_overhead
from loadtests.gpu.fleet import TOKENIZER, Shape, phase_texts, text_key, trace
from loadtests.gpu.fleet_report import argv_value, gpu_model, on_profile_gpu, pct, run_gpu
from loadtests.jsonl import exists, read_jsonl, read_text
from proxy.diagnose.shadow_ttft import least_squares
from proxy.sim import perf
from proxy.sim.config import SimConfig
from proxy.sim.protocol import chat_prompt_ids
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder

# An engine request belongs to the client request sent at most this long before it (the proxy's
# admission, holds and routing come between).
MATCH_WINDOW_S = 30.0


@dataclasses.dataclass
class Placed:
    """One routed phase as the engines saw it: per request, its arrival index in the trace, the
    engine it reached, when (seconds from the phase's first engine arrival), and the engine's own
    account of it; its TTFT (inf: no first token) and the phase's reuse follow from those."""

    router: str
    rate: float
    phase: int
    cell: dict[str, Any]
    index: list[int]
    engine: list[int]
    at: list[float]
    # per request, as the engine saw it: (prompt tokens, cached tokens, first token, done), s from t0
    engine_rows: list[tuple[int, int, float | None, float | None]]
    # per engine, its steps that gave a token: (end, tokens), s from t0 (runs since gpu-fleet-steps-1)
    steps: list[list[tuple[float, int]]] = dataclasses.field(default_factory=list)
    # per engine, its scheduler's batches (loadtests/gpu/batch_log.FIELDS), times s from t0 (runs since 2026-12-03)
    batches: list[list[list[Any]]] = dataclasses.field(default_factory=list)
    # per request, the client's median gap between tokens (s; None where it saw fewer than two)
    itl: list[float | None] = dataclasses.field(default_factory=list)

    @property
    def ttft(self) -> list[float]:
        return [math.inf if first is None else first - at for at, (_, _, first, _) in zip(self.at, self.engine_rows, strict=True)]

    @property
    def itl_p50(self) -> float:
        """The median over requests of the client's median gap between tokens (nan: none saw two)."""
        gaps = [x for x in self.itl if x is not None]
        return pct(gaps, 0.5) if gaps else math.nan

    @property
    def reuse(self) -> float:
        prompt = sum(r[0] for r in self.engine_rows)
        return sum(r[1] for r in self.engine_rows) / prompt if prompt else 0.0


def match(client: Sequence[dict[str, Any]], engines: Sequence[dict[str, Any]]) -> list[tuple[int, int, dict[str, Any]]]:
    """(client record's arrival index, engine number, engine request) for each engine request that
    a client request of the same prompt length sent before it accounts for: the nearest unmatched
    one in time. Engine requests nobody sent (a router's readiness probe) are left out."""
    by_len: dict[int, list[tuple[float, int]]] = {}
    for r in client:
        if r.get("sent") is not None and r.get("prompt_tokens"):
            by_len.setdefault(int(r["prompt_tokens"]), []).append((float(r["sent"]), int(r["i"])))
    for rows in by_len.values():
        rows.sort()
    taken: set[int] = set()
    out = []
    arrivals = sorted(((q["at"], n, q) for n, e in enumerate(engines) for q in e.get("requests", [])),
                      key=lambda x: x[0])
    for at, n, q in arrivals:
        rows = by_len.get(int(q["prompt"]), [])
        k = bisect.bisect_right(rows, (at, math.inf)) - 1
        while k >= 0 and (rows[k][1] in taken):
            k -= 1
        if k >= 0 and at - rows[k][0] <= MATCH_WINDOW_S:
            taken.add(rows[k][1])
            out.append((rows[k][1], n, q))
    return out


def _in_cell(cell: dict[str, Any], doc: dict[str, Any]) -> bool:
    """Whether the engines' phase ``doc`` ran in this cell of the summary (its phase numbers follow
    the cell's ``--phase-base``, one per router, rate and round)."""
    base = int(argv_value(cell["argv"], "--phase-base", "0"))
    phases = len(cell["routers"]) * len(cell["rates"]) * int(cell.get("repeat", 1))
    return (cell["prompts"] == doc["prompts"] and cell["reports"] == doc["reports"]
            and doc["router"] in cell["routers"] and doc["rate"] in cell["rates"]
            and base < doc["phase"] <= base + phases)


def placed_phases(results: Path) -> list[Placed]:
    if not all(exists(results / f) for f in ("requests.jsonl", "summary.jsonl", "engines.jsonl")):
        return []  # a run that came back without its summary or engine traces
    recs = read_jsonl(results / "requests.jsonl")
    cells = read_jsonl(results / "summary.jsonl")
    out = []
    for line in read_text(results / "engines.jsonl").splitlines():
        doc = json.loads(line)
        cell = next((c for c in cells if _in_cell(c, doc)), None)
        if cell is None:
            continue
        client = [r for r in recs if r["phase"] == doc["phase"] and r["router"] == doc["router"]]
        itl_of = {int(r["i"]): r.get("itl") for r in client}
        pairs = match(client, doc["engines"])
        if not pairs:
            continue
        t0 = min(q["at"] for _, _, q in pairs)
        out.append(Placed(
            doc["router"], doc["rate"], doc["phase"], cell, [i for i, _, _ in pairs], [n for _, n, _ in pairs],
            [q["at"] - t0 for _, _, q in pairs],
            [(q["prompt"], q["cached"], None if q.get("first") is None else q["first"] - t0,
              None if q.get("done") is None else q["done"] - t0) for _, _, q in pairs],
            [[(t - t0, int(n)) for t, n in e.get("steps") or []] for e in doc["engines"]],
            [[[b[0] - t0, None if b[1] is None else b[1] - t0, *b[2:]] for b in e.get("batches") or []]
             for e in doc["engines"]],
            [itl_of.get(i) for i, _, _ in pairs]))
    return out


def engine_count(cell: dict[str, Any]) -> int:
    """The GPU engines behind a cell's workers: more than the workers where each is DP ranks."""
    return int(cell.get("dp_engines", cell["workers"]))


def simulate(p: Placed, profile: perf.Profile, encoder: Encoder, cache: dict[Any, list[list[int]]],
             into: list[tuple[int, SimRequest]] | None = None,
             steps_into: list[tuple[int, float, int]] | None = None,
             batches_into: list[tuple[int, list[Any]]] | None = None) -> dict[str, float]:
    cell, argv = p.cell, p.cell["argv"]
    shape = Shape(**cell["shape"])
    arrivals = trace(p.rate, float(argv_value(argv, "--phase-s", "30")), shape, cell["seed"])
    key = (text_key(cell.get("text", "fresh"), int(argv_value(argv, "--phase-base", "0")), p.rate, p.phase),
           p.rate, shape, cell["seed"])
    if key not in cache:
        texts = phase_texts(arrivals, shape, key[0])
        # chat: the prompt the engine tokenized, through the tokenizer's chat template as it does
        cache[key] = ([chat_prompt_ids([{"role": "system", "content": s}, {"role": "user", "content": q}],
                                       encoder.encode, encoder.encode_chat) for s, q in texts]
                      if cell["prompts"] == "chat" else [encoder.encode(s + "\n\n" + q) for s, q in texts])
    order = sorted(range(len(p.at)), key=lambda k: p.at[k])
    config = SimConfig(profile=profile.name, max_total_tokens=48_000, page_size=32, max_running_requests=64)
    return replay([cache[key][p.index[k]] for k in order], [p.at[k] for k in order], [p.engine[k] for k in order],
                  engine_count(cell), shape.output_tokens, profile, config,
                  float(argv_value(argv, "--drain-s", "20")), into=into, steps_into=steps_into,
                  batches_into=batches_into)


# Bands of the GPU's TTFT p95 (s) by which ``tail_bands`` splits the rounds.
TAIL_BANDS = (1.5, 3.0)


def tail_bands(pairs: Sequence[tuple[float, float]]) -> str:
    """Where the misses lie: per band of the real TTFT p95, the rounds in it and the geometric mean
    of sim / real; and the slope of log(sim p95) on log(real p95) over every round. A slope under 1
    is a simulator whose tails are narrower than the engine's: light rounds read slow, heavy ones
    fast, whatever one constant moves (each shifts every band alike)."""
    logs = [(math.log(r), math.log(s)) for r, s in pairs if r > 0 and s > 0 and math.isfinite(r) and math.isfinite(s)]
    if len(logs) < 2:
        return "tail: too few rounds"
    edges = (0.0, *TAIL_BANDS, math.inf)
    parts = []
    for lo, hi in itertools.pairwise(edges):
        d = [y - x for x, y in logs if lo <= math.exp(x) < hi]
        if d:
            parts.append(f"{lo:g}-{hi:g} s: {len(d)} rounds, sim / real {math.exp(sum(d) / len(d)):.2f}")
    mx = sum(x for x, _ in logs) / len(logs)
    my = sum(y for _, y in logs) / len(logs)
    sxx = sum((x - mx) ** 2 for x, _ in logs)
    slope = sum((x - mx) * (y - my) for x, y in logs) / sxx if sxx > 0 else math.nan
    return "tail, by the GPU's TTFT p95: " + "; ".join(parts) + f"; log-log slope {slope:.2f}"


def alone(p: Placed) -> bool:
    """A round of one engine alone: judged by its machine's host (``fit_steps``), not the fleet's."""
    return p.router.startswith("direct")


# How far (as a share of the GPU's requests) a simulated percentile may fall from its own and still
# be called near: a miss in ratio that is near in rank is the steep middle of a knee's TTFTs.
RANK_SLACK = 0.10


def rank(values: Sequence[float], x: float) -> float:
    """The share of ``values`` below ``x``: where a simulated percentile falls among the GPU's
    requests. At the knee a round's TTFT rises steeply through its middle (0.6 to 1.5 s between
    its 40th and 60th percentiles), so a p50 1.5x off can be the GPU's 57th percentile."""
    ordered = sorted(values)
    return bisect.bisect_left(ordered, x) / len(ordered) if ordered else math.nan


def judge(p: Placed, sim: dict[str, float], logs: list[float],
          near: list[bool] | None = None) -> tuple[bool, list[str]]:
    """Whether the round's TTFT p50 and p95 are both within ±30%, and the table's columns (real /
    sim / ratio, and in brackets the GPU's percentile the simulated value falls at); each finite
    |log(sim / real)| is appended to ``logs``, and to ``near`` whether both simulated values fall
    within ``RANK_SLACK`` of their own percentile among the GPU's requests."""
    ok, close, cols = True, True, []
    for q, key in ((0.5, "ttft_p50"), (0.95, "ttft_p95")):
        r, s = pct(p.ttft, q), sim[key]
        ratio = s / r if r > 0 and math.isfinite(r) and math.isfinite(s) else math.nan
        at = rank(p.ttft, s)
        close &= abs(at - q) <= RANK_SLACK
        cols.append(f"{r:.3f} / {s:.3f} / {ratio:.2f} (q{100 * at:.0f})")
        ok &= abs(ratio - 1) <= TOLERANCE
        if math.isfinite(ratio) and ratio > 0:
            logs.append(abs(math.log(ratio)))
    if near is not None:
        near.append(close)
    return ok, cols


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
        within, logs, tails = 0, [], []
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
                    f"| {_mean(real_decode):.2f} / {_mean(sim_decode):.2f} "
                    f"| {sum(r[1] for r in real_rows) / prompt:.0%} / {sum(r.cached_tokens for r in sims) / sim_prompt:.0%} |")
    return "\n".join(lines)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


# Rounds whose requests reached the same engines this often count as one placement repeated.
SAME_PLACEMENT = 0.9

def round_pair(a: Placed, b: Placed) -> tuple[float, tuple[float, float]]:
    """The share of the requests of both rounds (by arrival index) that reached the same engine in
    each, and ``b``'s engine TTFT p50 and p95 over ``a``'s."""
    where = dict(zip(a.index, a.engine, strict=True))
    common = [(i, e) for i, e in zip(b.index, b.engine, strict=True) if i in where]
    same = sum(where[i] == e for i, e in common) / len(common) if common else 0.0

    def ratio(q: float) -> float:
        first, second = pct(a.ttft, q), pct(b.ttft, q)
        return second / first if first > 0 else math.nan

    return same, (ratio(0.5), ratio(0.95))


def trace_identity(path: Path, p: Placed) -> str:
    """What a round of ``p``'s router replays: its arrivals (seed, rate, shape, phase length), its
    prompts and reports, its engines and its text. With one text per rate (``--text same``) the same
    identity recurs in other runs of the same cell, so their rounds pair across result directories
    (warm engines called again on one trace); with fresh text, only within one run's cell."""
    cell, argv = p.cell, p.cell["argv"]
    text = cell.get("text", "fresh")
    where = (text_key(text, int(argv_value(argv, "--phase-base", "0")), p.rate, p.phase) if text == "same"
             else [str(path), argv])
    return json.dumps([p.router, p.rate, cell["seed"], cell["prompts"], cell["reports"], cell["shape"],
                       argv_value(argv, "--phase-s", "30"), engine_count(cell), where], sort_keys=True)


def rounds_by_trace(results: Sequence[Path]) -> dict[str, list[tuple[Path, Placed]]]:
    """Every placed round of the runs, (run, round), by the trace and text it ran (``trace_identity``)."""
    rounds: dict[str, list[tuple[Path, Placed]]] = {}
    for path in results:
        for ph in placed_phases(path):
            rounds.setdefault(trace_identity(path, ph), []).append((path, ph))
    return rounds


@dataclasses.dataclass(frozen=True)
class RoundPair:
    """Two rounds of one router on one trace and text: where they ran, the share of requests that
    reached the same engine in both, and the second's engine TTFT p50 and p95 over the first's."""

    runs: tuple[str, str]
    router: str
    rate: float
    phases: tuple[int, int]
    same: float
    p50: float
    p95: float

    @property
    def kept(self) -> bool:
        """One placement: (nearly) every request on the same engine in both rounds."""
        return self.same >= SAME_PLACEMENT

    @property
    def within(self) -> bool:
        return abs(self.p50 - 1) <= TOLERANCE and abs(self.p95 - 1) <= TOLERANCE


def round_pairs(results: Sequence[Path]) -> list[RoundPair]:
    """The real engine against itself: every pair of rounds of one router on one trace and text
    (``--repeat`` in one cell, or the same cell called again in other runs: ``trace_identity``).
    Pairs that kept one placement say how close the GPU repeats itself: the bar a simulator of it
    can be held to, phase by phase; pairs placed anew, how far a round moves when its router decides
    again. A pair whose percentile falls on an unanswered request (an infinite ratio) is left out."""
    pairs = []
    for phases in rounds_by_trace(results).values():
        for (pa, a), (pb, b) in itertools.combinations(phases, 2):
            same, (p50, p95) = round_pair(a, b)
            if all(math.isfinite(r) and r > 0 for r in (p50, p95)):
                pairs.append(RoundPair((pa.name, pb.name), a.router, a.rate, (a.phase, b.phase), same, p50, p95))
    return pairs


def repeatability(results: Sequence[Path]) -> str:
    """``round_pairs`` as a summary per kind of pair (kept placement, placed anew) and a table."""
    pairs = round_pairs(results)
    summary = []
    for name, group in ((f"one placement (>= {SAME_PLACEMENT:.0%} of requests on the same engine)",
                         [p for p in pairs if p.kept]), ("placed anew", [p for p in pairs if not p.kept])):
        if group:
            p50 = sum(abs(p.p50 - 1) <= TOLERANCE for p in group)
            mean = sum(abs(math.log(p.p50)) + abs(math.log(p.p95)) for p in group) / (2 * len(group))
            summary.append(f"{name}: {len(group)} pairs of rounds, {sum(p.within for p in group)} with both "
                           f"ratios within ±30% (p50 alone {p50}), mean |log(ratio)| {mean:.3f}")
    lines = ["| runs | router | rate /s | phases | same engine | p50 ratio | p95 ratio | both within ±30% |",
             "|---|---|---|---|---|---|---|---|"]
    for p in pairs:
        runs = p.runs[0] if p.runs[0] == p.runs[1] else ", ".join(p.runs)
        lines.append(f"| {runs} | {p.router} | {p.rate:g} | {p.phases[0]}, {p.phases[1]} | {p.same:.0%} | "
                     f"{p.p50:.2f} | {p.p95:.2f} | {'yes' if p.within else 'no'} |")
    return "\n".join(summary + lines)


@dataclasses.dataclass(frozen=True)
class GroupSplit:
    """How a routed round of shared prefixes placed its groups: the share of groups whose every
    request reached one engine, the mean number of engines a group reached, and the group's
    prefix prefilled again (a request with under half its prompt cached after the group's first)."""

    run: str
    phase: int
    router: str
    rate: float
    groups: int
    whole: float
    engines_per_group: float
    prefills_again: int


def group_splits(results: Sequence[Path]) -> list[GroupSplit]:
    """``GroupSplit`` of every shared-prefix round (the client's log names each request's group).
    Replicas that cannot see each other's decisions split a group when its followers reach them
    before any engine has stored its prefix; one proxy keeps it whole (docs/kv-events.md)."""
    out = []
    for path in results:
        group_of = {(r["phase"], r["router"], int(r["i"])): r.get("group") for r in read_jsonl(path / "requests.jsonl")}
        for p in placed_phases(path):
            if p.cell["shape"].get("workload", "shared") != "shared":
                continue
            engines: dict[Any, set[int]] = {}
            prefills: dict[Any, int] = {}
            for k in sorted(range(len(p.at)), key=lambda k: p.at[k]):
                g = group_of.get((p.phase, p.router, p.index[k]))
                engines.setdefault(g, set()).add(p.engine[k])
                prompt, cached = p.engine_rows[k][0], p.engine_rows[k][1]
                prefills[g] = prefills.get(g, 0) + (cached < 0.5 * prompt)
            n = len(engines)
            if n:
                out.append(GroupSplit(path.name, p.phase, p.router, p.rate, n,
                                      sum(len(e) == 1 for e in engines.values()) / n,
                                      sum(len(e) for e in engines.values()) / n,
                                      sum(max(0, c - 1) for c in prefills.values())))
    return out


def groups_report(results: Sequence[Path]) -> str:
    lines = ["| run | phase | router | rate /s | groups | whole | engines a group | prefix prefilled again |",
             "|---|---|---|---|---|---|---|---|"]
    for g in group_splits(results):
        lines.append(f"| {g.run} | {g.phase} | {g.router} | {g.rate:g} | {g.groups} | {g.whole:.0%} | "
                     f"{g.engines_per_group:.2f} | {g.prefills_again} |")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class TraceRounds:
    """One router's rounds of one trace (``trace_identity``): the GPU's engine TTFT p50 and p95 per
    round, and the replays' (each round on its own placement)."""

    runs: tuple[str, ...]
    router: str
    rate: float
    kept: bool  # one placement in every round
    real: tuple[tuple[float, float], ...]
    sim: tuple[tuple[float, float], ...]

    @property
    def median(self) -> tuple[float, float]:
        return statistics.median([r[0] for r in self.real]), statistics.median([r[1] for r in self.real])

    @property
    def sim_median(self) -> tuple[float, float]:
        return statistics.median([r[0] for r in self.sim]), statistics.median([r[1] for r in self.sim])

    @property
    def gpu_self(self) -> int:
        """The GPU's rounds within ±30% of their own median (p50 and p95)."""
        return sum(_near(r, self.median) for r in self.real)

    @property
    def sim_each(self) -> int:
        """The rounds the replays' median is within ±30% of."""
        return sum(_near(self.sim_median, r) for r in self.real)

    @property
    def sim_ok(self) -> bool:
        return _near(self.sim_median, self.median)


def _near(x: tuple[float, float], to: tuple[float, float]) -> bool:
    return all(abs(a / b - 1) <= TOLERANCE for a, b in zip(x, to, strict=True))


def trace_rounds(results: Sequence[Path], profile: perf.Profile,
                 profile_of: Callable[[Path, Placed], perf.Profile] | None = None) -> list[TraceRounds]:
    """Every trace a router ran two rounds or more, each round replayed on its placement (with
    ``profile_of(run, round)`` where given). A trace with a round whose p50 or p95 falls on an
    unanswered request is left out whole."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    out = []
    for group in rounds_by_trace(results).values():
        real = tuple((pct(ph.ttft, 0.5), pct(ph.ttft, 0.95)) for _, ph in group)
        if len(group) < 2 or not all(math.isfinite(v) and v > 0 for r in real for v in r):
            continue
        first = group[0][1]
        sims = [simulate(ph, profile if profile_of is None else profile_of(path, ph), encoder, cache)
                for path, ph in group]
        out.append(TraceRounds(tuple(sorted({path.name for path, _ in group})), first.router, first.rate,
                               all(round_pair(first, ph)[0] >= SAME_PLACEMENT for _, ph in group[1:]), real,
                               tuple((s["ttft_p50"], s["ttft_p95"]) for s in sims)))
    return out


def against_rounds(results: Sequence[Path], profile: perf.Profile,
                   profile_of: Callable[[Path, Placed], perf.Profile] | None = None) -> str:
    """The simulator held to the bar the GPU sets itself (``trace_rounds``): the rounds' engine TTFT
    p50 and p95 against their median, and the replays' median against the same. A simulator that
    always said the GPU's median could be within ±30% of a round only as often as the GPU's rounds
    are of their own median: on a knee, where one placement's p50 moves 1.6x between rounds (run
    102), that count, not every round, is what a replay can reach. (Of two rounds the median is
    their mean, so both are within ±30% of it unless they differ 1.86x.)"""
    traces = trace_rounds(results, profile, profile_of)
    lines = ["| runs | router | rate /s | rounds | one placement | GPU TTFT p50 min / median / max | sim, / median "
             "| GPU p95 min / median / max | sim, / median | GPU rounds within ±30% of their median "
             "| sim within ±30% of the median | of each round |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in traces:
        cols = []
        for k in (0, 1):
            vals = sorted(r[k] for r in t.real)
            cols.append(f"{vals[0]:.3f} / {t.median[k]:.3f} / {vals[-1]:.3f} | {t.sim_median[k]:.3f}, "
                        f"{t.sim_median[k] / t.median[k]:.2f}")
        n = len(t.real)
        lines.append(f"| {', '.join(t.runs)} | {t.router} | {t.rate:g} | {n} | {'yes' if t.kept else 'no'} | "
                     + " | ".join(cols) + f" | {t.gpu_self} of {n} | {'yes' if t.sim_ok else 'no'} | {t.sim_each} of {n} |")
    rounds = sum(len(t.real) for t in traces)
    summary = (f"profile {profile.name}: {len(traces)} traces run two rounds or more ({rounds} rounds); the "
               f"simulator's median within ±30% of the GPU's median (TTFT p50 and p95) on "
               f"{sum(t.sim_ok for t in traces)} of {len(traces)}; the GPU's rounds within ±30% of their own "
               f"median {sum(t.gpu_self for t in traces)} of {rounds}, the simulator's median within ±30% of "
               f"each round {sum(t.sim_each for t in traces)} of {rounds}")
    return "\n".join([summary, *lines])


Row = tuple[int, float, float | None, float | None, int, int]  # engine, at, first, done, prompt, cached


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
        lines.append(f"{name}: {len(y)} requests, mean {1000 * _mean(y):.0f}; c0 {1000 * c[0]:.0f}, decoding "
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
                   router: str | None = None) -> float | None:
    """The step's fixed host cost (``step_overhead_s``) that makes the replayed engines' median step
    beside ``busy`` busy neighbours what this run's engines clocked (their shim's step log): the
    simulator calibrated to the machine of the day from its step clock, never from the TTFTs it is
    then judged on. One H100 stepped 16% slower than another on the same engines (runs 90 and 91),
    which past the knee is a 1.5-2x longer tail. ``router``: fitted on that router's phases only, so
    the others' are judged on a machine fitted without them. None where the run logged no steps."""
    encoder = Encoder(str(TOKENIZER))
    cache: dict[Any, list[list[int]]] = {}
    phases = [p for p in placed_phases(results) if any(p.steps) and not alone(p) and router in (None, p.router)]
    real = [r for p in phases for r in _step_rows(p.steps, _real_rows(p)) if r[3] == busy]
    if len(real) < 10:
        return None
    target = pct([r[0] for r in real], 0.5)

    def median_step(overhead: float) -> float:
        cand = dataclasses.replace(profile, step_overhead_s=overhead)
        rows = [r for p in phases for r in _sim_step_rows(p, cand, encoder, cache) if r[3] == busy]
        return pct([r[0] for r in rows], 0.5) if rows else math.nan

    lo, hi = 0.0, 4 * profile.step_overhead_s  # the median step grows with the fixed cost
    while hi - lo > tol_s:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if median_step(mid) < target else (lo, mid)
    return round((lo + hi) / 2, 4)


def calibrated_report(results: Sequence[Path], profile: perf.Profile, router: str | None = None,
                      by: str = "steps") -> str:
    """``report`` with each run replayed on its own machine's step cost, on ``router``'s phases
    alone where named: ``by`` "steps" bisects replays to the step clock (``calibrate_host``),
    "batches" fills the busy windows of the engines' batch logs (``fleet_windows.calibrate``),
    "rounds" so each round its own windows (the machine's speed round by round)."""
    if by == "rounds":
        return round_calibrated_report(results, profile)
    out = []
    whose = "its warm-up's" if by == "warmup" else f"the {router} phases'" if router else "its"
    source = ("median step beside 3 busy neighbours" if by == "steps"
              else f"batches filling the GPU to {fleet_windows.target(profile)} where every engine stepped")
    for path in results:
        if by in ("batches", "warmup") and any(alone(p) for p in placed_phases(path)):
            # one engine alone is read from its own steps, the fleet's rounds from its windows
            lone, fleet = (fleet_windows.calibrate(path, profile, router=router, warmup=by == "warmup", lone=k)
                           for k in (True, False))
            out.append(f"{path.name}: step_overhead_s {lone} alone, {fleet} in the fleet (the profile's "
                       f"{profile.step_overhead_s:.4f}), from {whose} steps alone and {source}")
            of = machine_of(profile, by)
            out.append(report([path], profile, lambda p, run=path, of=of: of(run, p)))
            continue
        overhead = (calibrate_host(path, profile, router=router) if by == "steps"
                    else fleet_windows.calibrate(path, profile, router=router, warmup=by == "warmup"))
        if overhead is None:
            out.append(f"{path.name}: no {by} log to calibrate on; {profile.name} as it is")
            out.append(report([path], profile))
            continue
        out.append(f"{path.name}: step_overhead_s {overhead:.4f} (the profile's {profile.step_overhead_s:.4f}), "
                   f"from {whose} {source}")
        out.append(report([path], dataclasses.replace(profile, step_overhead_s=overhead)))
    return "\n".join(out)


def machine_of(profile: perf.Profile, by: str) -> Callable[[Path, Placed], perf.Profile]:
    """Each round's profile (given its run's directory) with its run's (``batches``, ``warmup``) or
    its own (``rounds``) fixed cost from the engines' batch logs, a lone engine's from its lone
    steps; the profile's where there is none."""
    memo: dict[tuple[Path, bool], float | None] = {}

    def of(run: Path, p: Placed) -> perf.Profile:
        if by == "rounds":
            return round_profile(p, profile)
        key = (run, alone(p))
        if key not in memo:
            memo[key] = fleet_windows.calibrate(run, profile, warmup=by == "warmup", lone=alone(p))
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
        fixed = lone_overhead(warm.batches[0], profile)
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


def steps_report(results: Sequence[Path], profile: perf.Profile) -> str:
    lines = ["| other engines busy | side | steps | median ms | c0 ms | ms per request decoding "
             "| ms per 1,000 uncached tokens |", "|---|---|---|---|---|---|---|"]
    for (busy, side), (n, median, c0, dec, tokens) in step_costs(results, profile).items():
        lines.append(f"| {busy} | {side} | {n} | {1000 * median:.0f} | {1000 * c0:.0f} | {1000 * dec:.1f} | "
                     f"{1000 * tokens:.0f} |")
    return f"profile {profile.name}\n" + "\n".join(lines)


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
                        "(the median step beside 3 busy neighbours), not the profile's; ROUTER: fitted on "
                        "that router's phases alone")
    p.add_argument("--calibrate-by", choices=("steps", "batches", "warmup", "rounds"), default="steps",
                   help="with --calibrate: fit the fixed cost to the step clock by replays (steps), to the "
                        "engines' batch logs where every engine stepped (batches, loadtests.fleet_windows), to "
                        "the warm-up's alone (warmup: every round held out), or to each round's own batch log "
                        "(rounds; ROUTER ignored with these two)")
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
