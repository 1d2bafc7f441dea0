"""What radixgate's gRPC front adds to TTFT and end-to-end latency, next to its HTTP front.

    .venv/bin/python -m loadtests.bench_overhead_grpc [--requests 1200] [--max-new-tokens 16] [--rounds 10]
        [--profile zero|llama-3.1-8b-h100] [--sync-client] [--no-floor]

Set-up: one simulated SGLang worker in its own process, by default with the ``zero`` profile (no
model time: what remains is transport, parsing and proxying, and every token arrives back to back,
so per-token costs add straight into e2e); radixgate (``python -m proxy serve
--grpc-port``) in its own process; this process is the client, on uvloop.

Paths, interleaved round by round (the order rotates) so drift on a shared machine hits all alike:
  direct   client → worker POST /generate (SSE)                        the baseline
  http     client → radixgate POST /generate (SSE) → worker
  grpc     client (grpc.aio) → radixgate radixgate.v1.Generation/Generate → worker
  grpc-st  (--sync-client) the same call from the sync stack with SingleThreadedUnaryStream, one
           thread per concurrent call: a client choice (grpc.aio ignores that option)
At concurrency 1 and 32, each request streams ``--max-new-tokens`` tokens. TTFT = send → first
token-bearing chunk; e2e = send → end of stream. "Added" = a path's percentile minus the direct
path's same percentile. The goal: gRPC's added TTFT and e2e within 20% of HTTP's. Per path: ``cpu``
= radixgate's CPU ms per request; ``pTTFT`` = radixgate's own mean TTFT (received → first token
from the worker, its ``radixgate_ttft_seconds``), so TTFT minus pTTFT is what the transport and the
client add around the proxy; ``msgs`` = gRPC messages (HTTP: body reads) per answer.

Last, the transport floor without any proxy (``loadtests/bench_grpc_floor.py``, the server in a
child process): what a Python gRPC front cannot go below, and what a fast client would still pay.

Every loop is bounded by a request count; the whole run by ``--time-limit-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
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

from loadtests.bench_grpc_floor import SINGLE_THREADED, cpu_seconds, transport_floor
from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet

PROMPT = " ".join(f"w{i}" for i in range(64))
FRONTEND = {"http": "http", "grpc": "grpc", "grpc-st": "grpc"}  # path → radixgate's frontend label
Call = Callable[[], Awaitable[tuple[float, float, int]]]


@dataclass
class Samples:
    ttft: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
    errors: int = 0
    # Messages (gRPC) or body reads (HTTP) per answer, as the client received them.
    messages: list[int] = field(default_factory=list)
    # CPU seconds radixgate's process spent while this path ran (0 for direct).
    proxy_cpu_s: float = 0.0
    # radixgate's own TTFT (sum of seconds, count) over this path's requests.
    proxy_ttft_s: float = 0.0
    proxy_ttft_n: int = 0


@dataclass
class Proxy:
    http_port: int
    grpc_port: int
    admin_port: int
    process: psutil.Process


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


@contextlib.asynccontextmanager
async def radixgate(worker_url: str) -> AsyncIterator[Proxy]:
    """Run ``python -m proxy serve`` with a gRPC port."""
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
        yield Proxy(int(fields["http"].rsplit(":", 1)[1]), int(fields["grpc"]),
                    int(fields["admin"].rsplit(":", 1)[1]), psutil.Process(proc.pid))
    finally:
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 30)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def proxy_ttft(session: aiohttp.ClientSession, admin_port: int, frontend: str) -> tuple[float, int]:
    """(sum of seconds, count) of radixgate_ttft_seconds for ``frontend``, over all workers."""
    async with session.get(f"http://127.0.0.1:{admin_port}/metrics") as r:
        text = await r.text()
    total, count = 0.0, 0
    for line in text.splitlines():
        if f'frontend="{frontend}"' not in line:
            continue
        if line.startswith("radixgate_ttft_seconds_sum{"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("radixgate_ttft_seconds_count{"):
            count += int(float(line.rsplit(" ", 1)[1]))
    return total, count


def http_call(session: aiohttp.ClientSession, url: str, max_new_tokens: int) -> Call:
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


def grpc_request(max_new_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(text=PROMPT, sampling=pb.SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))


def grpc_call(stubs: list[pb_grpc.GenerationStub], max_new_tokens: int) -> Call:
    """Calls spread round-robin over ``stubs`` (one per channel: one HTTP/2 connection each)."""
    request = grpc_request(max_new_tokens)
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


def grpc_sync_call(stub: pb_grpc.GenerationStub, pool: concurrent.futures.Executor, max_new_tokens: int) -> Call:
    """The same call from grpc's sync stack (a thread per concurrent call)."""
    request = grpc_request(max_new_tokens)

    def blocking() -> tuple[float, float, int]:
        t0 = time.perf_counter()
        first = 0.0
        messages = 0
        for chunk in stub.Generate(request, timeout=60):
            messages += 1
            if not first and chunk.token_count:
                first = time.perf_counter()
        return first - t0, time.perf_counter() - t0, messages

    async def one() -> tuple[float, float, int]:
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, blocking)
        except grpc.RpcError as e:
            raise RuntimeError(f"gRPC {e}") from e

    return one


