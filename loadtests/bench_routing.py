"""Routing policies side by side on one simulated fleet (issue 4, "Measure").

    python -m loadtests.bench_routing --workload shared_prefix --rates 8,16 \\
        --routers ttft,least_load,round_robin,consistent_hash,cache_aware,sglang-router

For each workload, rate and router: flush the fleet's caches, start the router in front of it
(radixgate as ``python -m proxy serve --config ...``, one process per replica; the real
``sglang-router`` as ``python -m sglang_router.launch_router``), send the workload open-loop
with Poisson arrivals (same seed, same trace for every router), stream every response and
report, in *simulated* seconds (wall x time scale):
TTFT p50/p95/p99, inter-token p95 (chunk gap / tokens in the chunk), end-to-end p95, throughput
(completed requests per second), goodput (requests per second whose TTFT met the SLO), prefix
hit rate captured (sum of reported cached tokens / prompt tokens) against available (what one
LRU cache of the fleet's total KV capacity, fed the same trace in arrival order, would hold),
imbalance (max / mean requests per worker, from the workers' own counters), and for radixgate
how many workers each prompt group touched (from its request log).

Caveat: wall-clock proxy costs are multiplied by the time scale too, which penalises Python
proxies against the Rust sglang-router; keep the scale small (default 4).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import socket
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from loadtests.arrivals import poisson_times
from loadtests.simworker.config import SimConfig
from loadtests.simworker.fleet import Fleet
from loadtests.workloads import WORKLOADS, RequestSpec
from proxy.request import Dialect, GenerateRequest
from proxy.routing.prefix_index import FleetCache
from proxy.routing.prefix_key import build_route_request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RADIXGATE_POLICIES = ("ttft", "least_load", "round_robin", "consistent_hash", "cache_aware")


@dataclass
class Sample:
    group: str
    sent: float
    first: float | None = None
    done: float | None = None
    gaps: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ok: bool = False


# -- one request --------------------------------------------------------------------------------

async def send(session: aiohttp.ClientSession, base: str, spec: RequestSpec, rid: str, interval: int) -> Sample:
    s = Sample(spec.group, time.perf_counter())
    if spec.messages is not None:
        url, body = f"{base}/v1/chat/completions", {
            "model": MODEL, "messages": spec.messages, "max_tokens": spec.max_new_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "rid": rid}
    else:
        url, body = f"{base}/generate", {
            "text": spec.text, "stream": True, "rid": rid,
            "sampling_params": {"max_new_tokens": spec.max_new_tokens, "ignore_eos": True}}
    last_at, last_tokens = 0.0, 0
    try:
        async with session.post(url, json=body) as resp:
            if resp.status != 200:
                await resp.read()
                return s
            async for line in resp.content:
                if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.perf_counter()
                event = json.loads(line[5:])
                tokens = _tokens_so_far(event, last_tokens, interval)
                if tokens > last_tokens:
                    if s.first is None:
                        s.first = now
                    else:
                        s.gaps.append((now - last_at) / (tokens - last_tokens))
                    last_at, last_tokens = now, tokens
                usage = event.get("usage") or event.get("meta_info") or {}
                if usage.get("prompt_tokens"):
                    s.prompt_tokens = usage["prompt_tokens"]
                    details = usage.get("prompt_tokens_details") or {}
                    s.cached_tokens = usage.get("cached_tokens", details.get("cached_tokens", 0)) or 0
        s.done, s.ok = time.perf_counter(), s.first is not None
    except (aiohttp.ClientError, TimeoutError):
        pass
    return s


def _tokens_so_far(event: dict[str, Any], before: int, interval: int) -> int:
    meta = event.get("meta_info")
    if meta is not None:
        return int(meta.get("completion_tokens", before))
    choices = event.get("choices") or []
    if choices and (choices[0].get("delta") or {}).get("content"):
        return before + interval  # chat chunks carry no count: the worker's stream interval
    return before


# -- routers ------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Router:
    """One or more router processes in front of the fleet; ``bases`` are their URLs."""

    def __init__(self, name: str, urls: list[str], replicas: int, workdir: Path) -> None:
        self.name, self.urls, self.replicas, self.workdir = name, urls, replicas, workdir
        self.procs: list[asyncio.subprocess.Process] = []
        self.bases: list[str] = []
        self.logs: list[Path] = []

    async def __aenter__(self) -> Router:
        for i in range(self.replicas):
            log = self.workdir / f"{self.name}-{i}.log"
            self.logs.append(log)
            if self.name == "sglang-router":
                port = free_port()
                cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *self.urls,
                       "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware", "--log-level", "warn"]
                proc = await asyncio.create_subprocess_exec(*cmd, stdout=log.open("wb"), stderr=asyncio.subprocess.STDOUT)
                self.procs.append(proc)
                self.bases.append(f"http://127.0.0.1:{port}")
            else:
                cfg = self.workdir / f"{self.name}-{i}.yaml"
                cfg.write_text(yaml.safe_dump({
                    "server": {"host": "127.0.0.1", "port": 0, "admin_port": 0, "drain_grace_s": 1.0},
                    "workers": {"static": self.urls}, "routing": {"policy": self.name},
                    "scrape": {"interval_s": 0.1}, "health": {"interval_s": 1.0},
                    "telemetry": {"log_level": "info", "log_requests": True}}))
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "proxy", "serve", "--config", str(cfg),
                    stdout=asyncio.subprocess.PIPE, stderr=log.open("wb"))
                self.procs.append(proc)
                assert proc.stdout is not None
                line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
                match = re.search(r"http=([\d.]+):(\d+)", line)
                if not match:
                    raise RuntimeError(f"radixgate did not start: {line!r} (see {log})")
                self.bases.append(f"http://{match.group(1)}:{match.group(2)}")
        await asyncio.gather(*(self._ready(b) for b in self.bases))
        return self

    async def _ready(self, base: str) -> None:
        """Poll until a tiny request goes through (workers registered and healthy)."""
        deadline = time.monotonic() + 60
        body = {"text": "ready", "sampling_params": {"max_new_tokens": 1}}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            while True:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(f"{base}/generate", json=body) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} at {base} not ready")
                await asyncio.sleep(0.2)

    async def __aexit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    def groups_per_worker(self) -> dict[str, set[str]]:
        """rid -> worker from radixgate's request log: the workers each group touched."""
        touched: dict[str, set[str]] = defaultdict(set)
        for log in self.logs:
            for line in log.read_text(errors="replace").splitlines():
                start = line.find('{"')
                if start < 0:
                    continue
                with contextlib.suppress(ValueError):
                    fields = json.loads(line[start:])
                    rid, worker = fields.get("rid", ""), fields.get("worker")
                    if worker and rid.count("~") == 2:
                        touched[rid.split("~")[1]].add(worker)
        return touched


