"""The routing simulator's own decisions against the GPU proxies', request by request.

    .venv/bin/python -m loadtests.fidelity_routing --results loadtests/results/gpu-fleet-default-10 [--profile P]

``fleet_sim --cells`` judges the routing simulator by its tail alone; ``fidelity_placed`` replays
each request where the GPU's router really sent it, so the engine model alone is judged. This
puts the two together, per routed GPU phase whose proxies started fresh (each router's first
round: later rounds carry what the proxies learned): the same router runs again in the routing
simulator on the same trace and prompt text (``fleet_sim.replay_phase``), and

- **agree**: the share of requests the simulator sent to the same engine as the GPU's router,
  under the relabelling of the engines that matches best (engine numbers mean nothing: which
  engine a group's first request lands on is a tie broken by order);
- **whole**: the share of requests on the engine most of their group went to, GPU / simulated;
- **busiest**: the most requests one engine took, against the mean, GPU / simulated;
- three TTFT p95s: the GPU's (engine side: arrival at the engine to first token), the simulator's
  on its own decisions (client side; the product holds nothing by default), and the simulator's
  on the GPU's decisions (``fidelity_placed``).

Where the own-decision p95 misses and the GPU-placement one holds, the router decided otherwise
in the simulator than on the GPU: what it saw there differs. Where both miss, the engine model.
Runs of data-parallel workers are left out (an engine is not a worker there).
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.fidelity import TOLERANCE, _phase_of
from loadtests.fidelity_replay import Placed, engine_count, placed_phases
from loadtests.fidelity_replay import simulate as replay_placed
from loadtests.gpu.fleet import TOKENIZER
from loadtests.gpu.fleet_report import pct
from loadtests.gpu.fleet_sim import AS_SIMULATED, PROFILE, on_pool, replay_phase, ttfts
from proxy.sim import perf
from proxy.sim.tokenizer import Encoder

# Routers whose placement the trace alone fixes, or that no simulated policy stands for.
FIXED = ("oracle", "balanced", "round_robin")


@dataclass(frozen=True)
class Compared:
    label: str
    agree: float  # share of requests on the same engine, best relabelling
    whole: tuple[float, float]  # GPU, simulated
    busiest: tuple[float, float]  # GPU, simulated: max requests on one engine / mean
    p95: tuple[float, float, float]  # s: GPU (engine side), simulated own decisions, simulated GPU's


def best_agreement(gpu: Sequence[int], sim: Sequence[int], engines: int) -> float:
    """The share of positions where ``sim`` names the engine ``gpu`` does, under the permutation of
    engine numbers that makes it largest (exhaustive: fleets here have a handful of engines)."""
    if not gpu:
        return math.nan
    counts = Counter(zip(gpu, sim, strict=True))
    best = max(sum(counts[(k, perm[k])] for k in range(engines))
               for perm in itertools.permutations(range(engines)))
    return best / len(gpu)


def whole_share(groups: Sequence[int], engine: Sequence[int]) -> float:
    """The share of requests on the engine that took most of their group's requests."""
    by_group: dict[int, Counter[int]] = {}
    for g, e in zip(groups, engine, strict=True):
        by_group.setdefault(g, Counter())[e] += 1
    return sum(c.most_common(1)[0][1] for c in by_group.values()) / max(1, len(groups))


def busiest(engine: Sequence[int], engines: int) -> float:
    """The most requests one engine took, against the mean per engine."""
    counts = Counter(engine)
    return max(counts.values()) * engines / max(1, len(engine))


def compare(p: Placed, encoder: Encoder, profile: perf.Profile, cache: dict[Any, list[list[int]]]) -> Compared | None:
    c = p.cell
    n = engine_count(c)
    if n != c["workers"] or p.router in FIXED or p.router.startswith("direct"):
        return None
    if p.phase != _phase_of(c, p.router, p.rate):
        return None  # a later round: its proxies carried what the round before taught them
    outs = replay_phase(c, p.router, p.rate, encoder, profile.name,
                        on_pool(AS_SIMULATED.get(p.router, p.router), p.pool_tokens))
    sim_engine = {o.index: int(o.worker.rsplit("w", 1)[1]) for o in outs}
    groups = {o.index: int(o.group[1:]) for o in outs}
    both = [k for k in range(len(p.index)) if p.index[k] in sim_engine]
    gpu_e = [p.engine[k] for k in both]
    sim_e = [sim_engine[p.index[k]] for k in both]
    grp = [groups[p.index[k]] for k in both]
    own = pct(ttfts(outs), 0.95)
    placed = replay_placed(p, profile, encoder, cache)["ttft_p95"]
    label = f"{c['prompts']} {c['reports']} seed {c['seed']} {p.rate:g}/s {p.router}"
    return Compared(label, best_agreement(gpu_e, sim_e, n), (whole_share(grp, gpu_e), whole_share(grp, sim_e)),
                    (busiest(gpu_e, n), busiest(sim_e, n)), (pct(p.ttft, 0.95), own, placed))


def _within(sim: float, real: float) -> bool:
    return math.isfinite(sim) and math.isfinite(real) and real > 0 and abs(sim / real - 1) <= TOLERANCE


def tally(rows: Sequence[Compared]) -> str:
    """Which side misses: the phases whose own-decision p95 is within ±30% of the GPU's, those
    whose replay of the GPU's placement is, and the mean agreement of each kind of phase."""
    own = [r for r in rows if _within(r.p95[1], r.p95[0])]
    placed = [r for r in rows if _within(r.p95[2], r.p95[0])]
    routing_miss = [r for r in rows if r in placed and r not in own]

    def mean_agree(rs: Sequence[Compared]) -> str:
        return f"{sum(r.agree for r in rs) / len(rs):.0%}" if rs else "-"

    return (f"{len(rows)} phases: own decisions within ±30% in {len(own)}, the GPU's placement replayed in "
            f"{len(placed)}; missed on own decisions only in {len(routing_miss)} (agreement there "
            f"{mean_agree(routing_miss)}, where both hold {mean_agree([r for r in own if r in placed])}, "
            f"all {mean_agree(rows)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, nargs="+", required=True)
    ap.add_argument("--profile", default=PROFILE)
    a = ap.parse_args()
    encoder, profile = Encoder(str(TOKENIZER)), perf.PROFILES[a.profile]
    print(f"profile {a.profile}; TTFT p95 ms: GPU / simulated on its own decisions / on the GPU's; "
          "agree = requests on the same engine (best relabelling); whole, busiest: GPU / simulated")
    rows: list[Compared] = []
    for results in a.results:
        cache: dict[Any, list[list[int]]] = {}
        for p in placed_phases(results):
            got = compare(p, encoder, profile, cache)
            if got is None:
                continue
            rows.append(got)
            g, s, r = (x * 1e3 for x in got.p95)
            print(f"{results.name} {got.label}: p95 {g:,.0f} / {s:,.0f} ({s / g:.2f}x) / {r:,.0f} ({r / g:.2f}x); "
                  f"agree {got.agree:.0%}; whole {got.whole[0]:.0%} / {got.whole[1]:.0%}; "
                  f"busiest {got.busiest[0]:.2f} / {got.busiest[1]:.2f}", flush=True)
    if rows:
        print(tally(rows))


if __name__ == "__main__":
    main()
