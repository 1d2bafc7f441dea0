"""Where the TTFT tail of proxy replicas sharing nothing but the workers' KV events comes from,
against one proxy, on ``bench_routing``'s simulated fleet (virtual time, same trace for both).

    python -m loadtests.replica_tail --seeds 4-15 --rate 128

Per seed and in total: TTFT p95 of each; the share of the slowest 5% that arrived in the
workload's first second (when every group is new); followers that arrived before their group's
first request had its first token (so before any KV event could name its prefix) and were
placed ``balance``, and how many of those left the group's first worker; groups kept whole.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict

from loadtests.bench_routing import parse_seeds
from loadtests.routing_sim import Outcome, simulate
from proxy.loadgen.arrivals import poisson_times
from proxy.loadgen.workloads import WORKLOADS
from proxy.sim.config import SimConfig


def tail_origin(outcomes: list[Outcome], first_s: float = 1.0) -> dict[str, float]:
    """The p95, where its requests arrived, and the early followers that split groups."""
    done = sorted((o.first - o.arrival, n, o) for n, o in enumerate(outcomes) if o.first is not None)
    top = done[int(0.95 * len(done)):]
    start = min(o.arrival for o in outcomes)
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        groups[o.group].append(o)
    early = left = 0
    for members in groups.values():
        members.sort(key=lambda o: o.arrival)
        head = members[0]
        for o in members[1:]:
            if o.branch == "balance" and (head.first is None or o.arrival < head.first):
                early += 1
                left += o.worker != head.worker
    return {
        "p95": top[0][0] if top else 0.0,
        "top_in_first_s": sum(o.arrival - start < first_s for _, _, o in top) / max(len(top), 1),
        "early_balance": early,
        "early_elsewhere": left,
        "whole": sum(len({o.worker for o in m}) == 1 for m in groups.values()) / max(len(groups), 1),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="4-15")
    ap.add_argument("--rate", type=float, default=128.0)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--workload", default="shared_prefix", choices=sorted(WORKLOADS))
    ap.add_argument("--profile", default="llama-3.1-8b-h100")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--scrape-interval", type=float, default=0.1)
    ap.add_argument("--params", default="{}", help='ttft params, e.g. {"cold_choices": 1}')
    args = ap.parse_args(argv)
    params = json.loads(args.params)
    sim = SimConfig(profile=args.profile, page_size=args.page_size)
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    print("| seed | setup | TTFT p95 s | slowest 5% in the first second | early balance / left the group's worker | groups whole |")
    print("|---|---|---|---|---|---|")
    for seed in parse_seeds(args.seeds):
        specs = WORKLOADS[args.workload](seed=seed, scale=1)
        arrivals = poisson_times(args.rate, len(specs), random.Random(seed))
        for name, replicas, events in (("one proxy", 1, False), (f"{args.replicas} replicas, KV events", args.replicas, True)):
            outcomes, _ = simulate("ttft", specs, arrivals, workers=4, sim=sim, replicas=replicas,
                                   scrape_interval_s=args.scrape_interval, seed=seed, params=params,
                                   kv_events=events, hold_max_s=0)
            r = tail_origin(outcomes)
            rows[name].append(r)
            print(f"| {seed} | {name} | {r['p95']:.3f} | {r['top_in_first_s']:.0%} | "
                  f"{r['early_balance']:.0f} / {r['early_elsewhere']:.0f} | {r['whole']:.0%} |")
    for name, rs in rows.items():
        print(f"| mean | {name} | {statistics.fmean(r['p95'] for r in rs):.3f} | "
              f"{statistics.fmean(r['top_in_first_s'] for r in rs):.0%} | "
              f"{statistics.fmean(r['early_balance'] for r in rs):.1f} / {statistics.fmean(r['early_elsewhere'] for r in rs):.1f} | "
              f"{statistics.fmean(r['whole'] for r in rs):.0%} |")


if __name__ == "__main__":
    main()
