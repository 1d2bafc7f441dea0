"""The fleet benchmark's cells in virtual time: the same traces and prompts, simulated engines.

    .venv/bin/python -m loadtests.gpu.fleet_sim --rates 3,4.5 --seed 2 --routers oracle,ttft,cache_aware

Builds each phase exactly as ``loadtests/gpu/fleet.py`` sends it (same Poisson trace per seed and
rate, same texts, the same BPE tokenizer) and runs it through ``loadtests.routing_sim``: the real
routing code (policies, prefix keys, the learned bytes-per-token estimate) in front of simulated
engines that share one GPU (``gpu_share.gpu_pool``, as the profile shares it) and report only token counts (``--reports
minimal``), as the GPU fleet's engines. Seconds of CPU per cell, exact and repeatable, so policy
variants can be swept (``ttft/work_weight=10``) before a GPU run decides. ``oracle`` = group g on
engine g mod N, as in the GPU benchmark; ``balanced`` the groups spread knowing the requests each
will bring (``fleet.balanced_placement``). Spec keys as ``fleet.py``'s: ``replicas=N``,
``peers=on`` (``decisions``: without the loads), ``kv_events=auto``, ``tokenizer=bench``.
``--cells RESULTS...`` replays a GPU run's cells on their own traces and text and prints the GPU's
TTFT p95 beside the simulator's.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from typing import Any

from loadtests.fidelity import TOLERANCE, _phase_of
from loadtests.fidelity_machine import fleet_overhead
from loadtests.fidelity_replay import POOL_TOKENS, run_pool
from loadtests.gpu.fleet import (
    TOKENIZER,
    Shape,
    balanced_placement,
    phase_texts,
    routing_section,
    spec_kv_events,
    spec_peers,
    spec_replicas,
    spec_value,
    text_key,
    trace,
)
from loadtests.gpu.fleet_report import argv_value, on_profile_gpu, pct, prompt_form
from loadtests.routing_sim import Outcome, VirtualWorker, simulate
from proxy.config_sections import RoutingConfig
from proxy.loadgen.workloads import RequestSpec
from proxy.routing.base import Decision, IgnoresFeedback, Policy, RouteRequest, WorkerSnapshot
from proxy.sim import perf
from proxy.sim.config import SimConfig
from proxy.sim.tokenizer import Encoder

# What-if keys of a spec, simulated only (the proxy has no such admission): its prompt tokens in
# flight per worker kept within ``worker_tokens``, the rest queued at the proxy for the chosen worker,
# and an idle worker taking the oldest request queued for another after ``steal_after_s``
# (``routing_sim.simulate``); ``ttft/worker_tokens=60000/steal_after_s=3``. ``scrape_s``: how often
# the router reads the engines' load reports (0.5 s, radixgate's ``scrape.interval_s``; smg polls
# ``/v1/loads`` every 10 s). ``kv_at_schedule=1``: the engines publish a prompt's KV blocks when they
# schedule it, as vLLM v1 does, not after its prefill as SGLang and the GPU shim do. ``kv_tokens``:
# each engine's KV pool in tokens (``POOL_TOKENS``, ``run_fleet.sh``'s ``KV``), to size it below the groups'
# prefixes and make the engines evict.
SIM_ONLY_KEYS = ("worker_tokens", "steal_after_s", "scrape_s", "kv_at_schedule", "kv_tokens")

# ``--spread``: how far each arrival may move (s), standing for the timing noise of a real fleet
# (send times, and steps that vary about their fit: sd of log 0.22 a step). Chosen on runs 33-65's
# first rounds and checked on runs 66-72's (proxy/sim/README.md, "Its own decisions against the
# GPU's"): with 2 ms the draws were too alike (the GPU's round inside 8 draws in 31 of 69 fitted
# cells, where a new draw would be 78% of the time; odds of one router beating another worse than
# a coin's), 20 ms 40 of 69, 50 ms 48 of 69 and 34 of 43 held out; the draws then spread as the
# GPU's own rounds of one router do (sd of log 0.20 against 0.21).
JITTER_S = 0.05


def sim_only(spec: str) -> tuple[str, dict[str, float]]:
    """``spec`` without its ``SIM_ONLY_KEYS``, and their values."""
    name, *pairs = spec.split("/")
    kept = [pair for pair in pairs if pair.split("=", 1)[0] not in SIM_ONLY_KEYS]
    values = {k: float(v) for k, v in (pair.split("=", 1) for pair in pairs) if k in SIM_ONLY_KEYS}
    return "/".join([name, *kept]), values


# The simulated engines' profile (``--profile``): the GPU fleet's engines with their dense batch
# attention, their GPU shared in time slices (perf.GPU_FLEET_PROFILE). On the engines' own
# decisions replayed it has the marginal costs the GPU has (TTFT per 1,000 uncached tokens, per
# running and per waiting request); proxy/sim/README.md, "Dense attention". Figures dated before
# 2026-12-04 ran h200-transformers-7b-slices.
PROFILE = perf.GPU_FLEET_PROFILE


class Oracle(IgnoresFeedback):
    """Group g -> worker g mod N (``placement``: worker ``placement[g]``), the group known by its
    prompt's first block."""

    name = "oracle"

    def __init__(self, group_of: dict[int, int], placement: dict[int, int] | None = None) -> None:
        self.group_of, self.placement = group_of, placement

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        group = self.group_of[request.block_hashes[0]]
        index = group % len(workers) if self.placement is None else self.placement[group]
        return Decision(workers[index].url, "oracle")

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        pass

    def on_peer_decision(self, worker: str, request: RouteRequest, uncached: int, key: Hashable) -> None:
        pass