# -- fleet helpers ------------------------------------------------------------------------------

async def worker_requests(session: aiohttp.ClientSession, urls: list[str]) -> list[float]:
    counts = []
    for url in urls:
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
        counts.append(sum(float(m) for m in re.findall(r"^sglang:num_requests_total\{[^}]*\} ([\d.e+]+)$", text, re.M)))
    return counts


async def flush(session: aiohttp.ClientSession, urls: list[str]) -> None:
    for url in urls:
        for _ in range(100):
            async with session.post(f"{url}/flush_cache") as resp:
                await resp.read()
                if resp.status == 200:
                    break
            await asyncio.sleep(0.1)


def available_ratio(specs: list[RequestSpec], capacity_tokens: int) -> float:
    cache = FleetCache(capacity_tokens)
    hit = total = 0
    for spec in specs:
        req = GenerateRequest(dialect=Dialect.CHAT if spec.messages else Dialect.SGLANG, payload={}, model=MODEL,
                              text=spec.text, messages=spec.messages)
        route = build_route_request(req, block_tokens=16, chars_per_token=4.0, max_blocks=2048)
        hit += cache.observe(route.block_hashes, route.block_tokens, route.prompt_tokens)
        total += route.prompt_tokens
    return hit / total if total else 0.0


# -- one run --------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def run_one(args: argparse.Namespace, fleet: Fleet, router_name: str, specs: list[RequestSpec],
                  arrivals: list[float], workdir: Path, replicas: int) -> dict[str, Any]:
    k = args.time_scale
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await flush(session, fleet.urls)
        async with Router(router_name, fleet.urls, replicas, workdir) as router:
            before = await worker_requests(session, fleet.urls)  # after the readiness probes
            start = time.perf_counter()
            tasks = []
            for i, (spec, at) in enumerate(zip(specs, arrivals, strict=True)):
                delay = start + at / k - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                base = router.bases[i % len(router.bases)]
                tasks.append(asyncio.create_task(send(session, base, spec, f"r{i}~{spec.group}~{router_name}", args.stream_interval)))
            samples = await asyncio.gather(*tasks)
            touched = router.groups_per_worker() if router_name != "sglang-router" else {}
        after = await worker_requests(session, fleet.urls)
    per_worker = [a - b for a, b in zip(after, before, strict=True)]
    ok = [s for s in samples if s.ok and s.first is not None and s.done is not None]
    ttft = [(s.first - s.sent) * k for s in ok if s.first is not None]
    e2e = [(s.done - s.sent) * k for s in ok if s.done is not None]
    gaps = [g * k for s in ok for g in s.gaps]
    span = (max(s.done for s in ok if s.done) - start) * k if ok else float("nan")
    mean_load = statistics.fmean(per_worker) if per_worker else 0.0
    return {
        "load": os.getloadavg()[0],
        "router": router_name if replicas == 1 else f"{router_name} x{replicas}",
        "ok": len(ok), "sent": len(samples),
        "ttft_p50": pct(ttft, 0.5), "ttft_p95": pct(ttft, 0.95), "ttft_p99": pct(ttft, 0.99),
        "itl_p95": pct(gaps, 0.95), "e2e_p95": pct(e2e, 0.95),
        "throughput": len(ok) / span if span else float("nan"),
        "goodput": sum(1 for t in ttft if t <= args.slo_ttft) / span if span else float("nan"),
        "captured": sum(s.cached_tokens for s in ok) / max(1, sum(s.prompt_tokens for s in ok)),
        "imbalance": max(per_worker) / mean_load if mean_load else float("nan"),
        "groups_on_one_worker": (sum(1 for w in touched.values() if len(w) == 1) / len(touched)) if touched else None,
    }


