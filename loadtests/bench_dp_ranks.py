"""routing.dp_ranks on and off, in front of simulated workers with data-parallel ranks.

    .venv/bin/python -m loadtests.bench_dp_ranks [--workers 2] [--dp 4] [--rate 8] [--rounds 2] [--seed 0]

Each simulated worker (``SimConfig.dp_size``) is one URL in front of ``--dp`` ranks with their own
radix caches, and spreads the requests that name no rank round robin, as SGLang's controller does.
The same shared-prefix trace (Poisson arrivals at ``--rate`` per second of simulated time, 16
groups of 2,048-token system prompts, 8 questions each) runs through radixgate's default policy
with ``routing.dp_ranks`` off and on, the workers' caches flushed before each run, the order
alternated over ``--rounds``. Prints, per run and pooled: prefix tokens served from cache (as the
workers reported them), TTFT p50 / p95 and end-to-end p50 in simulated seconds. Everything runs
in this process in real time at ``--time-scale``; on a small shared machine the host's own delays
are multiplied by it too.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics

import aiohttp
import uvloop
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import load
from proxy.loadgen.arrivals import poisson_times
from proxy.loadgen.client import Sample, flush, send
from proxy.loadgen.workloads import shared_prefix
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def one_run(urls: list[str], pin: bool, specs: list, times: list[float], scale: float) -> list[Sample]:
    app = App(load(env={}, overrides={
        "workers.static": urls, "server.port": 0, "server.admin_port": 0, "routing.dp_ranks": pin,
        "scrape.interval_s": 0.1, "health.interval_s": 0.5, "telemetry.log_requests": False}),
        registry=CollectorRegistry())
    await app.start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
            await flush(s, urls)
            await asyncio.sleep(0.3)  # a scrape of the idle ranks
            base = f"http://127.0.0.1:{app.http_port}"
            loop = asyncio.get_running_loop()
            start = loop.time()

            async def at(t: float, i: int) -> Sample:
                await asyncio.sleep(max(0.0, start + t / scale - loop.time()))
                return await send(s, base, specs[i], f"r{i}", 1)
            return list(await asyncio.gather(*(at(t, i) for i, t in enumerate(times))))
    finally:
        await app.stop(2.0)


def summary(samples: list[Sample], scale: float) -> str:
    ok = [x for x in samples if x.ok and x.first is not None and x.done is not None]
    prompt = sum(x.prompt_tokens for x in ok)
    cached = sum(x.cached_tokens for x in ok)
    ttft = [(x.first - x.sent) * scale for x in ok]  # type: ignore[operator]
    e2e = [(x.done - x.sent) * scale for x in ok]  # type: ignore[operator]
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
    args = p.parse_args()
    specs = shared_prefix(groups=16, prompts_per_group=8, system_tokens=2048, question_tokens=64, output_tokens=32,
                          seed=args.seed)
    times = poisson_times(args.rate, len(specs), random.Random(args.seed))
    configs = [SimConfig(time_scale=args.time_scale, dp_size=args.dp, enable_cache_report=True,
                         max_total_tokens=60_000) for _ in range(args.workers)]
    pooled: dict[bool, list[Sample]] = {False: [], True: []}
    async with Fleet.in_process(configs) as fleet:
        for r in range(args.rounds):
            for pin in ((False, True) if r % 2 == 0 else (True, False)):
                got = await one_run(fleet.urls, pin, specs, times, args.time_scale)
                pooled[pin] += got
                print(f"round {r + 1}  dp_ranks {'on ' if pin else 'off'}  {summary(got, args.time_scale)}", flush=True)
    print(f"\n{args.workers} workers x {args.dp} DP ranks, {len(specs)} requests at {args.rate}/s, seed {args.seed}, "
          f"{args.rounds} rounds pooled:")
    for pin in (False, True):
        print(f"  dp_ranks {'on ' if pin else 'off'}  {summary(pooled[pin], args.time_scale)}")


if __name__ == "__main__":
    uvloop.run(main())