def cell(router: str, rate: float, shape: Shape, seed: int, phase: int | str, phase_s: float, workers: int,
         encoder: Encoder, minimal: bool, engines: list[VirtualWorker] | None = None,
         start: float = 0.0, ids: bool = False,
         carried: list[Policy] | None = None, generation: int = 0,
         chat: bool = False, profile: str = PROFILE, own_gpus: bool = False,
         dp: int = 1, jitter: tuple[float, int] | None = None,
         sglang_reports: bool = False, profile_set: tuple[str, ...] = ()) -> tuple[list[Outcome], list[VirtualWorker]]:
    """One phase; ``engines``/``start``: go on with an earlier phase's engines from time ``start``;
    ``ids``: the proxies route the prompts' token ids (the GPU cells' ``ids``), else their text;
    ``chat``: OpenAI chat, a system and a user message (the GPU cells' ``chat``: the proxies route
    the rendered turns, the engines tokenize the chat template);
    ``carried``: the proxies' policies, kept from an earlier phase (empty: built here and put in
    it), as a GPU cell's proxy processes live through its ``--repeat`` rounds; ``generation``: the
    fresh engines' (a round's flush, told to the proxies as ``fleet.py`` tells them since run 28);
    ``own_gpus``: each engine on a GPU of its own (the fleet ``nvidia-h200-x4`` would run), not
    the four on one; ``dp``: the engines as workers of that many data-parallel ranks each
    (``run_fleet.sh`` DP=: ``workers`` engines in ``workers / dp`` workers); ``jitter`` (seconds,
    seed): each arrival moved by up to that much either way, as a real client's send times wander
    (the groups and texts stay the trace's; see ``spread_cells``); the engines report their load
    as the GPU fleet's shim does, or with ``sglang_reports`` as SGLang does
    (``routing_sim.VirtualWorker``)."""
    from loadtests.routing_sim import route_of

    arrivals = trace(rate, phase_s, shape, seed)
    specs = [RequestSpec(f"g{g}", shape.output_tokens, messages=[{"role": "system", "content": s},
                                                                {"role": "user", "content": q}])
             if chat else RequestSpec(f"g{g}", shape.output_tokens, text=s + "\n\n" + q)
             for (s, q), (_, g) in zip(phase_texts(arrivals, shape, phase), arrivals, strict=True)]
    if jitter is not None:  # each request keeps its text; two within the jitter may swap places
        rng = random.Random(jitter[1])
        moved = sorted(((max(0.0, t + rng.uniform(-jitter[0], jitter[0])), k) for k, (t, _) in enumerate(arrivals)))
        arrivals, specs = [(t, arrivals[k][1]) for t, k in moved], [specs[k] for _, k in moved]
    router, what_if = sim_only(router)
    section = routing_section(router, TOKENIZER)  # the same spec keys as fleet.py's
    name, params = section.pop("policy"), section.pop("params")
    hold = float(section.pop("hold_max_s", 0.0))
    dp_ranks = bool(section.pop("dp_ranks", RoutingConfig().dp_ranks))
    if section.pop("tokenizer", None) is not None:  # the proxies tokenize with the engines' tokenizer
        ids = True
    if section:
        raise ValueError(f"{router}: {', '.join(section)} not simulated")
    replicas, kv_events = spec_replicas(router), bool(spec_kv_events(router))
    # peers=on: decisions and loads 2 ms later; "decisions": without the loads (before 2026-12-01 night)
    peers, peer_load = spec_peers(router), spec_value(router, "peers") != "decisions"
    policy: str | Callable[[], Policy] = name
    if name in ("oracle", "balanced"):
        group_of = {}
        for spec, (_, g) in zip(specs, arrivals, strict=True):  # the first block as the proxies key it
            text_ids = encoder.encode(spec.text or "") if ids and not chat else None
            group_of[route_of(spec, block_tokens=32, text_ids=text_ids).block_hashes[0]] = g
        placement = balanced_placement(arrivals, workers) if name == "balanced" else None
        policy = lambda: Oracle(group_of, placement)  # noqa: E731
    config = SimConfig(profile=profile, profile_set=profile_set, page_size=32, max_running_requests=64,
                       max_total_tokens=int(what_if.get("kv_tokens", POOL_TOKENS)),
                       kv_events_at="schedule" if what_if.get("kv_at_schedule") else "prefill")
    return simulate(policy, specs, [start + t for t, _ in arrivals], workers=workers // dp, sim=config,
                    params=params or None, hold_max_s=hold, shared_gpu=not own_gpus, replicas=replicas,
                    peer_sync_s=0.002 if peers else None, peer_load=peer_load, tokenize=ids,
                    kv_events=kv_events,
                    minimal_reports=minimal, shim_reports=not sglang_reports, encode=encoder.encode, encode_chat=encoder.encode_chat, block_tokens=32, engines=engines,
                    kept=carried, generation=generation, worker_tokens=int(what_if.get("worker_tokens", 0)),
                    steal_after_s=what_if.get("steal_after_s", math.inf), dp=dp, dp_ranks=dp_ranks,
                    scrape_interval_s=what_if.get("scrape_s", 0.5))


