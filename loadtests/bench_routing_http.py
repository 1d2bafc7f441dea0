"""The HTTP half of bench_routing: real router processes in front of simulated workers.

radixgate runs as ``python -m proxy serve --config ...`` (one process per replica), the real
``sglang-router`` as ``python -m sglang_router.launch_router``; simulated workers run as
subprocesses at ``time_scale``. Every response is streamed and timed by the client. Wall-clock
figures are multiplied by the time scale into simulated seconds, and so is every cost of the host:
on a small shared machine CPU contention shows up as latency (the table's ``box load`` column says
how busy the machine was), and Python proxy overhead is inflated against the Rust router.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from loadtests.bench_overhead import free_port, stop_processes
from loadtests.bench_summary import summarize
from proxy.loadgen.client import flush, send
from proxy.loadgen.workloads import RequestSpec
from proxy.sim.fleet import Fleet

# -- routers ------------------------------------------------------------------------------------

class Router:
    """One or more router processes in front of the fleet; ``bases`` are their URLs."""

    def __init__(self, name: str, urls: list[str], replicas: int, workdir: Path, *, peers: bool = False) -> None:
        self.name, self.urls, self.replicas, self.workdir = name, urls, replicas, workdir
        # radixgate replicas that tell each other their decisions (routing.peers on fixed admin ports).
        self.peers = peers
        self.procs: list[asyncio.subprocess.Process] = []
        self.bases: list[str] = []
        self.logs: list[Path] = []

    async def __aenter__(self) -> Router:
        admin_ports = [free_port() if self.peers else 0 for _ in range(self.replicas)]
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
                peers = [f"http://127.0.0.1:{port}" for j, port in enumerate(admin_ports) if j != i and self.peers]
                cfg.write_text(yaml.safe_dump({
                    "server": {"host": "127.0.0.1", "port": 0, "admin_port": admin_ports[i], "drain_grace_s": 1.0},
                    "workers": {"static": self.urls}, "routing": {"policy": self.name, "peers": peers},
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
        await stop_processes(self.procs)

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


# -- one run --------------------------------------------------------------------------------------

async def run_one(args: argparse.Namespace, fleet: Fleet, router_name: str, specs: list[RequestSpec],
                  arrivals: list[float], workdir: Path, replicas: int, *, peers: bool = False) -> dict[str, Any]:
    k = args.time_scale
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await flush(session, fleet.urls)
        async with Router(router_name, fleet.urls, replicas, workdir, peers=peers) as router:
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
    return summarize(
        router_name if replicas == 1 else f"{router_name} x{replicas} proxies" + (", peers" if peers else ", sharing nothing"),
        sent=len(samples),
        ttft=[(s.first - s.sent) * k for s in ok if s.first is not None],
        e2e=[(s.done - s.sent) * k for s in ok if s.done is not None],
        gaps=[g * k for s in ok for g in s.gaps],
        span=(max(s.done for s in ok if s.done) - start) * k if ok else float("nan"),
        cached=sum(s.cached_tokens for s in ok), prompt=sum(s.prompt_tokens for s in ok),
        per_worker=per_worker, touched=touched, slo=args.slo_ttft)
