"""One routed GPU phase as its engines saw it, replayed on the simulator where each request went.

A routed phase's placement is in its ``engines.jsonl`` (each engine's requests with their arrival,
prompt and cached tokens, first token and end, on the engine's monotonic clock, the client's clock
too); matched to the client's ``requests.jsonl`` by prompt length and send time, every request gets
back its prompt text (same seed, same text generator, same tokenizer) and is replayed on the
simulated engine it really reached, at the time it reached it. What differs between the two sides
is then the engine model alone, not the router's choices nor the proxy's holds. TTFT here is the
engine's (arrival at the engine to first token), on both sides. ``judge`` says whether a round's
replay is within ±30%; ``fidelity_placed.py`` prints the tables.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtests.fidelity import TOLERANCE, replay
from loadtests.gpu.fleet import Shape, phase_texts, text_key, trace
from loadtests.gpu.fleet_report import argv_value, pct
from loadtests.jsonl import exists, first_line, read_jsonl, read_text
from proxy.sim import perf
from proxy.sim.config import SimConfig
from proxy.sim.protocol import chat_prompt_ids
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder

# An engine request belongs to the client request sent at most this long before it (the proxy's
# admission, holds and routing come between).
MATCH_WINDOW_S = 30.0

# Each GPU engine's KV pool in tokens unless its log says (run_fleet.sh's KV default).
POOL_TOKENS = 48_000


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
    # each engine's KV pool in tokens, as its log gives it (run_fleet.sh KV=; 48,000 unless set)
    pool_tokens: int = POOL_TOKENS
    # a cell's warm-up (``warmup_phases``): its length in seconds, else None for a judged round
    warmup_s: float | None = None

    def arrivals(self, shape: Shape) -> list[tuple[float, int]]:
        """The trace the client sent: a judged round's at its rate and seed, a warm-up's (fleet.py)
        at the cell's first rate for its own length with the next seed."""
        seed = int(self.cell["seed"])
        if self.warmup_s is not None:
            return trace(self.rate, self.warmup_s, shape, seed + 1)
        return trace(self.rate, float(argv_value(self.cell["argv"], "--phase-s", "30")), shape, seed)

    def text_seed(self) -> int | str:
        """What seeded the prompts' text (``fleet.text_key``; a warm-up's is its phase number)."""
        if self.warmup_s is not None:
            return self.phase
        return text_key(self.cell.get("text", "fresh"), int(argv_value(self.cell["argv"], "--phase-base", "0")),
                        self.rate, self.phase)

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
        p = Placed(doc["router"], doc["rate"], doc["phase"], cell, [], [], [], [])
        _place(p, pairs, doc["engines"])
        p.itl = [itl_of.get(i) for i, _, _ in pairs]
        out.append(p)
    return out


def _place(p: Placed, pairs: Sequence[tuple[int, int, dict[str, Any]]], engines: Sequence[dict[str, Any]],
           since_first: bool = False) -> None:
    """Fill ``p`` from its (trace index, engine, engine request) pairs, every time in seconds from
    the first arrival; ``since_first``: the engines' steps and batches before it left out."""
    t0 = min(q["at"] for _, _, q in pairs)
    start = t0 if since_first else -math.inf
    p.index, p.engine = [i for i, _, _ in pairs], [n for _, n, _ in pairs]
    p.at = [q["at"] - t0 for _, _, q in pairs]
    p.engine_rows = [(q["prompt"], q["cached"], None if q.get("first") is None else q["first"] - t0,
                      None if q.get("done") is None else q["done"] - t0) for _, _, q in pairs]
    p.steps = [[(t - t0, int(n)) for t, n in e.get("steps") or [] if t >= start] for e in engines]
    p.batches = [[[b[0] - t0, None if b[1] is None else b[1] - t0, *b[2:]] for b in e.get("batches") or []
                  if b[0] >= start] for e in engines]
    p.pool_tokens = pool_of(engines)


