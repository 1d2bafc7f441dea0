"""The default's spill gate with a tighter margin, in the routing simulator (a what-if, no setting).

    .venv/bin/python -m loadtests.gpu.gate_margin_sim --rate 6 --seeds 24 --variants default,3:1.2,2:1.15,4:1.3

The gate (``routing.params.spill_over_mean``, ``proxy.routing.base.past_mean``) lets a follower
leave its prefix's holder when the holder's outstanding requests pass the fleet's mean by
max(4, 2 sqrt(mean)) and by ``spill_over_mean`` x mean. A variant ``M:R`` replaces that for the
run with a fixed margin of M requests and the ratio R, to ask whether a gate that fires sooner
helps the one-GPU fleet. Token ids, minimal reports, seeds from 15, each with its own prompt text;
prints each seed's TTFT p95 (and spills) and each variant's geometric mean against smg's rule
(``cache_aware/gate=mean``) and against the first variant.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from unittest import mock

import proxy.routing.ttft_cost as ttft_cost
from loadtests.gpu import fleet_sim
from loadtests.gpu.fleet import TOKENIZER, Shape
from loadtests.gpu.fleet_report import pct
from proxy.routing.base import past_mean
from proxy.sim.tokenizer import Encoder

# past_mean's signature: (load, loads, ratio, cap)
Gate = Callable[[float, Sequence[float], float, float], bool]


def fixed_margin(margin: float, ratio: float) -> Gate:
    def gate(load: float, loads: Sequence[float], _ratio: float, cap: float = math.inf) -> bool:
        mean = sum(loads) / len(loads)
        return load > mean + margin and load > ratio * mean
    return gate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=6.0)
    p.add_argument("--seeds", type=int, default=24)
    p.add_argument("--variants", default="default,3:1.2,2:1.15,4:1.3")
    a = p.parse_args()
    variants = a.variants.split(",")
    encoder = Encoder(str(TOKENIZER))
    p95: dict[str, list[float]] = {v: [] for v in ["smg", *variants]}
    for seed in range(15, 15 + a.seeds):
        phase = f"1000-seed{seed}"
        outs, _ = fleet_sim.cell("cache_aware/gate=mean", a.rate, Shape(), seed, phase, 25.0, 4, encoder, True, ids=True)
        p95["smg"].append(pct([o.first - o.arrival if o.first is not None else math.inf for o in outs], 0.95))
        row = []
        for v in variants:
            gate: Gate = past_mean if v == "default" else fixed_margin(*map(float, v.split(":")))
            # the ttft policy's gate (ttft_cost's own name for past_mean) for this run only
            with mock.patch.object(ttft_cost, "past_mean", gate):
                outs, _ = fleet_sim.cell("ttft", a.rate, Shape(), seed, phase, 25.0, 4, encoder, True, ids=True)
            p95[v].append(pct([o.first - o.arrival if o.first is not None else math.inf for o in outs], 0.95))
            row.append(f"{v} {p95[v][-1]:.2f} ({sum(o.branch == 'spill' for o in outs)} spills)")
        print(f"{a.rate:g}/s seed {seed}: smg's rule {p95['smg'][-1]:.2f} | " + " | ".join(row), flush=True)
    for v in variants:
        print(f"{v}: against smg's rule {fleet_sim.geomean_ratio(p95[v], p95['smg']):.3f}x, "
              f"against {variants[0]} {fleet_sim.geomean_ratio(p95[v], p95[variants[0]]):.3f}x")


if __name__ == "__main__":
    main()
