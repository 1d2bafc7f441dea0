"""Routing policies side by side on one simulated fleet (issue 4, "Measure").

    python -m loadtests.bench_routing --workload shared_prefix --rates 64,128,160
    python -m loadtests.bench_routing --mode http --routers ttft,cache_aware,sglang-router ...

Same workload (``proxy.loadgen.workloads``), same seed, same Poisson arrival times (open loop) for
every router; 4 Llama-3.1-8B-on-H100 simulated workers by default. Two modes:

* ``sim`` (default): ``loadtests.routing_sim`` -- radixgate's real routing code in front of the
  simulated workers' real schedulers, radix caches and step-time model, in virtual time. Exact,
  repeatable, immune to a busy host; leaves out HTTP and proxy overhead. ``--replicas N`` adds a
  run of ``--replica-policy`` behind N independent proxies, each seeing every N-th request;
  ``--peer-sync S`` adds one where each tells the others its decisions, S seconds later
  (``routing.peers``).
* ``http``: ``loadtests.bench_routing_http`` -- real router processes (radixgate, and the real
  ``sglang-router`` when named) in front of simulated workers running at ``--time-scale``,
  streamed over loopback. On a small shared machine host contention shows up as latency.

Reported per router, in simulated seconds: TTFT p50/p95/p99, inter-token p95, end-to-end p95,
throughput, goodput (requests per second whose TTFT met ``--slo-ttft``), prefix hit rate
captured (reported cached / prompt tokens) against available (one LRU cache of the fleet's total
KV capacity fed the same trace), imbalance (max / mean requests per worker) and the share of
prompt groups that stayed on one worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from loadtests.bench_summary import available_ratio, print_table, summarize
from loadtests.routing_sim import Outcome, simulate
from proxy.loadgen.arrivals import poisson_times
from proxy.loadgen.workloads import WORKLOADS, RequestSpec
from proxy.sim.config import SimConfig
from proxy.sim.perf import PROFILES

RADIXGATE_POLICIES = ("ttft", "least_load", "round_robin", "consistent_hash", "cache_aware")


def sim_config(args: argparse.Namespace) -> SimConfig:
    """The simulated workers every run of the call shares."""
    return SimConfig(profile=args.profile, max_total_tokens=args.kv_tokens, page_size=args.page_size,
                     kv_events_at=args.kv_events_at)


def run_sim(args: argparse.Namespace, policy: str, specs: list[RequestSpec], arrivals: list[float],
            replicas: int, kv_events: bool = False) -> dict[str, Any]:
    sim = sim_config(args)
    params = json.loads(args.params).get(policy, {})
    peer_sync = args.peer_sync if replicas > 1 and args.peer_sync >= 0 else None
    outcomes, fleet = simulate(policy, specs, arrivals, workers=args.workers, sim=sim, replicas=replicas,
                               scrape_interval_s=args.scrape_interval, seed=args.seed, params=params,
                               peer_sync_s=peer_sync, kv_events=kv_events, hold_max_s=args.hold_max_s)
    done = [o for o in outcomes if o.first is not None and o.done is not None]
    touched: dict[str, set[str]] = defaultdict(set)
    for o in outcomes:
        touched[o.group].add(o.worker)
    events = ", KV events" if kv_events else ""
    return summarize(
        policy + events if replicas == 1 else f"{policy} x{replicas} proxies" + (
            f", peers told {peer_sync * 1e3:g} ms later" if peer_sync is not None
            else ", sharing nothing but the KV events" if kv_events else ", sharing nothing"),
        sent=len(outcomes),
        ttft=[o.first - o.arrival for o in done if o.first is not None],
        e2e=[o.done - o.arrival for o in done if o.done is not None],
        gaps=[g for o in done for g in o.gaps],
        span=max(o.done for o in done if o.done is not None) - min(o.arrival for o in done),
        cached=sum(o.cached_tokens for o in done), prompt=sum(o.prompt_tokens for o in done),
        per_worker=[w.requests for w in fleet], touched=touched, slo=args.slo_ttft,
        predicted_exact=prediction_exact(done, args.page_size) if args.kv_events else None)


def prediction_exact(done: list[Outcome], page: int) -> float:
    """Share of requests whose predicted cached tokens, in the worker's units (an estimate of a
    text prompt rescaled by reported / estimated prompt tokens), were within one page of the
    reported ones."""
    def close(o: Outcome) -> bool:
        scale = o.prompt_tokens / o.est_prompt_tokens if o.est_prompt_tokens else 1.0
        return abs(round(o.predicted * scale) - o.cached_tokens) <= max(1, page) - 1
    return sum(close(o) for o in done) / max(1, len(done))


async def run_http_rate(args: argparse.Namespace, specs: list[RequestSpec], arrivals: list[float]) -> list[dict[str, Any]]:
    from loadtests.bench_routing_http import run_one
    from proxy.sim.fleet import Fleet

    sim = SimConfig(profile=args.profile, time_scale=args.time_scale, enable_metrics=True, enable_cache_report=True,
                    stream_interval=args.stream_interval, max_total_tokens=args.kv_tokens)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_routing_") as tmp:
        async with Fleet.subprocesses([sim] * args.workers) as fleet:
            for name in args.routers.split(","):
                rows.append(await run_one(args, fleet, name, specs, arrivals, Path(tmp), 1))
            if args.replicas > 1:
                rows.append(await run_one(args, fleet, args.replica_policy, specs, arrivals, Path(tmp), args.replicas))
                if args.peer_sync >= 0:  # over HTTP the delay is the real one
                    rows.append(await run_one(args, fleet, args.replica_policy, specs, arrivals, Path(tmp),
                                              args.replicas, peers=True))
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("sim", "http"), default="sim")
    ap.add_argument("--workload", default="shared_prefix", choices=sorted(WORKLOADS))
    ap.add_argument("--workload-args", default="{}", help='JSON keyword arguments, e.g. {"groups": 8}')
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every token length")
    ap.add_argument("--requests", type=int, default=0, help="send only the first N requests (0 = all)")
    ap.add_argument("--rates", default="64,128", help="simulated requests per second, comma separated")
    ap.add_argument("--routers", default=",".join(RADIXGATE_POLICIES),
                    help="radixgate policies, and (http mode) sglang-router")
    ap.add_argument("--replicas", type=int, default=1, help="also run --replica-policy behind this many proxies")
    ap.add_argument("--replica-policy", default="ttft")
    ap.add_argument("--peer-sync", type=float, default=-1.0,
                    help="with --replicas, also a run where replicas share decisions (routing.peers): sim mode, "
                         "arriving this many seconds later; http mode, over real POSTs (any value >= 0); -1 = no")
    ap.add_argument("--hold-max-s", type=float, default=1.0,
                    help="sim mode: routing.hold_max_s of every proxy (the product's default is 0: off)")
    ap.add_argument("--params", default="{}", help='sim mode: policy params, e.g. {"ttft": {"work_weight": 2}}')
    ap.add_argument("--kv-events", action="store_true",
                    help="sim mode: also --replica-policy reading the workers' KV events (and keying text by "
                         "the engines' token ids), behind one proxy and, with --replicas, behind replicas "
                         "sharing nothing else; adds the prediction-exact column")
    ap.add_argument("--kv-events-at", choices=("prefill", "schedule"), default="prefill",
                    help="with --kv-events: the workers publish a prompt's blocks once its prefill ran (SGLang) or "
                         "when they schedule it (vLLM v1)")
    ap.add_argument("--page-size", type=int, default=1, help="sim mode: the workers' KV page size")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--profile", default="llama-3.1-8b-h100", choices=sorted(PROFILES))
    ap.add_argument("--kv-tokens", type=int, default=None, help="KV pool per worker (default: the profile's)")
    ap.add_argument("--scrape-interval", type=float, default=0.5, help="sim mode: seconds between engine scrapes")
    ap.add_argument("--time-scale", type=float, default=4.0, help="http mode: simulated workers' speed-up")
    ap.add_argument("--stream-interval", type=int, default=16, help="http mode: tokens per streamed chunk")
    ap.add_argument("--slo-ttft", type=float, default=0.5, help="TTFT SLO in simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", default="", help="comma-separated seeds: mean table over them (workload + arrivals)")
    ap.add_argument("--each-seed", action="store_true", help="with --seeds, also print every seed's table")
    ap.add_argument("--jobs", type=int, default=1, help="sim mode: seeds run in this many processes at once")
    args = ap.parse_args(argv)
    seeds = parse_seeds(args.seeds) if args.seeds else [args.seed]
    for rate in (float(r) for r in args.rates.split(",")):
        jobs = [(args, rate, seed) for seed in seeds]
        if args.mode == "sim" and args.jobs > 1 and len(seeds) > 1:
            with multiprocessing.Pool(min(args.jobs, len(seeds))) as pool:
                results = pool.starmap(run_seed, jobs)
        else:
            results = [run_seed(*job) for job in jobs]
        for seed, (rows, available, title) in zip(seeds, results, strict=True):
            if len(seeds) == 1 or args.each_seed:
                print_table(f"{title}, seed {seed}", rows, available, box_load=args.mode == "http")
        if len(seeds) > 1:
            title = results[0][2]
            print_table(f"{title}, mean over seeds {args.seeds}", mean_rows([r[0] for r in results]),
                        statistics.fmean(r[1] for r in results), box_load=args.mode == "http")


def parse_seeds(text: str) -> list[int]:
    """"0,1,2" or "0-15" (inclusive) or a mix: "0-3,8"."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def run_seed(args: argparse.Namespace, rate: float, seed: int) -> tuple[list[dict[str, Any]], float, str]:
    """Every router on one seed's workload and arrivals: (rows, available hit rate, table title)."""
    args = argparse.Namespace(**{**vars(args), "seed": seed})
    kwargs: dict[str, Any] = {"seed": seed, "scale": args.scale, **json.loads(args.workload_args)}
    specs = WORKLOADS[args.workload](**kwargs)[: args.requests or None]
    arrivals = poisson_times(rate, len(specs), random.Random(seed))
    sim = sim_config(args)
    kv = sim.max_total_tokens or PROFILES[args.profile].kv_pool_tokens
    available = available_ratio(specs, kv * args.workers)
    if args.mode == "http":
        rows = asyncio.run(run_http_rate(args, specs, arrivals))
    else:
        rows = [run_sim(args, name, specs, arrivals, 1) for name in args.routers.split(",")]
        if args.kv_events:
            rows.append(run_sim(args, args.replica_policy, specs, arrivals, 1, kv_events=True))
        if args.replicas > 1:
            if args.peer_sync >= 0:
                no_peers = argparse.Namespace(**{**vars(args), "peer_sync": -1.0})
                rows.append(run_sim(no_peers, args.replica_policy, specs, arrivals, args.replicas))
            rows.append(run_sim(args, args.replica_policy, specs, arrivals, args.replicas))
            if args.kv_events:
                no_peers = argparse.Namespace(**{**vars(args), "peer_sync": -1.0})
                rows.append(run_sim(no_peers, args.replica_policy, specs, arrivals, args.replicas, kv_events=True))
    title = (f"**{args.workload}** {args.workload_args if args.workload_args != '{}' else ''} "
             f"scale {args.scale:g}: {len(specs)} requests at {rate:g} req/s, {args.workers} workers "
             f"({args.profile}), {args.mode} mode, TTFT SLO {args.slo_ttft:g} s")
    return rows, available, title


def mean_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Field-wise mean of the same router's row over several runs."""
    out = []
    for i, first in enumerate(runs[0]):
        row: dict[str, Any] = dict(first)
        for key, value in first.items():
            if isinstance(value, float) or (isinstance(value, int) and key != "sent"):
                row[key] = statistics.fmean(r[i][key] for r in runs)
        row["ok"] = round(row["ok"])
        out.append(row)
    return out


if __name__ == "__main__":
    main()
