"""routing.dp_ranks on and off, in front of simulated workers with data-parallel ranks.

    .venv/bin/python -m loadtests.bench_dp_ranks [--workers 2] [--dp 4] [--rate 8] [--rounds 2] [--seed 0]
        [--modes off,on,events]

Each simulated worker (``SimConfig.dp_size``) is one URL in front of ``--dp`` ranks with their own
radix caches, and spreads the requests that name no rank round robin, as SGLang's controller does.
The same shared-prefix trace (Poisson arrivals at ``--rate`` per second of simulated time, 16
groups of 2,048-token system prompts, 8 questions each) runs through radixgate's default policy
with ``routing.dp_ranks`` off and on, the workers' caches flushed before each run, the order
alternated over ``--rounds``. Mode ``events``: ``dp_ranks`` on and each rank's KV events followed
(every worker then publishes them, and every mode tokenizes with the GPU fleet's BPE tokenizer,
the workers too, so that text prompts match the events). Prints, per run and pooled: prefix tokens served from cache (as the
workers reported them), TTFT p50 / p95 and end-to-end p50 in simulated seconds. Everything runs
in this process in real time at ``--time-scale``; on a small shared machine the host's own delays
are multiplied by it too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import load
from proxy.loadgen.arrivals import poisson_times
from proxy.loadgen.client import Sample, flush, send
from proxy.loadgen.workloads import RequestSpec, shared_prefix
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


TOKENIZER = Path(__file__).resolve().parent / "gpu" / "tokenizer"
MODES = ("off", "on", "events")


async def one_run(urls: list[str], mode: str, specs: list[RequestSpec], times: list[float], scale: float,
                  tokenizer: bool) -> list[Sample]:
    app = App(load(env={}, overrides={
        "workers.static": urls, "server.port": 0, "server.admin_port": 0, "routing.dp_ranks": mode != "off",
        "scrape.interval_s": 0.1, "health.interval_s": 0.5, "telemetry.log_requests": False,
        **({"routing.tokenizer": str(TOKENIZER)} if tokenizer else {}),
        **({"kv_events.endpoint": "auto"} if mode == "events" else {})}),
        registry=CollectorRegistry())
    await app.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            await flush(s, urls)
            await asyncio.sleep(0.3)  # a scrape of the idle ranks
            if mode == "events":
                await joined(app)
            base = f"http://127.0.0.1:{app.http_port}"
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def at(t: float, i: int) -> Sample:
                await asyncio.sleep(max(0.0, start + t / scale - loop.time()))
                return await send(s, base, specs[i], f"r{i}", 1)
            return list(await asyncio.gather(*(at(t, i) for i, t in enumerate(times))))
    finally:
        await app.stop(2.0)


async def joined(app: App, seconds: float = 10.0) -> None:
    """Until every rank's stream has had a batch (the flush published one on each): PUB drops what
    it sends before a subscription lands, so the flush is repeated until one arrives."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not app.kv.subscribers() or any(sub.stats.batches == 0 for sub in app.kv.subscribers()):
        if loop.time() > deadline:
            raise SystemExit("the workers' KV event streams never reached the proxy")
        async with aiohttp.ClientSession() as s:
            await flush(s, app.workers.urls())
        await asyncio.sleep(0.1)


def summary(samples: list[Sample], scale: float) -> str:
    ok = [x for x in samples if x.ok and x.first is not None and x.done is not None]
    prompt = sum(x.prompt_tokens for x in ok)
    cached = sum(x.cached_tokens for x in ok)
    ttft = [(x.first - x.sent) * scale for x in ok if x.first is not None]
    e2e = [(x.done - x.sent) * scale for x in ok if x.done is not None]
    return (f"ok {len(ok):4d}/{len(samples):4d}   cached {100 * cached / max(1, prompt):5.1f}%   "
            f"TTFT p50 {statistics.median(ttft):6.3f} s  p95 {pct(ttft, 0.95):6.3f} s   e2e p50 {statistics.median(e2e):6.3f} s")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--rate", type=float, default=8.0, help="requests per simulated second")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--modes", default="off,on", help=f"of {', '.join(MODES)}, run in this order, then reversed")
    args = p.parse_args()
    modes = args.modes.split(",")
    if not modes or any(m not in MODES for m in modes):
        p.error(f"--modes: a list of {', '.join(MODES)}")
    events = "events" in modes
    kv = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"})
    specs = shared_prefix(groups=16, prompts_per_group=8, system_tokens=2048, question_tokens=64, output_tokens=32,
                          seed=args.seed)
    times = poisson_times(args.rate, len(specs), random.Random(args.seed))
    # with KV events: SimConfig's page_size, kv_events_config and tokenizer
    extra: dict[str, Any] = {"page_size": 16, "kv_events_config": kv, "tokenizer": str(TOKENIZER)} if events else {}
    configs = [SimConfig(time_scale=args.time_scale, dp_size=args.dp, enable_cache_report=True,
                         max_total_tokens=60_000, **extra)
               for _ in range(args.workers)]
    pooled: dict[str, list[Sample]] = {m: [] for m in modes}
    async with Fleet.in_process(configs) as fleet:
        for r in range(args.rounds):
            for mode in (modes if r % 2 == 0 else modes[::-1]):
                got = await one_run(fleet.urls, mode, specs, times, args.time_scale, events)
                pooled[mode] += got
                print(f"round {r + 1}  dp_ranks {mode:6s}  {summary(got, args.time_scale)}", flush=True)
    print(f"\n{args.workers} workers x {args.dp} DP ranks, {len(specs)} requests at {args.rate}/s, seed {args.seed}, "
          f"{args.rounds} rounds pooled:")
    for mode in modes:
        print(f"  dp_ranks {mode:6s}  {summary(pooled[mode], args.time_scale)}")


if __name__ == "__main__":
    uvloop.run(main())