def forget(policies: Sequence[Policy], what: str) -> None:
    """Between ``--rounds``: drop what the ``ttft`` proxies learned in the rounds before (``model``:
    the TTFT fit, back to its prior; ``popularity``: the prompt keys' traffic counts; ``all``:
    both), so a round's cost can be split between what it carried and where it placed."""
    from proxy.routing.ttft_cost import TtftCost
    from proxy.routing.ttft_popularity import Popularity

    for policy in policies:
        if isinstance(policy, TtftCost):
            if what in ("model", "all"):
                policy.model = TtftCost(policy.params).model  # the prior, as a new proxy has it
            if what in ("popularity", "all"):
                policy.popularity = Popularity()


# The SGLang gateways are simulated by radixgate's own rendering of their policy: sglang-router
# 0.3.2's imbalance rule, and smg 1.13.0's spill gate against the fleet's mean (``gate=mean``,
# proxy/routing/cache_aware.py; the old rule stood for smg too until 2026-12-04) with its
# worker-overload protection on its 10-s poll of the engines' reports (since 2026-12-06; no-op
# where the engines report nothing); ``smg-open`` is smg without the protection, ``smg-blind``
# without it and not polling (fleet.py).
SMG = "cache_aware/gate=mean"
AS_SIMULATED = {"smg": f"{SMG}/overload_waiting=8/overload_usage=0.8/scrape_s=10", "smg-open": SMG,
                "smg-blind": SMG, "sglang-router": "cache_aware"}


def stand_in(spec: str, stand_ins: dict[str, str] | None = None) -> str:
    """The policy spec simulating router ``spec``: a peer's name (``smg``) as its stand-in, options
    after it kept (``smg/kv_tokens=24000``: smg's stand-in on 24k-token pools)."""
    head, sep, rest = spec.partition("/")
    base = (AS_SIMULATED if stand_ins is None else stand_ins).get(head, head)
    return f"{base}{sep}{rest}"


def gpu_phases(results: Path) -> Iterator[tuple[str, str, float, dict[str, Any]]]:
    """(cell label, router, rate, the router's first-round GPU summary) of every router phase of
    a GPU run's cells (its ``summary.jsonl``; ``--repeat`` rounds share a trace), the cell's record
    as ``_cell`` in the summary; a unique-prompt cell's label says so."""
    if not (results / "summary.jsonl").exists():
        return  # a run that came back without its summary
    for line in (results / "summary.jsonl").read_text().splitlines():
        c = json.loads(line)
        for rate in c["rates"]:
            label = f"{results.name} {prompt_form(c)} {c['reports']} seed {c['seed']} {rate:g}/s"
            for r in c["routers"]:
                got = c["summary"].get(r, {}).get(f"{rate:g}")
                if got is not None and r != "direct0":
                    yield label, r, rate, {**got, "_cell": c}


