"""What radixgate's gRPC front adds to TTFT and end-to-end latency, next to its HTTP front.

    .venv/bin/python -m loadtests.bench_overhead_grpc [--requests 1200] [--max-new-tokens 16] [--rounds 10]
        [--profile zero|llama-3.1-8b-h100]

Set-up: one simulated SGLang worker in its own process, by default with the ``zero`` profile (no
model time: what remains is transport, parsing and proxying, and every token arrives back to back,
so per-token costs add straight into e2e); radixgate (``python -m proxy serve
--grpc-port``) in its own process; this process is the client, on uvloop.

Three paths, interleaved round by round (the order rotates) so drift on a shared machine hits all
of them alike:
  direct  client → worker POST /generate (SSE)                       the baseline
  http    client → radixgate POST /generate (SSE) → worker
  grpc    client → radixgate radixgate.v1.Generation/Generate → worker
At concurrency 1 and 32, each request streams ``--max-new-tokens`` tokens. TTFT = send → first
token-bearing chunk; e2e = send → end of stream. "Added" = a path's percentile minus the direct
path's same percentile. The goal: gRPC's added TTFT and e2e within 20% of HTTP's.

Last, the transport floor: grpc.aio and aiohttp alone (no proxy), one and ``--max-new-tokens``+1
messages per call, wall and CPU per call; what a Python gRPC front cannot go below.

Every loop is bounded by a request count; the whole run by ``--time-limit-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import grpc
import psutil

from loadtests.simworker.config import SimConfig
from loadtests.simworker.fleet import Fleet
from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc

PROMPT = " ".join(f"w{i}" for i in range(64))
PATHS = ("direct", "http", "grpc")


@dataclass
class Samples:
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: int = 0
    # Messages (gRPC) or body reads (HTTP) per answer, as the client received them.
    messages: list[int] = field(default_factory=list)
    # CPU seconds radixgate's process spent while this path ran (0 for direct).
    proxy_cpu_s: float = 0.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@contextlib.asynccontextmanager
async def radixgate(worker_url: str) -> AsyncIterator[tuple[int, int, psutil.Process]]:
    """Run ``python -m proxy serve`` with a gRPC port; yield (http_port, grpc_port, its process)."""
    env = {**os.environ, "RADIXGATE_TELEMETRY__LOG_REQUESTS": "false"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--port", "0", "--admin-port", "0", "--grpc-port", "-1",
        "--worker", worker_url, "--log-level", "warning",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env=env)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        if not line.startswith("READY"):
            raise RuntimeError(f"radixgate did not start: {line!r}")
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        yield int(fields["http"].rsplit(":", 1)[1]), int(fields["grpc"]), psutil.Process(proc.pid)
    finally:
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 30)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def http_call(session: aiohttp.ClientSession, url: str, max_new_tokens: int) -> Callable[[], Awaitable[tuple[float, float, int]]]:
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True}}

    async def one() -> tuple[float, float, int]:
        t0 = time.perf_counter()
        first = 0.0
        reads = 0
        async with session.post(f"{url}/generate", json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            async for chunk in r.content.iter_any():
                reads += 1
                if not first and b"data: {" in chunk:
                    first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, reads

    return one


def grpc_call(stubs: list[pb_grpc.GenerationStub], max_new_tokens: int) -> Callable[[], Awaitable[tuple[float, float, int]]]:
    """Calls spread round-robin over ``stubs`` (one per channel: one HTTP/2 connection each)."""
    request = pb.GenerateRequest(text=PROMPT, sampling=pb.SamplingParams(max_new_tokens=max_new_tokens,
                                                                         ignore_eos=True))
    turn = itertools.count()

    async def one() -> tuple[float, float, int]:
        stub = stubs[next(turn) % len(stubs)]
        t0 = time.perf_counter()
        first = 0.0
        messages = 0
        async for chunk in stub.Generate(request, timeout=60):
            messages += 1
            if not first and chunk.token_count:
                first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, messages

    return one


async def run_batch(call: Callable[[], Awaitable[tuple[float, float, int]]], n: int, concurrency: int,
                    into: Samples) -> None:
    left = n

    async def loop() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            try:
                ttft, e2e, messages = await call()
            except (RuntimeError, aiohttp.ClientError, grpc.aio.AioRpcError):
                into.errors += 1
                continue
            into.ttft.append(ttft)
            into.e2e.append(e2e)
            into.messages.append(messages)

    await asyncio.gather(*(loop() for _ in range(concurrency)))


async def measure(args: argparse.Namespace) -> dict[str, dict[str, Samples]]:
    results: dict[str, dict[str, Samples]] = {}
    worker = SimConfig(profile=args.profile, max_running_requests=256)
    async with Fleet.subprocesses([worker]) as fleet:
        worker_url = fleet.urls[0]
        async with radixgate(worker_url) as (http_port, grpc_port, proxy_proc), aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=128), timeout=aiohttp.ClientTimeout(total=60)
        ) as session, contextlib.AsyncExitStack() as channels:
            stubs = []
            for i in range(args.grpc_channels):
                # Distinct channel args, or grpc would share one connection between the channels.
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}", options=[("bench.channel", i)])
                stubs.append(pb_grpc.GenerationStub(await channels.enter_async_context(channel)))
            calls = {
                "direct": http_call(session, worker_url, args.max_new_tokens),
                "http": http_call(session, f"http://127.0.0.1:{http_port}", args.max_new_tokens),
                "grpc": grpc_call(stubs, args.max_new_tokens),
            }
            for call in calls.values():  # warm the connection pools and the proxy before measuring
                await run_batch(call, 32, 8, Samples())
            for concurrency in (1, 32):
                per_path = {p: Samples() for p in PATHS}
                per_round = max(1, args.requests // args.rounds)
                for r in range(args.rounds):
                    order = PATHS[r % 3:] + PATHS[: r % 3]
                    for name in order:
                        before = cpu_seconds(proxy_proc)
                        await run_batch(calls[name], per_round, concurrency, per_path[name])
                        if name != "direct":
                            per_path[name].proxy_cpu_s += cpu_seconds(proxy_proc) - before
                results[f"c{concurrency}"] = per_path
    return results


def report(results: dict[str, dict[str, Samples]]) -> dict[str, object]:
    """Print the table; return it as a dict. Times in ms; cpu = radixgate's CPU ms per request;
    msgs = mean gRPC messages (HTTP: body reads) per answer."""
    out: dict[str, object] = {}
    print(f"{'conc':>4} {'path':>6} {'n':>5} {'err':>3} | {'TTFT p50':>9} {'p99':>8} | {'e2e p50':>8} {'p99':>8} |"
          f" {'+TTFT p50':>9} {'+p99':>8} | {'+e2e p50':>9} {'+p99':>8} | {'cpu':>5} {'msgs':>5}   (ms)")
    for conc, per_path in results.items():
        base = per_path["direct"]
        rows: dict[str, dict[str, float]] = {}
        for name in PATHS:
            s = per_path[name]
            row = {"n": len(s.e2e), "errors": s.errors,
                   "ttft_p50": pct(s.ttft, 50), "ttft_p99": pct(s.ttft, 99),
                   "e2e_p50": pct(s.e2e, 50), "e2e_p99": pct(s.e2e, 99)}
            for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
                row[f"added_{k}"] = row[k] - pct(base.ttft if k.startswith("ttft") else base.e2e, int(k[-2:]))
            row["proxy_cpu_ms_per_request"] = 1000 * s.proxy_cpu_s / max(1, len(s.e2e))
            row["messages_per_answer"] = statistics.mean(s.messages)
            rows[name] = row
            ms = {k: v * 1000 for k, v in row.items() if k.endswith(("_p50", "_p99"))}
            print(f"{conc[1:]:>4} {name:>6} {row['n']:>5.0f} {row['errors']:>3.0f} | {ms['ttft_p50']:9.2f} "
                  f"{ms['ttft_p99']:8.2f} | {ms['e2e_p50']:8.2f} {ms['e2e_p99']:8.2f} | "
                  f"{ms['added_ttft_p50']:9.2f} {ms['added_ttft_p99']:8.2f} | {ms['added_e2e_p50']:9.2f} "
                  f"{ms['added_e2e_p99']:8.2f} | {row['proxy_cpu_ms_per_request']:5.2f} "
                  f"{row['messages_per_answer']:5.1f}")
        ratios = {k: rows["grpc"][f"added_{k}"] / rows["http"][f"added_{k}"]
                  for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99") if rows["http"][f"added_{k}"] > 0}
        print("     grpc added / http added: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
              + "   (goal <= 1.20)")
        out[conc] = {"paths": rows, "grpc_over_http_added": ratios}
    return out


async def library_floor(messages: int, calls: int = 500) -> dict[str, float]:
    """The transports alone, no proxy: a grpc.aio server writing ``messages`` small messages per call
    vs an aiohttp SSE handler writing as many events, each read by its usual client in this process.
    Wall and CPU (client + server) per call, ms: the least any Python gRPC front can cost."""
    from aiohttp import web

    class Writer(pb_grpc.GenerationServicer):
        async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:  # type: ignore[type-arg]
            for _ in range(messages):
                await context.write(pb.GenerateResponse(text="tok ", token_count=1))

    async def sse(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(messages):
            await resp.write(b'data: {"text":"tok "}\n\n')
        await resp.write_eof()
        return resp

    server = grpc.aio.server()
    pb_grpc.add_GenerationServicer_to_server(Writer(), server)  # type: ignore[no-untyped-call]
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    app = web.Application()
    app.router.add_post("/g", sse)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    http_port = runner.addresses[0][1]
    out: dict[str, float] = {}
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, aiohttp.ClientSession() as s:
            stub = pb_grpc.GenerationStub(channel)

            async def grpc_once() -> None:
                async for _ in stub.Generate(pb.GenerateRequest(text="x")):
                    pass

            async def http_once() -> None:
                async with s.post(f"http://127.0.0.1:{http_port}/g", data=b"{}") as r:
                    async for _ in r.content:
                        pass

            for name, once in (("grpc", grpc_once), ("http", http_once)):
                await once()
                c0, t0 = time.process_time(), time.perf_counter()
                for _ in range(calls):
                    await once()
                out[f"{name}_wall_ms"] = (time.perf_counter() - t0) / calls * 1000
                out[f"{name}_cpu_ms"] = (time.process_time() - c0) / calls * 1000
    finally:
        await server.stop(0)
        await runner.cleanup()
    print(f"transport floor, {messages} messages per call, no proxy (ms per call): "
          + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1200, help="requests per path per concurrency")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per concurrency")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--grpc-channels", type=int, default=1,
                        help="client channels (HTTP/2 connections) the gRPC calls are spread over")
    parser.add_argument("--profile", default="zero",
                        help="simworker profile: zero (no model time: the harshest case, every token is "
                             "back to back) or e.g. llama-3.1-8b-h100 (real decode pacing)")
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="abort the whole run after this")
    parser.add_argument("--json", help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)
    import uvloop

    async def bounded() -> dict[str, dict[str, Samples]]:
        return await asyncio.wait_for(measure(args), args.time_limit_s)

    results = uvloop.run(bounded())
    summary = report(results)
    summary["transport_floor"] = {str(n): uvloop.run(library_floor(n)) for n in (1, args.max_new_tokens + 1)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