async def run_batch(call: Call, n: int, concurrency: int, into: Samples) -> None:
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
    paths = ["direct", "http", "grpc"] + (["grpc-st"] if args.sync_client else [])
    worker = SimConfig(profile=args.profile, max_running_requests=256)
    async with Fleet.subprocesses([worker]) as fleet:
        worker_url = fleet.urls[0]
        async with radixgate(worker_url) as proxy, aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=128), timeout=aiohttp.ClientTimeout(total=60)
        ) as session, contextlib.AsyncExitStack() as stack:
            stubs = []
            target = f"127.0.0.1:{proxy.grpc_port}"
            for i in range(args.grpc_channels):
                # Distinct channel args, or grpc would share one connection between the channels.
                channel = grpc.aio.insecure_channel(target, options=[("bench.channel", i)])
                # The generated stubs carry no annotations (grpcio-tools writes no .pyi for services).
                stubs.append(pb_grpc.GenerationStub(await stack.enter_async_context(channel)))  # type: ignore[no-untyped-call]
            calls = {
                "direct": http_call(session, worker_url, args.max_new_tokens),
                "http": http_call(session, f"http://127.0.0.1:{proxy.http_port}", args.max_new_tokens),
                "grpc": grpc_call(stubs, args.max_new_tokens),
            }
            if args.sync_client:
                sync_channel = stack.enter_context(grpc.insecure_channel(target, options=SINGLE_THREADED))
                pool = stack.enter_context(concurrent.futures.ThreadPoolExecutor(32))
                stub = pb_grpc.GenerationStub(sync_channel)  # type: ignore[no-untyped-call]  # generated, unannotated
                calls["grpc-st"] = grpc_sync_call(stub, pool, args.max_new_tokens)
            for name in paths:  # warm the connection pools and the proxy before measuring
                await run_batch(calls[name], 32, 8, Samples())
            for concurrency in (1, 32):
                per_path = {p: Samples() for p in paths}
                per_round = max(1, args.requests // args.rounds)
                for r in range(args.rounds):
                    for name in paths[r % len(paths):] + paths[: r % len(paths)]:
                        s = per_path[name]
                        if name == "direct":
                            await run_batch(calls[name], per_round, concurrency, s)
                            continue
                        cpu0, ttft0 = cpu_seconds(proxy.process), await proxy_ttft(session, proxy.admin_port,
                                                                                   FRONTEND[name])
                        await run_batch(calls[name], per_round, concurrency, s)
                        s.proxy_cpu_s += cpu_seconds(proxy.process) - cpu0
                        ttft1 = await proxy_ttft(session, proxy.admin_port, FRONTEND[name])
                        s.proxy_ttft_s += ttft1[0] - ttft0[0]
                        s.proxy_ttft_n += ttft1[1] - ttft0[1]
                results[f"c{concurrency}"] = per_path
    return results


def report(results: dict[str, dict[str, Samples]]) -> dict[str, object]:
    """Print the table; return it as a dict. Times in ms."""
    out: dict[str, object] = {}
    print(f"{'conc':>4} {'path':>7} {'n':>5} {'err':>3} | {'TTFT p50':>8} {'p99':>7} | {'e2e p50':>7} {'p99':>7} |"
          f" {'+TTFT p50':>9} {'+p99':>7} | {'+e2e p50':>8} {'+p99':>7} | {'cpu':>5} {'pTTFT':>6} {'msgs':>5}  (ms)")
    for conc, per_path in results.items():
        base = per_path["direct"]
        rows: dict[str, dict[str, float]] = {}
        for name, s in per_path.items():
            row = {"n": len(s.e2e), "errors": s.errors,
                   "ttft_p50": pct(s.ttft, 50), "ttft_p99": pct(s.ttft, 99),
                   "e2e_p50": pct(s.e2e, 50), "e2e_p99": pct(s.e2e, 99)}
            for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99"):
                row[f"added_{k}"] = row[k] - pct(base.ttft if k.startswith("ttft") else base.e2e, int(k[-2:]))
            row["proxy_cpu_ms_per_request"] = 1000 * s.proxy_cpu_s / max(1, len(s.e2e))
            row["proxy_ttft_ms_mean"] = 1000 * s.proxy_ttft_s / max(1, s.proxy_ttft_n)
            row["messages_per_answer"] = statistics.mean(s.messages)
            rows[name] = row
            ms = {k: v * 1000 for k, v in row.items() if k.endswith(("_p50", "_p99"))}
            print(f"{conc[1:]:>4} {name:>7} {row['n']:>5.0f} {row['errors']:>3.0f} | {ms['ttft_p50']:8.2f} "
                  f"{ms['ttft_p99']:7.2f} | {ms['e2e_p50']:7.2f} {ms['e2e_p99']:7.2f} | "
                  f"{ms['added_ttft_p50']:9.2f} {ms['added_ttft_p99']:7.2f} | {ms['added_e2e_p50']:8.2f} "
                  f"{ms['added_e2e_p99']:7.2f} | {row['proxy_cpu_ms_per_request']:5.2f} "
                  f"{row['proxy_ttft_ms_mean']:6.2f} {row['messages_per_answer']:5.1f}")
        ratios: dict[str, dict[str, float]] = {}
        for name in (p for p in rows if p.startswith("grpc")):
            ratios[name] = {k: rows[name][f"added_{k}"] / rows["http"][f"added_{k}"]
                            for k in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99") if rows["http"][f"added_{k}"] > 0}
            print(f"     {name} added / http added: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios[name].items())
                  + "   (goal <= 1.20)")
        out[conc] = {"paths": rows, "over_http_added": ratios}
    return out


def transport_bound(paths: dict[str, dict[str, float]], floor: dict[str, dict[str, float]],
                    most: int) -> dict[str, float]:
    """The lowest gRPC / HTTP ratio of added latency at concurrency 1 that this machine's transports
    allow: HTTP's added latency plus what a bare gRPC call costs over a bare HTTP call with as many
    messages (the floor, no proxy; linear between 1 and ``most`` messages), over HTTP's added latency.
    A first-order estimate: it assumes radixgate's own work behind either front costs the same."""

    def wall(kind: str, messages: float) -> float:
        one = floor[f"{kind}/m1/c1"]["wall_ms"]
        many = floor[f"{kind}/m{most}/c1"]["wall_ms"]
        return one + (many - one) * (min(messages, most) - 1) / (most - 1)

    http, grpc_path = paths["http"], paths["grpc"]
    gap_first = (wall("grpc/aio", 1) - wall("http/aiohttp", 1)) / 1000
    gap_all = (wall("grpc/aio", grpc_path["messages_per_answer"]) - wall("http/aiohttp", grpc_path["messages_per_answer"])) / 1000
    out = {"ttft_p50": (http["added_ttft_p50"] + gap_first) / http["added_ttft_p50"],
           "e2e_p50": (http["added_e2e_p50"] + gap_all) / http["added_e2e_p50"]}
    print(f"transport bound, c=1: a gRPC front adding nothing over HTTP's path would still be at "
          f"ttft_p50 {out['ttft_p50']:.2f}, e2e_p50 {out['e2e_p50']:.2f} of HTTP's added latency "
          f"(bare gRPC call - bare HTTP call: {gap_first * 1000:.2f} ms with 1 message, {gap_all * 1000:.2f} ms "
          f"with {grpc_path['messages_per_answer']:.1f})   (goal <= 1.20)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1200, help="requests per path per concurrency")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per concurrency")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--grpc-channels", type=int, default=1,
                        help="client channels (HTTP/2 connections) the gRPC calls are spread over")
    parser.add_argument("--sync-client", action="store_true",
                        help="add the grpc-st path: grpc's sync stack with SingleThreadedUnaryStream")
    parser.add_argument("--profile", default="zero",
                        help="simworker profile: zero (no model time: the harshest case, every token is "
                             "back to back) or e.g. llama-3.1-8b-h100 (real decode pacing)")
    parser.add_argument("--no-floor", action="store_true", help="skip the transport floor")
    parser.add_argument("--time-limit-s", type=float, default=600.0, help="abort the whole run after this")
    parser.add_argument("--json", help="also write the summary as JSON to this file")
    args = parser.parse_args(argv)
    import uvloop

    async def bounded() -> dict[str, dict[str, Samples]]:
        return await asyncio.wait_for(measure(args), args.time_limit_s)

    results = uvloop.run(bounded())
    summary = report(results)
    if not args.no_floor:
        floor = uvloop.run(transport_floor((1, args.max_new_tokens + 1)))
        summary["transport_floor"] = floor
        c1 = summary.get("c1")
        if isinstance(c1, dict):
            summary["transport_bound"] = transport_bound(c1["paths"], floor, args.max_new_tokens + 1)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
