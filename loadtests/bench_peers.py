"""What sharing decisions between replicas (``routing.peers``) costs, and how fast it is.

    .venv/bin/python -m loadtests.bench_peers [--requests 1200] [--concurrency 32] [--probes 50]

Set-up: two simulated SGLang workers (``zero`` profile: no model time, so what remains is proxy
work) in their own processes; two radixgate processes (``python -m proxy serve``, policy ttft) in
front of both, run twice: sharing nothing, then each with ``--peer`` naming the other's admin port.
This process is the client (uvloop, aiohttp), sending each request to the two proxies in turn.

Reported per run: client TTFT p50/p99 of 16-token streams at ``--concurrency``, the proxies' CPU
per request (both processes, psutil) and the peer POSTs they made. Then the delivery delay: with
no other traffic, one request to proxy A, and from the moment A's answer headers arrive, B's
``/metrics`` is polled until its applied-decisions counter moves. A posts as soon as it has
routed, so the POST is under way before the answer starts; the figure includes one /metrics poll
(~1-2 ms). Every loop is bounded by a count and the run by ``--time-limit-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence

import aiohttp
import psutil
import uvloop

from loadtests.bench_overhead import free_port
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet

PROMPT = " ".join(f"w{i}" for i in range(256))


@contextlib.asynccontextmanager
async def proxies(workers: Sequence[str], *, peers: bool) -> AsyncIterator[list[tuple[int, int, psutil.Process]]]:
    """Two ``proxy serve`` processes; yields [(http port, admin port, process)]."""
    admin = [free_port(), free_port()]
    env = {**os.environ, "RADIXGATE_TELEMETRY__LOG_REQUESTS": "false"}
    procs = []
    try:
        for i in range(2):
            args = ["--port", "0", "--admin-port", str(admin[i]), "--policy", "ttft", "--log-level", "warning"]
            args += [a for w in workers for a in ("--worker", w)]
            if peers:
                args += ["--peer", f"http://127.0.0.1:{admin[1 - i]}"]
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "proxy", "serve", *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env))
        out = []
        for proc, port in zip(procs, admin, strict=True):
            assert proc.stdout is not None
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            if not line.startswith("READY"):
                raise RuntimeError(f"radixgate did not start: {line!r}")
            fields = dict(part.split("=", 1) for part in line.split()[1:])
            out.append((int(fields["http"].rsplit(":", 1)[1]), port, psutil.Process(proc.pid)))
        yield out
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 30)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def stream(session: aiohttp.ClientSession, port: int, tag: int) -> float:
    """One 16-token stream; its TTFT in seconds."""
    body = {"text": f"{tag} {PROMPT}", "stream": True, "sampling_params": {"max_new_tokens": 16}}
    start = time.perf_counter()
    ttft = 0.0
    async with session.post(f"http://127.0.0.1:{port}/generate", json=body) as r:
        r.raise_for_status()
        async for _ in r.content.iter_any():
            if not ttft:
                ttft = time.perf_counter() - start
    return ttft


async def counter(session: aiohttp.ClientSession, admin: int, name: str, **labels: str) -> float:
    async with session.get(f"http://127.0.0.1:{admin}/metrics") as r:
        text = await r.text()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def load(session: aiohttp.ClientSession, ports: list[int], requests: int, concurrency: int,
               deadline: float) -> list[float]:
    ttfts: list[float] = []
    next_tag = iter(range(requests))

    async def client() -> None:
        for tag in next_tag:
            if time.monotonic() > deadline:
                return
            ttfts.append(await stream(session, ports[tag % 2], tag))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return ttfts


async def delivery_delays(session: aiohttp.ClientSession, a: tuple[int, int, psutil.Process],
                          b: tuple[int, int, psutil.Process], probes: int, deadline: float) -> list[float]:
    delays = []
    for i in range(probes):
        before = await counter(session, b[1], "radixgate_peer_decisions_received_total", outcome="applied")
        body = {"text": f"probe {i} {PROMPT}", "stream": True, "sampling_params": {"max_new_tokens": 1}}
        async with session.post(f"http://127.0.0.1:{a[0]}/generate", json=body) as r:
            start = time.perf_counter()
            for _ in range(1000):  # bounded: ~1 s at most
                if await counter(session, b[1], "radixgate_peer_decisions_received_total", outcome="applied") > before:
                    delays.append(time.perf_counter() - start)
                    break
            await r.read()
        if time.monotonic() > deadline:
            break
    return delays


async def run(args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.time_limit_s
    async with Fleet.subprocesses([SimConfig(profile="zero")] * 2) as fleet, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        for peers in (False, True):
            async with proxies(fleet.urls, peers=peers) as procs:
                ports = [p[0] for p in procs]
                await load(session, ports, 64, 8, deadline)  # warm-up
                cpu0 = sum(p[2].cpu_times().user + p[2].cpu_times().system for p in procs)
                ttfts = sorted(await load(session, ports, args.requests, args.concurrency, deadline))
                cpu = sum(p[2].cpu_times().user + p[2].cpu_times().system for p in procs) - cpu0
                posts = sum([await counter(session, p[1], "radixgate_peer_messages_total") for p in procs])
                print(f"{'peers' if peers else 'sharing nothing':16s} {len(ttfts)} streams at c={args.concurrency}: "
                      f"TTFT p50 {ttfts[len(ttfts) // 2] * 1e3:.2f} ms p99 {ttfts[int(len(ttfts) * 0.99)] * 1e3:.2f} ms; "
                      f"proxy CPU {cpu / len(ttfts) * 1e3:.3f} ms/request; peer messages {posts:.0f}", flush=True)
                if peers:
                    delays = sorted(await delivery_delays(session, procs[0], procs[1], args.probes, deadline))
                    polls = []
                    for _ in range(20):
                        start = time.perf_counter()
                        await counter(session, procs[1][1], "radixgate_peer_decisions_received_total")
                        polls.append(time.perf_counter() - start)
                    print(f"one /metrics poll of B: p50 {statistics.median(polls) * 1e3:.2f} ms")
                    if delays:
                        print(f"delivery A -> B (answer headers -> B's counter moved, {len(delays)} probes): p50 {statistics.median(delays) * 1e3:.2f} ms, "
                              f"p90 {delays[int(len(delays) * 0.9)] * 1e3:.2f} ms, max {delays[-1] * 1e3:.2f} ms")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1200)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--probes", type=int, default=50)
    ap.add_argument("--time-limit-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
