"""What a proxy adds: direct vs radixgate (HTTP and gRPC) vs sglang-router vs vllm-router, same fleet, same run.

    .venv/bin/python -m loadtests.bench_overhead                 # the full table (a few minutes)
    .venv/bin/python -m loadtests.bench_overhead --quick         # fewer requests per cell
    .venv/bin/python -m loadtests.bench_overhead --profile       # radixgate under cProfile, top functions
    .venv/bin/python -m loadtests.bench_overhead --baseline DIR  # + DIR's radixgate: before/after, same load

Fleet: ``--workers`` zero-delay simulated SGLang workers (``profile="zero"``: no model physics, the
worker's own HTTP work only), each its own process. Targets, each its own process on loopback and
all started before measuring: ``direct`` (the client round-robins over the workers itself),
``radixgate`` (``python -m proxy serve``, default config, policy round_robin), ``radixgate-grpc``
(the same process, called through its gRPC front: ``radixgate.v1.Generation/Generate`` streamed,
``GenerateUnary`` not; grpc.aio client, one channel = one HTTP/2 connection per cell, as a gRPC
caller holds it), and the peer routers when installed (``pip install -e '.[bench]'``):
``sglang-router`` 0.3.2 and ``vllm-router``, both with ``--policy round_robin``.

Cells: streaming (``/generate``, 64 output tokens, one SSE event per token) and non-streaming, at
concurrency 1, 32 and 128, each cell bounded by a request count and a time cap, and run as
``--rounds`` interleaved rounds (direct, radixgate, peers, direct, …) so that load from other
processes on a shared machine lands on every target alike. Per target and
cell: TTFT p50 / p99 (time to the first SSE event or gRPC message; streams only), end-to-end p50 /
p99 (to the end of the body, or the gRPC status), requests per second, relayed events per second
(SSE events; gRPC messages, each one run of events), the target process's CPU seconds per request
(user + system, children included), and its peak resident memory. "Added" columns subtract the
direct figure of the same cell; under the table, ``radixgate-grpc``'s added latency over
``radixgate``'s (the gRPC issue's goal: at most 1.2). Results also go to
``loadtests/results/bench_overhead.json``.

Every process shares the machine (load generator included), so absolute throughput is the
machine's, and the comparison between targets is what the table is for.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import grpc
import psutil

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet

TOKENS = 64
PROMPT = "Benchmark prompt: the quick brown fox jumps over the lazy dog. " * 4
RESULTS = Path(__file__).parent / "results" / "bench_overhead.json"


@dataclass
class Cell:
    target: str
    mode: str
    concurrency: int
    requests: int = 0
    errors: int = 0
    wall_s: float = 0.0
    events: int = 0
    cpu_s: float | None = None
    rss_mb: float | None = None
    ttft: list[float] = field(default_factory=list, repr=False)
    e2e: list[float] = field(default_factory=list, repr=False)

    def pct(self, which: str, q: float) -> float | None:
        data: list[float] = sorted(getattr(self, which))
        if not data:
            return None
        return data[min(len(data) - 1, int(q * len(data)))] * 1000.0

    def add(self, ok: bool, start: float, first: float | None, end: float, events: int) -> None:
        """One request: sent at ``start``, first event (streams) at ``first``, done at ``end``."""
        if not ok:
            self.errors += 1
            return
        self.requests += 1
        self.e2e.append(end - start)
        if first is not None:
            self.ttft.append(first - start)
            self.events += events

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_ms_per_request(self) -> float | None:
        return None if self.cpu_s is None or not self.requests else self.cpu_s / self.requests * 1000.0


# -- targets ----------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def stop_processes(procs: list[asyncio.subprocess.Process], grace_s: float = 10.0) -> None:
    """SIGTERM every process still running, then SIGKILL any that outlives ``grace_s``."""
    for proc in procs:
        if proc.returncode is None:
            proc.terminate()
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class Target:
    def __init__(self, name: str, cmd: list[str] | None, urls: list[str], cwd: Path | None = None, *,
                 grpc_address: str | None = None, process_of: Target | None = None) -> None:
        self.name, self.cmd, self.urls, self.cwd = name, cmd, urls, cwd
        self.grpc_address = grpc_address  # called over gRPC instead of HTTP
        self.process_of = process_of  # another target's process serves this one (CPU, RSS)
        self.proc: asyncio.subprocess.Process | None = None
        self._ps: psutil.Process | None = None

    @property
    def ps(self) -> psutil.Process | None:
        return self.process_of.ps if self.process_of is not None else self._ps

    async def start(self, log_dir: Path) -> None:
        if self.cmd is None:
            return
        log = (log_dir / f"{self.name}.log").open("wb")
        self.proc = await asyncio.create_subprocess_exec(*self.cmd, stdout=log, stderr=log, cwd=self.cwd)
        self._ps = psutil.Process(self.proc.pid)
        await wait_serving(self.urls[0], self.proc)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def _procs(self) -> list[psutil.Process]:
        if self.ps is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [self.ps, *self.ps.children(recursive=True)]
        return []

    def cpu(self) -> float | None:
        if self.ps is None:
            return None
        total = 0.0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def rss_mb(self) -> float | None:
        if self.ps is None:
            return None
        total = 0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total / 2**20


async def wait_serving(url: str, proc: asyncio.subprocess.Process, limit_s: float = 60.0) -> None:
    """Poll until a real /generate answers 200 through the target."""
    deadline = time.monotonic() + limit_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with s.post(url + "/generate", json=body(False)) as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not serving after {limit_s} s")
            await asyncio.sleep(0.1)


def build_targets(worker_urls: list[str], *, profile_out: Path | None,
                  baseline: Path | None = None, grpc_front: bool = False) -> list[Target]:
    py = sys.executable
    targets = [Target("direct", None, worker_urls)]
    port, admin, grpc_port = free_port(), free_port(), free_port()
    rg = [py, "-m", "proxy", "serve", "--port", str(port), "--admin-port", str(admin), "--policy", "round_robin"]
    if grpc_front:
        rg += ["--grpc-port", str(grpc_port)]
    for url in worker_urls:
        rg += ["--worker", url]
    if profile_out is not None:  # CPU time, not wall time: waits for a core must not count
        runner = ("import cProfile, sys, time\n"
                  "from proxy.cli import main\n"
                  "prof = cProfile.Profile(time.process_time)\n"
                  "prof.enable()\n"
                  "try:\n    main(sys.argv[2:])\n"
                  "finally:\n    prof.disable()\n    prof.dump_stats(sys.argv[1])\n")
        rg = [py, "-c", runner, str(profile_out), *rg[3:]]
    radixgate = Target("radixgate", rg, [f"http://127.0.0.1:{port}"])
    targets.append(radixgate)
    if grpc_front:
        targets.append(Target("radixgate-grpc", None, radixgate.urls, grpc_address=f"127.0.0.1:{grpc_port}",
                              process_of=radixgate))
    if baseline is not None:  # another checkout's radixgate (``python -m proxy`` resolves from its cwd)
        port, admin = free_port(), free_port()
        base = [py, "-m", "proxy", "serve", "--port", str(port), "--admin-port", str(admin), "--policy",
                "round_robin", *(arg for url in worker_urls for arg in ("--worker", url))]
        targets.append(Target("radixgate-baseline", base, [f"http://127.0.0.1:{port}"], cwd=baseline))
    if profile_out is not None:
        return targets
    if importlib.util.find_spec("sglang_router") is not None:
        port = free_port()
        targets.append(Target("sglang-router", [
            py, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *worker_urls, "--policy", "round_robin", "--log-level", "warn",
            "--prometheus-port", str(free_port())], [f"http://127.0.0.1:{port}"]))
    vllm = shutil.which("vllm-router") or str(Path(py).parent / "vllm-router")
    if Path(vllm).exists():
        port = free_port()
        targets.append(Target("vllm-router", [
            vllm, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *worker_urls,
            "--policy", "round_robin", "--log-level", "warning", "--prometheus-port", str(free_port())],
            [f"http://127.0.0.1:{port}"]))
    return targets


# -- load ---------------------------------------------------------------------------------------------

def body(stream: bool) -> dict[str, object]:
    return {"text": PROMPT, "stream": stream,
            "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True, "temperature": 0}}


async def one(session: aiohttp.ClientSession, url: str, payload: bytes, stream: bool, cell: Cell) -> None:
    start = time.perf_counter()
    first: float | None = None
    events = 0
    try:
        async with session.post(url + "/generate", data=payload,
                                headers={"Content-Type": "application/json"}) as r:
            if stream:
                async for chunk in r.content.iter_any():
                    if first is None:
                        first = time.perf_counter()
                    events += chunk.count(b"data: ")
            else:
                await r.read()
            ok = r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    cell.add(ok, start, first, time.perf_counter(), events)


def grpc_request() -> pb.GenerateRequest:
    return pb.GenerateRequest(text=PROMPT, sampling=pb.SamplingParams(
        max_new_tokens=TOKENS, ignore_eos=True, temperature=0))


async def one_grpc(stub: pb_grpc.GenerationStub, request: pb.GenerateRequest, stream: bool, cell: Cell) -> None:
    start = time.perf_counter()
    first: float | None = None
    messages = 0
    try:
        if stream:
            async for _ in stub.Generate(request, timeout=60):
                if first is None:
                    first = time.perf_counter()
                messages += 1
        else:
            await stub.GenerateUnary(request, timeout=60)
        ok = True
    except grpc.aio.AioRpcError:
        ok = False
    cell.add(ok, start, first, time.perf_counter(), messages)


@contextlib.asynccontextmanager
async def client(target: Target, stream: bool, concurrency: int, cell: Cell) -> AsyncIterator[
        Callable[[int], Awaitable[None]]]:
    """One call of ``cell``'s kind against ``target``, given the call's sequence number."""
    if target.grpc_address is not None:
        request = grpc_request()
        async with grpc.aio.insecure_channel(target.grpc_address) as channel:
            # The generated stubs carry no annotations (grpcio-tools writes no .pyi for services).
            stub = pb_grpc.GenerationStub(channel)  # type: ignore[no-untyped-call]
            yield lambda _: one_grpc(stub, request, stream, cell)
        return
    payload = json.dumps(body(stream)).encode()
    urls = target.urls
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield lambda i: one(session, urls[i % len(urls)], payload, stream, cell)


async def run_cell(target: Target, mode: str, concurrency: int, count: int, cap_s: float) -> Cell:
    cell = Cell(target.name, mode, concurrency)
    issued = 0
    async with client(target, mode == "stream", concurrency, cell) as call:
        deadline = time.perf_counter() + cap_s

        async def loop() -> None:
            nonlocal issued
            while issued < count and time.perf_counter() < deadline:
                issued += 1
                await call(issued - 1)

        rss_peak = 0.0

        async def sample_rss() -> None:
            nonlocal rss_peak
            while True:
                rss_peak = max(rss_peak, target.rss_mb() or 0.0)
                await asyncio.sleep(0.1)

        sampler = asyncio.ensure_future(sample_rss())
        cpu0 = target.cpu()
        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(concurrency)))
        cell.wall_s = time.perf_counter() - t0
        cpu1 = target.cpu()
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    if cpu0 is not None and cpu1 is not None:
        cell.cpu_s = cpu1 - cpu0
    cell.rss_mb = rss_peak or None
    return cell


def merge(into: Cell, part: Cell) -> None:
    into.requests += part.requests
    into.errors += part.errors
    into.wall_s += part.wall_s
    into.events += part.events
    into.ttft += part.ttft
    into.e2e += part.e2e
    if part.cpu_s is not None:
        into.cpu_s = (into.cpu_s or 0.0) + part.cpu_s
    if part.rss_mb is not None:
        into.rss_mb = max(into.rss_mb or 0.0, part.rss_mb)


# -- report ---------------------------------------------------------------------------------------------

def fmt(v: float | None, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def added(v: float | None, base: float | None) -> str:
    return "—" if v is None or base is None else f"{v - base:+.1f}"


def table(cells: Sequence[Cell]) -> str:
    direct = {(c.mode, c.concurrency): c for c in cells if c.target == "direct"}
    lines = [
        "| mode | conc | target | TTFT p50 / p99 ms | added TTFT p50 / p99 | e2e p50 / p99 ms | added e2e p50 / p99 "
        "| req/s | events/s | CPU ms/req | RSS MB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in cells:
        d = direct.get((c.mode, c.concurrency))
        dt = (d.pct("ttft", .5), d.pct("ttft", .99)) if d else (None, None)
        de = (d.pct("e2e", .5), d.pct("e2e", .99)) if d else (None, None)
        t50, t99, e50, e99 = c.pct("ttft", .5), c.pct("ttft", .99), c.pct("e2e", .5), c.pct("e2e", .99)
        is_direct = c.target == "direct"
        lines.append(
            f"| {c.mode} | {c.concurrency} | {c.target} | {fmt(t50)} / {fmt(t99)} | "
            f"{'' if is_direct else added(t50, dt[0]) + ' / ' + added(t99, dt[1])} | {fmt(e50)} / {fmt(e99)} | "
            f"{'' if is_direct else added(e50, de[0]) + ' / ' + added(e99, de[1])} | {c.rps:.0f} | "
            f"{(c.events / c.wall_s if c.wall_s and c.events else 0):.0f} | {fmt(c.cpu_ms_per_request, 2)} | "
            f"{fmt(c.rss_mb, 0)} | {c.errors} |")
    return "\n".join(lines)


def grpc_over_http(cells: Sequence[Cell]) -> dict[str, dict[str, float | None]]:
    """Per cell, radixgate-grpc's added latency over radixgate's (HTTP): the gRPC issue's measure."""
    by_key = {(c.target, c.mode, c.concurrency): c for c in cells}
    out: dict[str, dict[str, float | None]] = {}
    for c in cells:
        if c.target != "radixgate-grpc":
            continue
        http, direct = by_key.get(("radixgate", c.mode, c.concurrency)), by_key.get(("direct", c.mode, c.concurrency))
        if http is None or direct is None:
            continue
        ratios: dict[str, float | None] = {}
        for which in ("ttft", "e2e"):
            for q in (.5, .99):
                base, g, h = direct.pct(which, q), c.pct(which, q), http.pct(which, q)
                key = f"{which}_p{round(q * 100)}"
                if base is None or g is None or h is None or h - base <= 0:
                    ratios[key] = None  # HTTP added nothing measurable: no ratio
                else:
                    ratios[key] = (g - base) / (h - base)
        out[f"{c.mode} c={c.concurrency}"] = ratios
    return out