def ttfts(outcomes: Sequence[Outcome]) -> list[float]:
    """Each request's time to first token (s; inf where none came)."""
    return [o.first - o.arrival if o.first is not None else math.inf for o in outcomes]


def replay_phase(c: dict[str, Any], router: str, rate: float, encoder: Encoder, profile: str, as_router: str,
                 jitter: tuple[float, int] | None = None, profile_set: tuple[str, ...] = ()) -> list[Outcome]:
    """``router``'s first-round phase of GPU cell ``c`` in virtual time, on its own trace and prompt
    text, routed by the policy spec ``as_router`` (``cell``'s ``jitter`` and ``profile_set``)."""
    shape, base = Shape(**c["shape"]), int(argv_value(c["argv"], "--phase-base", "0"))
    key = text_key(c.get("text", "fresh"), base, rate, _phase_of(c, router, rate))
    outs, _ = cell(as_router, rate, shape, c["seed"], key, float(argv_value(c["argv"], "--phase-s", "30")),
                   c["workers"], encoder, c["reports"] == "minimal", ids=c["prompts"] == "ids",
                   chat=c["prompts"] == "chat", profile=profile, jitter=jitter, profile_set=profile_set)
    return outs


def phase_p95s(c: dict[str, Any], router: str, rate: float, encoder: Encoder, profile: str, as_router: str,
               jitters: Sequence[tuple[float, int] | None] = (None,), profile_set: tuple[str, ...] = ()) -> list[float]:
    """The TTFT p95 (s) of ``replay_phase``, once per entry of ``jitters``."""
    return [pct(ttfts(replay_phase(c, router, rate, encoder, profile, as_router, j, profile_set)), 0.95)
            for j in jitters]


def on_pool(spec: str, pool: int) -> str:
    """``spec`` on engines of ``pool`` KV tokens (the ``kv_tokens`` what-if where not the default)."""
    return spec if pool == POOL_TOKENS else f"{spec}/kv_tokens={pool}"


def replay_cells(results: Path, encoder: Encoder, profile: str = PROFILE, as_simulated: dict[str, str] | None = None,
                 profile_set: tuple[str, ...] = ()) -> list[tuple[str, dict[str, tuple[float, float]]]]:
    """Every router phase of a GPU run (its ``summary.jsonl``) again in virtual time, on its own
    trace and prompt text: per cell and rate, a label and each router's (GPU, simulated) TTFT p95
    in seconds (smg and sglang-router as ``as_simulated``, default ``AS_SIMULATED``, has them).
    The first phase of each router only (``--repeat`` rounds share a trace)."""
    pool = run_pool(results)
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for label, r, rate, got in gpu_phases(results):
        sim = phase_p95s(got["_cell"], r, rate, encoder, profile, on_pool(stand_in(r, as_simulated), pool),
                         profile_set=profile_set)[0]
        rows.setdefault(label, {})[r] = (got["ttft_p95"], sim)
    return list(rows.items())


def spread_cells(results: Path, encoder: Encoder, k: int, jitter_s: float = JITTER_S, profile: str = PROFILE,
                 as_simulated: dict[str, str] | None = None,
                 profile_set: tuple[str, ...] = ()) -> list[tuple[str, dict[str, tuple[float, list[float]]]]]:
    """As ``replay_cells``, each phase ``k`` times, each with its arrivals moved by up to
    ``jitter_s`` (seeds 0..k-1, the same for every router of a cell): the simulator's spread for
    that trace. One GPU phase is one draw of the same kind, so it should fall inside the ``k``
    simulated p95s about as often as a new draw would: (k - 1) / (k + 1)."""
    jitters = [(jitter_s, seed) for seed in range(k)]
    pool = run_pool(results)
    rows: dict[str, dict[str, tuple[float, list[float]]]] = {}
    for label, r, rate, got in gpu_phases(results):
        sims = phase_p95s(got["_cell"], r, rate, encoder, profile, on_pool(stand_in(r, as_simulated), pool), jitters,
                          profile_set)
        # the GPU's first round (its proxies fresh, as the simulated ones): one draw, not a pool
        rows.setdefault(label, {})[r] = ((got.get("p95_repeats") or [got["ttft_p95"]])[0], sims)
    return list(rows.items())


