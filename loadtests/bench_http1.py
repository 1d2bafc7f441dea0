"""Why radixgate owns an HTTP/1.1 client: ``proxy/workers/http1.py`` against aiohttp's, same streams.

    .venv/bin/python -m loadtests.bench_http1 [--requests 400] [--tokens 64] [--concurrency 1,16]

One simulated SGLang worker (``zero`` profile: no model time, so what remains is client and
worker work) in its own process; this process reads the same streamed ``/generate`` answers
(``--tokens`` SSE events each, one HTTP chunk per event) through the two clients in turn, warm-up
first, order alternated over ``--rounds``. Printed per client and concurrency: this process's CPU
per request (``time.process_time``: the client's cost, which is what the proxy pays per upstream
stream) and the wall time per request. Every loop is bounded by ``--requests``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import aiohttp

from proxy.workers.http1_pool import Http1Pool


async def start_worker() -> tuple[str, asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy.sim", "--port", "0", "--profile", "zero",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    return line.split()[1], proc


def body(tokens: int, i: int) -> bytes:
    return json.dumps({"text": f"request {i} " + "word " * 64, "stream": True,
                       "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}).encode()


async def via_http1(pool: Http1Pool, tokens: int, i: int) -> int:
    conn = await pool.request("/generate", body(tokens, i), {"Content-Type": "application/json"})
    got = 0
    try:
        while chunk := await conn.readany():
            got += chunk.count(b"data:")
    finally:
        pool.release(conn)
    return got


async def via_aiohttp(session: aiohttp.ClientSession, url: str, tokens: int, i: int) -> int:
    got = 0
    async with session.post(url + "/generate", data=body(tokens, i),
                            headers={"Content-Type": "application/json"}) as resp:
        async for chunk in resp.content.iter_any():
            got += chunk.count(b"data:")
    return got


async def run(client: str, url: str, requests: int, tokens: int, concurrency: int) -> tuple[float, float]:
    """(CPU ms per request in this process, wall ms per request)."""
    pool = Http1Pool(url, limit=concurrency, keepalive_s=30, connect_timeout_s=5, idle_timeout_s=30)
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency))
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with sem:
            if client == "http1":
                return await via_http1(pool, tokens, i)
            return await via_aiohttp(session, url, tokens, i)

    try:
        await asyncio.gather(*(one(-1 - i) for i in range(concurrency)))  # warm connections
        cpu0, wall0 = time.process_time(), time.perf_counter()
        events = await asyncio.gather(*(one(i) for i in range(requests)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        pool.close()
        await session.close()
    assert min(events) >= tokens, f"{client}: a stream ended early ({min(events)} events)"
    return cpu / requests * 1e3, wall / requests * 1e3


async def main_async(a: argparse.Namespace) -> None:
    url, proc = await start_worker()
    try:
        print(f"one simulated worker (zero profile) at {url}; {a.requests} streams of {a.tokens} tokens per cell; "
              f"{a.rounds} rounds, order alternated; CPU = this process (the client)")
        for c in (int(x) for x in a.concurrency.split(",")):
            cells: dict[str, list[tuple[float, float]]] = {"http1": [], "aiohttp": []}
            for r in range(a.rounds):
                for client in (("http1", "aiohttp") if r % 2 == 0 else ("aiohttp", "http1")):
                    cells[client].append(await run(client, url, a.requests, a.tokens, c))
            h, o = (statistics.median(x[0] for x in cells[k]) for k in ("http1", "aiohttp"))
            hw, ow = (statistics.median(x[1] for x in cells[k]) for k in ("http1", "aiohttp"))
            spread = {k: f"{min(x[0] for x in v):.3f}-{max(x[0] for x in v):.3f}" for k, v in cells.items()}
            print(f"concurrency {c:>3}: CPU/request http1 {h:.3f} ms ({spread['http1']}), aiohttp {o:.3f} ms "
                  f"({spread['aiohttp']}) -> http1/aiohttp {h / o:.2f}x; wall/request {hw:.2f} vs {ow:.2f} ms")
    finally:
        proc.terminate()
        await proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    import uvloop

    uvloop.run(main_async(a))


if __name__ == "__main__":
    main()