@contextlib.asynccontextmanager
async def running(targets: list[Target], log_dir: Path) -> AsyncIterator[list[Target]]:
    try:
        for t in targets:
            await t.start(log_dir)
        yield targets
    finally:
        for t in targets:
            await t.stop()


async def main_async(args: argparse.Namespace) -> None:
    counts = {1: 60, 32: 400, 128: 800} if args.quick else {1: 200, 32: 1500, 128: 3000}
    counts = {c: counts.get(c, 1000) for c in args.concurrency}
    log_dir = RESULTS.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    profile_out = Path(tempfile.gettempdir()) / "radixgate_bench.prof" if args.profile else None
    configs = [SimConfig(profile="zero", max_running_requests=1024)] * args.workers
    wanted = {"direct", "radixgate-baseline", *args.targets}
    if "radixgate-grpc" in wanted:
        wanted.add("radixgate")  # its process serves the gRPC front
    async with Fleet.subprocesses(configs) as fleet, \
            running([t for t in build_targets(fleet.urls, profile_out=profile_out, baseline=args.baseline,
                                              grpc_front="radixgate-grpc" in wanted)
                     if t.name in wanted], log_dir) as targets:
        print(f"targets: {', '.join(t.name for t in targets)}; workers: {fleet.urls}", flush=True)
        for t in targets:  # warm every connection pool and code path
            await run_cell(t, "stream", 8, 64, 10)
        cells: list[Cell] = []
        for mode in args.modes:
            for conc in args.concurrency:
                merged = {t.name: Cell(t.name, mode, conc) for t in targets}
                for _ in range(args.rounds):  # interleaved rounds: load from elsewhere hits all alike
                    for t in targets:
                        merge(merged[t.name], await run_cell(t, mode, conc, counts[conc] // args.rounds,
                                                             args.cap_s / args.rounds))
                for t in targets:
                    cell = merged[t.name]
                    cells.append(cell)
                    print(f"  {mode:10} c={conc:<3} {t.name:14} {cell.requests:5} req in {cell.wall_s:5.1f} s "
                          f"ttft p50 {fmt(cell.pct('ttft', .5))} ms  e2e p50 {fmt(cell.pct('e2e', .5))} ms  "
                          f"cpu {fmt(cell.cpu_ms_per_request, 2)} ms/req  rss {fmt(cell.rss_mb, 0)} MB", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} " \
              f"{platform.python_version()}, {platform.system()} {platform.release()}"
    print(f"\nmachine: {machine}; workers: {args.workers} zero-delay simworkers; {TOKENS}-token responses\n")
    print(table(cells))
    ratios = grpc_over_http(cells)
    for key, r in ratios.items():
        print(f"radixgate-grpc added / radixgate added, {key}: " + ", ".join(
            f"{k} {fmt(v, 2)}" for k, v in r.items()) + "   (goal <= 1.20)")
    if not args.profile:
        RESULTS.write_text(json.dumps({"machine": machine, "workers": args.workers, "tokens": TOKENS,
                                       "grpc_added_over_http_added": ratios,
                                       "cells": [{**asdict(c), "ttft": None, "e2e": None,
                                                  "ttft_p50_ms": c.pct("ttft", .5), "ttft_p99_ms": c.pct("ttft", .99),
                                                  "e2e_p50_ms": c.pct("e2e", .5), "e2e_p99_ms": c.pct("e2e", .99),
                                                  "rps": c.rps, "cpu_ms_per_request": c.cpu_ms_per_request}
                                                 for c in cells]}, indent=1))
    if profile_out is not None and profile_out.exists():
        import pstats

        pstats.Stats(str(profile_out)).sort_stats(args.sort).print_stats(40)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer requests per cell")
    parser.add_argument("--cap-s", type=float, default=12.0, help="time cap per cell and target, seconds")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per cell")
    parser.add_argument("--profile", action="store_true", help="only direct + radixgate, radixgate under cProfile")
    parser.add_argument("--targets", nargs="+", default=["radixgate", "radixgate-grpc", "sglang-router", "vllm-router"],
                        help="which proxies to measure (direct is always measured; radixgate-grpc runs radixgate too)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also run the radixgate of another checkout (e.g. `git worktree` of the last "
                             "commit) as target radixgate-baseline: before/after under the same load")
    parser.add_argument("--sort", default="tottime", help="pstats sort key for --profile")
    parser.add_argument("--modes", nargs="+", default=["stream", "non-stream"], choices=["stream", "non-stream"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 32, 128])
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(main_async(args))


if __name__ == "__main__":
    main()