def cell_settings(a: argparse.Namespace, results: Path) -> tuple[str, ...]:
    """The profile settings a GPU run's cells replay on: ``--set``'s, then its machine's step cost
    (``--calibrate``, read on the profile as named)."""
    return tuple(a.set) + machine(results, a.profile, a.calibrate)


def machine(results: Path, profile: str, calibrate: str | None) -> tuple[str, ...]:
    """The ``profile_set`` that replays ``results`` on its own machine's step cost (``--calibrate``
    by the step clock, "steps", the batch log, "batches", or the warm-up's alone, its windows
    "warmup" or its step clock "warmup-steps"; said on stderr), or none."""
    if not calibrate:
        return ()
    overhead = fleet_overhead(results, perf.PROFILES[profile], calibrate)
    print(f"{results.name}: step_overhead_s {overhead} (the profile's {perf.PROFILES[profile].step_overhead_s})",
          file=sys.stderr, flush=True)
    return () if overhead is None else (f"step_overhead_s={overhead}",)


def calibrated_brier(odds: Sequence[float]) -> tuple[float, float]:
    """The Brier score that odds ``p`` earn, and its standard deviation, where each outcome is drawn
    with its own odds (the GPU's round one more draw of the simulated spread): p(1 - p) a cell on
    average. A score near it says the odds are as good as the cells allow (near-even cells score
    near 0.25 whoever forecasts them); one well above it, that the odds are overconfident."""
    if not odds:
        return math.nan, math.nan
    mean = sum(p * (1 - p) for p in odds) / len(odds)
    # a cell scores (1 - p)^2 with probability p, p^2 otherwise
    var = sum(p * (1 - p) ** 4 + (1 - p) * p ** 4 - (p * (1 - p)) ** 2 for p in odds) / len(odds) ** 2
    return mean, math.sqrt(var)


def spread_tally(rows: Sequence[tuple[str, dict[str, tuple[float, list[float]]]]], router: str = "ttft",
                 peer: str = "smg") -> str:
    """How the simulator's spread holds the GPU: per router, the phases whose GPU p95 lies within
    the simulated range (against the share a new draw would, (k - 1) / (k + 1)) and the range's
    width; for ``router`` against ``peer``, the simulator's odds that ``router`` is faster (its
    draws paired by jitter seed) against what the GPU's one round showed, as a Brier score (a
    coin scores 0.25) and the cells where those odds were 3 to 1 or longer."""
    parts = []
    for name in (peer, router):
        got = [cells[name] for _, cells in rows if name in cells]
        got = [(g, [x for x in sims if math.isfinite(x)]) for g, sims in got if math.isfinite(g)]
        got = [(g, sims) for g, sims in got if len(sims) > 1]
        if not got:
            continue
        k = len(got[0][1])
        inside = sum(1 for g, sims in got if min(sims) <= g <= max(sims))
        width = math.exp(sum(math.log(max(sims) / min(sims)) for _, sims in got) / len(got))
        parts.append(f"{name}: GPU inside the simulated range in {inside} of {len(got)} "
                     f"(a new draw {(k - 1) / (k + 1):.0%}), range max / min {width:.2f}x")
    pairs = [(cells[router], cells[peer]) for _, cells in rows if router in cells and peer in cells]
    odds = []
    for (g_r, s_r), (g_p, s_p) in pairs:
        if not (math.isfinite(g_r) and math.isfinite(g_p)) or g_r == g_p:
            continue
        p_win = sum(1 for a, b in zip(s_r, s_p, strict=True) if a < b) / len(s_r)
        odds.append((p_win, g_r < g_p))
    if odds:
        brier = sum((p - won) ** 2 for p, won in odds) / len(odds)
        expected, sd = calibrated_brier([p for p, _ in odds])
        sure = [(p, won) for p, won in odds if p >= 0.75 or p <= 0.25]
        right = sum(1 for p, won in sure if (p >= 0.75) == won)
        parts.append(f"{router} faster than {peer}: Brier {brier:.3f} over {len(odds)} cells (a coin 0.250; "
                     f"if the GPU's round were one more draw, {expected:.3f} ± {sd:.3f}); "
                     f"odds 3:1 or longer in {len(sure)}, the GPU's round agreed in {right}")
    return "; ".join(parts)