def warmup_phases(results: Path, encoder: Encoder) -> list[Placed]:
    """Each cell's warm-up (``warmup.jsonl``, fleet.py's ``--warmup-s``) as a placed phase: its
    trace rebuilt as fleet.py drew it, each engine request matched in arrival order to the
    earliest unmatched request of its prompt length (the warm-up keeps no client log). The
    machine's speed read from it (``fidelity_steps.calibrate_host(warmup=True)``) comes before any
    judged round, so every round is held out. Empty where the run has no warm-up log."""
    if not all(exists(results / f) for f in ("warmup.jsonl", "summary.jsonl")):
        return []
    cells = read_jsonl(results / "summary.jsonl")
    out = []
    for line in read_text(results / "warmup.jsonl").splitlines():
        doc = json.loads(line)
        cell = next((c for c in cells if int(argv_value(c["argv"], "--phase-base", "0")) == doc["phase"]
                     and c["prompts"] == doc["prompts"] and c["reports"] == doc["reports"]), None)
        warmup_s = None if cell is None else float(argv_value(cell["argv"], "--warmup-s", "0"))
        if cell is None or not warmup_s:
            continue
        p = Placed(doc["router"], doc["rate"], doc["phase"], cell, [], [], [], [], warmup_s=warmup_s)
        shape = Shape(**cell["shape"])
        arrivals = p.arrivals(shape)
        lengths: dict[int, list[int]] = {}
        for i, ids in enumerate(_tokenized(phase_key(p, shape), arrivals, shape, cell["prompts"], encoder)):
            lengths.setdefault(len(ids), []).append(i)
        reqs = sorted(((q["at"], n, q) for n, e in enumerate(doc["engines"]) for q in e.get("requests") or []),
                      key=lambda x: x[0])
        pairs = [(lengths[int(q["prompt"])].pop(0), n, q) for _, n, q in reqs if lengths.get(int(q["prompt"]))]
        if not pairs:
            continue
        # from the first arrival on: a fresh engine's readiness probe ran its cold first forward before
        _place(p, pairs, doc["engines"], since_first=True)
        out.append(p)
    return out


# The phases tokenized last, shared by every caller in the process: a 3,000-token prompt takes the
# BPE 4 ms, a phase's 200 most of a second, as long as replaying it; the calibrations and the tests
# replay the same phases many times over, each with a cache of its own. ~20 MB a phase.
_TOKENIZED: OrderedDict[Any, list[list[int]]] = OrderedDict()
TOKENIZED_PHASES = 12


def phase_key(p: Placed, shape: Shape) -> tuple[Any, ...]:
    """What a phase's prompts follow from: the same key, the same token ids."""
    return (p.text_seed(), p.rate, shape, p.warmup_s, p.cell["seed"])


def _tokenized(key: Any, arrivals: list[tuple[float, int]], shape: Shape, prompts: str,
               encoder: Encoder) -> list[list[int]]:
    full = (encoder.path, prompts, key)
    if full in _TOKENIZED:
        _TOKENIZED.move_to_end(full)
        return _TOKENIZED[full]
    ids = _TOKENIZED[full] = _prompt_ids(arrivals, shape, key[0], prompts, encoder)
    while len(_TOKENIZED) > TOKENIZED_PHASES:
        _TOKENIZED.popitem(last=False)
    return ids


def _prompt_ids(arrivals: list[tuple[float, int]], shape: Shape, seed: int | str, prompts: str,
                encoder: Encoder) -> list[list[int]]:
    """Each arrival's prompt as the engine tokenized it (chat through the tokenizer's template)."""
    texts = phase_texts(arrivals, shape, seed)
    if prompts == "chat":
        return [chat_prompt_ids([{"role": "system", "content": s}, {"role": "user", "content": q}],
                                encoder.encode, encoder.encode_chat) for s, q in texts]
    return [encoder.encode(s + "\n\n" + q) for s, q in texts]


def pool_of(engines: Sequence[dict[str, Any]]) -> int:
    """The engines' KV pool in tokens from their logs (blocks x block size; run 121's engines had
    24,000, where a replay on the usual 48,000 evicted nothing and read its TTFT p95 at 0.15-0.5x
    the GPU's); ``POOL_TOKENS`` for a log without it."""
    e = engines[0] if engines else {}
    return int(e["blocks"]) * int(e["block_size"]) if e.get("blocks") and e.get("block_size") else POOL_TOKENS


def run_pool(results: Path) -> int:
    """A run's engines' KV pool in tokens (``pool_of`` its first logged phase)."""
    if not exists(results / "engines.jsonl"):
        return POOL_TOKENS
    first = first_line(results / "engines.jsonl")
    return pool_of(json.loads(first)["engines"]) if first else POOL_TOKENS


def engine_count(cell: dict[str, Any]) -> int:
    """The GPU engines behind a cell's workers: more than the workers where each is DP ranks."""
    return int(cell.get("dp_engines", cell["workers"]))


def simulate(p: Placed, profile: perf.Profile, encoder: Encoder, cache: dict[Any, list[list[int]]],
             into: list[tuple[int, SimRequest]] | None = None,
             steps_into: list[tuple[int, float, int]] | None = None,
             batches_into: list[tuple[int, list[Any]]] | None = None) -> dict[str, float]:
    cell, argv = p.cell, p.cell["argv"]
    shape = Shape(**cell["shape"])
    arrivals = p.arrivals(shape)
    key = phase_key(p, shape)
    if key not in cache:
        cache[key] = _tokenized(key, arrivals, shape, cell["prompts"], encoder)
    order = sorted(range(len(p.at)), key=lambda k: p.at[k])
    config = SimConfig(profile=profile.name, max_total_tokens=p.pool_tokens, page_size=32, max_running_requests=64)
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


def mean_of(values: Sequence[float]) -> float:
    """The mean, nan for none."""
    return sum(values) / len(values) if values else math.nan