def print_table(title: str, rows: list[dict[str, Any]], available: float) -> None:
    print(f"\n{title}  (available hit rate {available:.1%}; times in simulated seconds)")
    head = ("| router | ok | TTFT p50 | p95 | p99 | ITL p95 | e2e p95 | req/s | goodput/s | captured | imbalance "
            "| groups on 1 worker | box load |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        g = "-" if r["groups_on_one_worker"] is None else f"{r['groups_on_one_worker']:.0%}"
        print(f"| {r['router']} | {r['ok']}/{r['sent']} | {r['ttft_p50']:.3f} | {r['ttft_p95']:.3f} | {r['ttft_p99']:.3f} "
              f"| {r['itl_p95'] * 1e3:.1f} ms | {r['e2e_p95']:.2f} | {r['throughput']:.2f} | {r['goodput']:.2f} "
              f"| {r['captured']:.1%} | {r['imbalance']:.2f} | {g} | {r['load']:.1f} |")
    sys.stdout.flush()


async def main_async(args: argparse.Namespace) -> None:
    sim = SimConfig(time_scale=args.time_scale, enable_metrics=True, enable_cache_report=True,
                    stream_interval=args.stream_interval, max_total_tokens=args.kv_tokens)
    kwargs: dict[str, Any] = {"seed": args.seed, "scale": args.scale}
    kwargs.update(json.loads(args.workload_args))
    specs = WORKLOADS[args.workload](**kwargs)
    if args.requests:
        specs = specs[: args.requests]
    with tempfile.TemporaryDirectory(prefix="bench_routing_") as tmp:
        async with Fleet.subprocesses([sim] * args.workers) as fleet:
            capacity = (args.kv_tokens or 392_079) * args.workers
            available = available_ratio(specs, capacity)
            for rate in [float(r) for r in args.rates.split(",")]:
                arrivals = poisson_times(rate, len(specs), random.Random(args.seed))
                rows = []
                for name in args.routers.split(","):
                    rows.append(await run_one(args, fleet, name, specs, arrivals, Path(tmp), 1))
                if args.replicas > 1:
                    rows.append(await run_one(args, fleet, args.replica_policy, specs, arrivals, Path(tmp), args.replicas))
                print_table(f"{args.workload} {json.loads(args.workload_args) or ''} x{args.scale}, "
                            f"{len(specs)} requests, {rate:g} req/s (simulated), {args.workers} workers, "
                            f"TTFT SLO {args.slo_ttft:g} s", rows, available)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="shared_prefix", choices=sorted(WORKLOADS))
    ap.add_argument("--workload-args", default="{}", help='JSON keyword arguments, e.g. {"groups": 8}')
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every token length")
    ap.add_argument("--requests", type=int, default=0, help="send only the first N requests (0 = all)")
    ap.add_argument("--rates", default="8,16", help="simulated requests per second, comma separated")
    ap.add_argument("--routers", default=",".join((*RADIXGATE_POLICIES, "sglang-router")))
    ap.add_argument("--replicas", type=int, default=1, help="also run --replica-policy behind this many proxies")
    ap.add_argument("--replica-policy", default="ttft")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--kv-tokens", type=int, default=None, help="KV pool per worker (default: the profile's)")
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--stream-interval", type=int, default=16)
    ap.add_argument("--slo-ttft", type=float, default=1.0, help="TTFT SLO in simulated seconds")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