def cells_tally(rows: Sequence[tuple[str, dict[str, tuple[float, float]]]], router: str = "ttft",
                peer: str = "smg") -> str:
    """How the replayed cells compare: the phases of ``peer`` (and of ``router``) whose simulated
    p95 is within ±30% of the GPU's, and the cells where the simulator orders ``router`` and
    ``peer`` as the GPU did."""
    def within(name: str) -> str:
        pairs = [cells[name] for _, cells in rows if name in cells and all(map(math.isfinite, cells[name]))]
        good = sum(1 for g, s in pairs if abs(s / g - 1) <= TOLERANCE)
        mean_log = sum(abs(math.log(s / g)) for g, s in pairs) / len(pairs) if pairs else math.nan
        return f"{name} {good} of {len(pairs)} (mean |log| {mean_log:.3f})"

    both = [cells for _, cells in rows if router in cells and peer in cells]
    same = sum(1 for c in both if (c[router][0] < c[peer][0]) == (c[router][1] < c[peer][1]))
    # the standing each side gives: a cell's ratio is noisy (x/÷1.4 on the GPU itself), so what
    # the simulator is for is the mean over many cells, and how far each cell's tracks the GPU's
    logs = [(math.log(c[router][0] / c[peer][0]), math.log(c[router][1] / c[peer][1])) for c in both
            if all(0 < v < math.inf for v in (*c[router], *c[peer]))]
    standing = ""
    if logs:
        gpu, sim = (math.exp(sum(x) / len(logs)) for x in zip(*logs, strict=True))
        r = statistics.correlation(*zip(*logs, strict=True)) if len(logs) > 2 else math.nan
        standing = (f"; {router} / {peer} p95, geometric mean over {len(logs)} cells: GPU {gpu:.3f}x, "
                    f"simulated {sim:.3f}x (per cell r = {r:.2f})")
    return (f"p95 within ±30% of the GPU's: {within(peer)}, {within(router)}; "
            f"{router} against {peer} ordered as on the GPU in {same} of {len(both)} cells{standing}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", type=Path, nargs="+", metavar="RESULTS",
                   help="replay these GPU runs' cells on their own traces and text; print GPU / sim TTFT p95 ms "
                        "(each router name as the code reads it now: a default changed since the run "
                        "is replayed changed, e.g. runs before 33-35 had ttft with popularity off)")
    p.add_argument("--smg-as", metavar="SPEC",
                   help="--cells: the policy spec standing for smg (default: AS_SIMULATED['smg'], gate=mean with its overload protection; "
                        "cache_aware is sglang-router's rule, smg's stand-in before 2026-12-04)")
    p.add_argument("--calibrate", nargs="?", const="steps", choices=("steps", "batches", "warmup", "warmup-steps"),
                   default=None,
                   help="--cells: each run on its own machine's step cost, not the profile's: the step's fixed "
                        "host cost fitted to the run's mean busy step (steps, fidelity_placed --calibrate), "
                        "to its engines' batch logs (batches, loadtests.fleet_windows) or to its warm-up's alone "
                        "(a prediction for every judged phase): its windows (warmup) or its step clock "
                        "(warmup-steps, which small steps do not mislead)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a profile field for the simulated engines (e.g. step_overhead_s=0.07, a machine's "
                        "fixed step cost read from a warm-up: fleet_windows)")
    p.add_argument("--spread", type=int, default=0, metavar="K",
                   help="each phase K times more, arrivals moved by up to --jitter-s (seeds 0..K-1): the "
                        "simulated range of the p95; --cells: whether the GPU's first round lies in it")
    p.add_argument("--jitter-s", type=float, default=JITTER_S)
    p.add_argument("--save", type=Path, metavar="JSONL",
                   help="--cells --spread: also write each cell's GPU p95 and simulated draws (s), one line a cell")
    p.add_argument("--tally", type=Path, nargs="+", metavar="JSONL",
                   help="print the spread's tally of draws saved by --save, without replaying")
    p.add_argument("--routers", default="oracle,ttft,cache_aware",
                   help="policy specs, or the gateways by the harness's names (smg, smg-open, smg-blind, sglang-router: "
                        "their stand-ins, AS_SIMULATED)")
    p.add_argument("--profile", default=PROFILE, help="the simulated engines' performance profile (proxy.sim.perf)")
    p.add_argument("--rates", default="3,4.5")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed")
    p.add_argument("--phase-s", type=float, default=25.0)
    p.add_argument("--workers", type=int, default=4, help="engines")
    p.add_argument("--dp", type=int, default=1,
                   help="the engines as workers of this many data-parallel ranks each (run_fleet.sh DP=)")
    p.add_argument("--reports", choices=("full", "minimal", "sglang"), default="minimal",
                   help="full: engines that report their load as the GPU fleet's shim does (a request waits "
                        "until its first token); sglang: as SGLang does (its queue is what is not yet scheduled)")
    p.add_argument("--phase-base", type=int, default=None,
                   help="draw each rate's text as a GPU cell with this --phase-base did (its prompts exactly)")
    p.add_argument("--prompts", choices=("text", "ids", "chat"), default="text",
                   help="what the proxies route by: the text (a bytes-per-token estimate), the token ids, "
                        "or OpenAI chat messages (rendered turn by turn)")
    p.add_argument("--own-gpus", action="store_true",
                   help="each engine on a GPU of its own (one engine per H200), not the four sharing one")
    p.add_argument("--workload", choices=("shared", "unique"), default="shared",
                   help="the GPU cell's --workload: every prompt its group's system prompt and a question, or each its own")
    p.add_argument("--text-per-seed", action="store_true",
                   help="each seed draws its own prompt text as well as its own trace (else one text per rate)")
    p.add_argument("--carry-over", action="store_true",
                   help="run a rate's routers one after another on the same engines, as the GPU cell does "
                        "(each phase inherits the caches the one before left)")
    p.add_argument("--rounds", type=int, default=1,
                   help="each router this many times on the same trace and text, its proxies kept from "
                        "round to round and the engines fresh (fleet.py --repeat, which flushes them and "
                        "tells the proxies: a new generation per round)")
    p.add_argument("--reset", choices=("model", "popularity", "all"), default=None,
                   help="--rounds, forgetting this between rounds (see forget())")
    p.add_argument("--warm-index", action="store_true",
                   help="--rounds without telling the proxies of the fresh engines (fleet.py --warm-index, "
                        "as runs 19-27): their index believes what the last round's engines held")
    p.add_argument("--whole-cell", action="store_true",
                   help="as --carry-over, across the rates too, routers rotated by one per rate (fleet.py's order)")
    a = p.parse_args()
    if a.tally:
        saved = [json.loads(line) for path in a.tally for line in path.read_text().splitlines() if line.strip()]
        print(spread_tally([(d["cell"], {r: (g, sims) for r, (g, sims) in d["routers"].items()}) for d in saved]))
        return
    encoder = Encoder(str(TOKENIZER))
    if a.cells:
        a.cells = on_profile_gpu(a.cells, perf.PROFILES[a.profile].gpu.name)
        stand_ins = {**AS_SIMULATED, "smg": a.smg_as} if a.smg_as else AS_SIMULATED
        if a.spread > 1:
            spread_rows = []
            for results in a.cells:
                for label, spread in spread_cells(results, encoder, a.spread, a.jitter_s, a.profile, stand_ins,
                                                  cell_settings(a, results)):
                    spread_rows.append((label, spread))
                    if a.save:
                        with a.save.open("a") as f:
                            f.write(json.dumps({"cell": label, "routers": spread}) + "\n")
                    print(f"{label}: " + " | ".join(
                        f"{r} {g * 1e3:,.0f} / {min(s) * 1e3:,.0f}-{statistics.median(s) * 1e3:,.0f}-{max(s) * 1e3:,.0f}"
                        for r, (g, s) in spread.items()), flush=True)
            print(spread_tally(spread_rows))
            return
        rows = []
        for results in a.cells:
            for label, cells in replay_cells(results, encoder, a.profile, stand_ins, cell_settings(a, results)):
                rows.append((label, cells))
                print(f"{label}: " + " | ".join(f"{r} {g * 1e3:,.0f} / {s * 1e3:,.0f}" for r, (g, s) in cells.items()),
                      flush=True)
        print(cells_tally(rows))
        return
    shape = Shape(workload=a.workload)
    names = a.routers.split(",")
    gpu = perf.PROFILES[a.profile].gpu.name
    gpus = f"each on a simulated {gpu} of its own" if a.own_gpus else f"sharing one simulated {gpu}"
    workers = f" as {a.workers // a.dp} workers of {a.dp} DP ranks" if a.dp > 1 else ""
    settings = f" with {' '.join(a.set)}" if a.set else ""
    print(f"virtual time, {a.workers} engines{workers} {gpus} ({a.profile}{settings}), reports={a.reports}; "
          "TTFT p50 / p95 ms, reuse (cached / prompt tokens)")
    carry = a.carry_over or a.whole_cell
    engines: list[VirtualWorker] | None = None
    p95s: dict[str, list[float]] = {}  # router -> each phase's (last round's) TTFT p95
    spreads: dict[str, list[float]] = {}  # router -> --spread's jittered draws, every phase's
    start = 0.0
    for r, rate in enumerate(float(x) for x in a.rates.split(",")):
        order = names[r % len(names):] + names[: r % len(names)] if a.whole_cell else names
        for seed in range(a.seed, a.seed + a.seeds):
            row = []
            if not a.whole_cell:
                engines, start = None, 0.0
            for k, router in enumerate(order):
                # one prompt text per rate for every router (fleet.py's --text same), fresh per
                # phase only where a phase inherits the one before's caches
                phase: int | str = 1000 + 10 * r + (k if carry else 0)
                if a.text_per_seed:  # each seed its own prompt text too, not only its own trace
                    phase = f"{phase}-seed{seed}"
                if a.phase_base is not None:  # the text a GPU run's cell drew (fleet.py --text same)
                    phase = text_key("same", a.phase_base, rate, 0)
                carried: list[Policy] = []
                rounds = []
                for k_round in range(a.rounds):
                    if k_round and a.reset:
                        forget(carried, a.reset)
                    outcomes, fleet = cell(stand_in(router), rate, shape, seed, phase, a.phase_s, a.workers, encoder,
                                           a.reports == "minimal", engines, start, ids=a.prompts == "ids",
                                           carried=carried if a.rounds > 1 else None,
                                           generation=0 if a.warm_index else k_round, chat=a.prompts == "chat",
                                           profile=a.profile, own_gpus=a.own_gpus, dp=a.dp,
                                           sglang_reports=a.reports == "sglang", profile_set=tuple(a.set))
                    if carry:
                        engines = fleet
                    if carry or a.rounds > 1:
                        start = max(o.done or o.arrival for o in outcomes) + 5.0
                    ttft = ttfts(outcomes)
                    reuse = sum(o.cached_tokens for o in outcomes) / max(1, sum(o.prompt_tokens for o in outcomes))
                    rounds.append(f"{pct(ttft, 0.5) * 1e3:,.0f} / {pct(ttft, 0.95) * 1e3:,.0f}, {reuse:.0%}")
                p95s.setdefault(router, []).append(pct(ttft, 0.95))
                if a.spread > 1 and not carry and a.rounds == 1:  # the same phase, its arrivals moved
                    draws = [pct(ttfts(cell(
                        stand_in(router), rate, shape, seed, phase, a.phase_s, a.workers, encoder, a.reports == "minimal",
                        ids=a.prompts == "ids", chat=a.prompts == "chat", profile=a.profile, own_gpus=a.own_gpus,
                        dp=a.dp, jitter=(a.jitter_s, j), sglang_reports=a.reports == "sglang",
                        profile_set=tuple(a.set))[0]), 0.95)
                             for j in range(a.spread)]
                    spreads.setdefault(router, []).extend(draws)
                    rounds.append(f"jittered {min(draws) * 1e3:,.0f}-{statistics.median(draws) * 1e3:,.0f}-"
                                  f"{max(draws) * 1e3:,.0f}")
                row.append(f"{router} " + "; ".join(rounds))
            print(f"{rate:g}/s seed {seed}: " + " | ".join(row), flush=True)
    if len(p95s.get(names[0], ())) > 1:
        print(f"TTFT p95 against {names[0]}, geometric mean over its phases: " + ", ".join(
            f"{r} {geomean_ratio(p95s[r], p95s[names[0]]):.3f}x" for r in names[1:]))
    if spreads.get(names[0]):  # paired by phase and jitter seed
        base = spreads[names[0]]
        print(f"--spread {a.spread}: the share of jittered draws where {names[0]}'s p95 is under the other's: "
              + ", ".join(f"{r} {sum(1 for x, y in zip(base, spreads[r], strict=True) if x < y) / len(base):.0%}"
                          for r in names[1:]))


def geomean_ratio(values: Sequence[float], base: Sequence[float]) -> float:
    """The geometric mean of ``values[i] / base[i]`` (phases that finished in both)."""
    pairs = [(v, b) for v, b in zip(values, base, strict=True) if 0 < v < math.inf and 0 < b < math.inf]
    return math.exp(sum(math.log(v / b) for v, b in pairs) / len(pairs)) if pairs else math.nan


if __name__ == "__main__":
    main()
