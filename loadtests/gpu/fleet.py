"""The fleet benchmark: routers side by side in front of the same engines, on one arrival trace.

    python -m loadtests.gpu.fleet --workers URL... --routers oracle,ttft,cache_aware,smg \\
        --rates 4,8 --prompts text --reports minimal --out DIR

Engines are started apart (``loadtests/gpu/run_fleet.sh`` starts real ones on the GPU machine;
``--sim N`` starts N simulated workers here for a dry run or the simulator's side of the fidelity
benchmark), so several cells can run on one set of warm engines. A cell is one workload shape x
prompt format (``text`` /generate text, ``ids`` /generate input_ids tokenized with the same BPE,
``chat`` /v1/chat/completions) x engine report mode (``full``: cached_tokens and load reports;
``minimal``: prompt/completion tokens only, set on the engines through ``POST /bench/mode``).

Routers: ``oracle`` (no proxy: group g goes to worker g mod N, the static-affinity reference),
``balanced`` (no proxy: each group on one worker, the groups spread by the requests the phase
will bring them, which no router knows when a group's first request comes: what that knowledge
buys a static placement; in the simulator less than placing each group when it comes does),
``direct0`` (everything to the first worker: one worker alone), ``smg`` (smg 1.13.0 cache_aware),
``sglang-router`` (0.3.2 cache_aware), and any radixgate policy name (``python -m proxy serve``).
All routers run at once on their own ports. Per rate, the arrival trace (Poisson times, group of
each request) is drawn once from ``--seed`` and the rate and replayed for every router; prompt
text is fresh for every phase (no phase inherits another's cache), of the same lengths. Routers
run in an order rotated by one per rate, after a warm-up phase. Every router at one rate gets the
same prompt text (``--text same``, the default: the engines' caches are flushed between phases,
and each router runs once per rate, so none inherits a cache; the text's token count varies by
~10% between draws, which moved a p95 at the knee by up to 2x); ``--text fresh`` draws new text
for every phase (runs before 2026-12-01 evening). A request still unanswered
``--drain-s`` after its phase's last arrival is cancelled and counts as failed, at that time.

The engines' ``GET /bench/stats`` (true prompt and cached tokens, which no router reads) gives the
prefix reuse captured per phase. Output: ``DIR/requests.jsonl`` (one line per request),
``DIR/engines.jsonl`` (GPU engines: each phase's per-request engine times and free-KV timeline),
``DIR/summary.json`` and the printed table (TTFT p50/p95, ITL p50, e2e p50, reuse, failures).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import re
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from loadtests.bench_overhead import free_port, stop_processes
from loadtests.gpu.dp_front import Front
from loadtests.gpu.fleet_report import (
    STANDING_PEERS,
    diagnoses_report,
    engines_report,
    growth_report,
    knee,
    pct,
    repeatability,
    report,
    standing,
    standing_list,
    table,
    tail_report,
)
from proxy.loadgen import texts
from proxy.loadgen.arrivals import poisson_times
from proxy.sim import perf

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TOKENIZER = Path(__file__).parent / "tokenizer"
PEERS = {"oracle", "balanced", "direct0", "smg", "smg-dp", "smg-open", "smg-blind", "sglang-router"}
SMG_FLAGS = {"smg": [], "smg-dp": ["--dp-aware"], "smg-open": ["--disable-worker-overload-protection"],
             "smg-blind": ["--disable-worker-overload-protection", "--disable-load-monitoring"]}
NO_PROXY = ("oracle", "balanced", "direct0")


@dataclass(frozen=True)
class Shape:
    groups: int = 32
    system_chars: int = 7000
    question_chars: int = 300
    output_tokens: int = 32
    # "shared": every request = its group's system prompt + a question; "unique": nothing shared.
    workload: str = "shared"


@dataclass
class Record:
    router: str
    rate: float
    phase: int
    i: int
    group: int
    at: float  # scheduled offset in the phase, s
    ttft: float | None = None
    e2e: float | None = None
    itl: float | None = None
    tokens: int = 0
    prompt_tokens: int = 0
    ok: bool = False
    status: int = 0
    sent: float = 0.0  # perf_counter when sent (the engines' /bench/trace uses the same clock)


# -- one request ---------------------------------------------------------------------------------

def request_body(prompts: str, system: str, question: str, output_tokens: int, encode: Any) -> tuple[str, dict[str, Any]]:
    if prompts == "chat":
        return "/v1/chat/completions", {
            "model": MODEL, "stream": True, "max_tokens": output_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    sampling = {"max_new_tokens": output_tokens, "ignore_eos": True}
    text = system + "\n\n" + question
    if prompts == "ids":
        return "/generate", {"input_ids": encode(text), "stream": True, "sampling_params": sampling}
    return "/generate", {"text": text, "stream": True, "sampling_params": sampling}


async def send(session: aiohttp.ClientSession, base: str, path: str, body: dict[str, Any], rec: Record) -> None:
    sent = rec.sent = time.perf_counter()
    last = sent
    gaps: list[float] = []
    try:
        async with session.post(base + path, json=body) as resp:
            rec.status = resp.status
            if resp.status != 200:
                await resp.read()
                return
            async for line in resp.content:
                if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[5:])
                now = time.perf_counter()
                meta = event.get("meta_info")
                choices = event.get("choices") or []
                if meta is not None:
                    tokens = int(meta.get("completion_tokens", rec.tokens))
                    rec.prompt_tokens = int(meta.get("prompt_tokens") or rec.prompt_tokens)
                elif choices and ((choices[0].get("delta") or {}).get("content") or choices[0].get("text")):
                    tokens = rec.tokens + 1
                else:
                    tokens = rec.tokens
                    usage = event.get("usage") or {}
                    rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
                if tokens > rec.tokens:
                    if rec.ttft is None:
                        rec.ttft = now - sent
                    else:
                        gaps.append((now - last) / (tokens - rec.tokens))
                    last, rec.tokens = now, tokens
        rec.e2e = time.perf_counter() - sent
        rec.ok = rec.ttft is not None
        rec.itl = sorted(gaps)[len(gaps) // 2] if gaps else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        rec.ok = False


# -- routers ---------------------------------------------------------------------------------------

ROUTING_KEYS = {"hold_max_s", "chars_per_token", "max_blocks", "tokenizer", "dp_ranks"}
# Keys of a spec about the proxies, not their routing: ``kv_events=auto`` (follow the engines'
# events), ``replicas=N`` (N proxies, the client's requests spread over them), ``peers=on`` (those
# replicas tell each other their decisions: ``routing.peers``; without it they share nothing).
PROXY_KEYS = {"kv_events", "replicas", "peers", "fresh"}


def routing_section(spec: str, tokenizer: Path | None = None) -> dict[str, Any]:
    """``policy[/key=value...]``: a radixgate policy with routing settings or policy params changed
    (``ttft/hold_max_s=0``, ``ttft/work_weight=1``), so variants run side by side.
    ``tokenizer=bench`` is the run's own tokenizer; ``PROXY_KEYS`` are no routing keys (see
    ``spec_kv_events``, ``spec_replicas``) and are left out here."""
    name, *pairs = spec.split("/")
    section: dict[str, Any] = {"policy": name, "params": {}}
    for pair in pairs:
        key, value = pair.split("=", 1)
        parsed = yaml.safe_load(value)
        if key in PROXY_KEYS:
            continue
        if key == "tokenizer" and parsed == "bench":
            if tokenizer is None:
                raise ValueError(f"{spec}: tokenizer=bench needs the run's tokenizer")
            parsed = str(tokenizer)
        if key in ROUTING_KEYS:
            section[key] = parsed
        else:
            section["params"][key] = parsed
    return section


def spec_value(spec: str, name: str) -> str | None:
    for pair in spec.split("/")[1:]:
        key, value = pair.split("=", 1)
        if key == name:
            return value
    return None


def spec_kv_events(spec: str, default: str = "") -> str:
    """The ``kv_events.endpoint`` of a router spec (``ttft/kv_events=auto``), else the run's
    ``--kv-events``; so one call compares a policy with and without the engines' events."""
    value = spec_value(spec, "kv_events")
    return default if value is None else value


def spec_replicas(spec: str) -> int:
    """How many proxies a radixgate spec runs (``ttft/replicas=4``): each with the same config and
    nothing shared but the workers (and their events with ``kv_events=auto``); the client sends
    its requests to them in turn, as a load balancer in front of replicas would."""
    value = spec_value(spec, "replicas")
    n = 1 if value is None else int(value)
    if n < 1:
        raise ValueError(f"{spec}: replicas must be >= 1")
    return n


def spec_peers(spec: str) -> bool:
    """Whether a replicated spec's proxies are each other's ``routing.peers`` (``ttft/replicas=4/peers=on``)."""
    value = spec_value(spec, "peers")
    if value is not None and spec_replicas(spec) < 2:
        raise ValueError(f"{spec}: peers needs replicas >= 2")
    return value is not None and bool(yaml.safe_load(value))


def spec_fresh(spec: str) -> bool:
    """Whether a radixgate spec's proxies are started anew before each of its rounds after the
    first (``ttft/fresh=on``): every round then routes as the first did, from the policy's prior,
    with nothing learned in an earlier round (its model fit, its counts), so a router's rounds
    that get worse in run order show whether what it learned is the cause."""
    value = spec_value(spec, "fresh")
    return value is not None and bool(yaml.safe_load(value))


class Routers:
    """Every router of the run, started once (``fresh=on``: before each round), each on its own port."""

    def __init__(self, names: list[str], workers: list[str], workdir: Path, tokenizer: Path,
                 window_s: float = 300.0, kv_events: str = "") -> None:
        self.names, self.workers, self.workdir, self.tokenizer = names, workers, workdir, tokenizer
        self.window_s, self.kv_events = window_s, kv_events
        self.bases: dict[str, list[str]] = {}  # a router's base URLs (replicas: several)
        self._turns: dict[str, int] = {}
        self.placement: dict[int, int] = {}  # ``balanced``: group -> worker index, set per phase
        self._procs_of: dict[str, list[asyncio.subprocess.Process]] = {}  # each router's processes
        self._admins_of: dict[str, list[str]] = {}  # each radixgate router's admin bases, replicas included

    @property
    def procs(self) -> list[asyncio.subprocess.Process]:
        return [proc for procs in self._procs_of.values() for proc in procs]

    @property
    def admins(self) -> dict[str, str]:
        """Each radixgate router's admin base (GET /diagnosis; replicas: the first's)."""
        return {name: bases[0] for name, bases in self._admins_of.items()}

    @property
    def every_admin(self) -> list[str]:
        return [base for bases in self._admins_of.values() for base in bases]

    async def start(self) -> list[str]:
        """Every router started; returns those that never answered (stopped, left out of the run,
        so one that cannot start does not cost the call's other routers their cell)."""
        for name in self.names:
            if name not in NO_PROXY:
                await self._launch(name)
        pairs = [(name, base) for name, bases in self.bases.items() for base in bases]
        got = await asyncio.gather(*(self._ready(name, base) for name, base in pairs), return_exceptions=True)
        failed = sorted({name for (name, _), g in zip(pairs, got, strict=True) if isinstance(g, BaseException)})
        for name in failed:
            await stop_processes(self._procs_of.pop(name, []))
            self.bases.pop(name, None)
            self._admins_of.pop(name, None)
        return failed

    async def restart(self, name: str) -> None:
        """A radixgate router's proxies stopped and started anew, on new ports (``fresh=on``)."""
        await stop_processes(self._procs_of.pop(name, []))
        self.bases.pop(name, None)
        self._admins_of.pop(name, None)
        await self._launch(name)
        await asyncio.gather(*(self._ready(name, base) for base in self.bases[name]))

    async def _launch(self, name: str) -> None:
        procs = self._procs_of[name] = []  # filled as each starts, so stop() finds any that did
        # cells of a call add up; the children keep their own copy of the descriptor
        with (self.workdir / f"router-{name.replace('/', '_')}.log").open("ab") as log:
            await self._spawn(name, log, procs)

    async def _spawn(self, name: str, log: Any, procs: list[asyncio.subprocess.Process]) -> None:
        if name in (*SMG_FLAGS, "sglang-router"):
            port = free_port()
            if name in SMG_FLAGS:
                # smg-dp: --dp-aware, each worker's DP ranks (its /get_server_info dp_size) routed as
                # workers of their own, the rank named in the request (data_parallel_rank).
                # smg-open: without its worker-overload protection (on by default in 1.13.0: a
                # worker reporting >= 8 waiting requests or KV token usage >= 0.8 on its 10-s poll
                # of /v1/loads leaves routing while another is under), which the fleet's knee
                # trips (runs 86-90); smg-blind: without it and without polling the engines
                cmd = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port),
                       "--worker-urls", *self.workers, "--policy", "cache_aware",
                       "--tokenizer-path", str(self.tokenizer), "--prometheus-host", "127.0.0.1",
                       "--prometheus-port", str(free_port()), "--log-level", "warn", *SMG_FLAGS[name]]
            else:
                cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                       "--port", str(port), "--worker-urls", *self.workers, "--policy", "cache_aware",
                       "--tokenizer-path", str(self.tokenizer), "--prometheus-port", str(free_port()),
                       "--log-level", "warn"]
            procs.append(await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=asyncio.subprocess.STDOUT))
            self.bases[name] = [f"http://127.0.0.1:{port}"]
            return
        count = spec_replicas(name)
        admins = [free_port() for _ in range(count)]
        self._admins_of[name] = [f"http://127.0.0.1:{a}" for a in admins]
        for replica in range(count):
            port, admin = free_port(), admins[replica]
            routing = routing_section(name, self.tokenizer)
            if spec_peers(name):
                routing["peers"] = [f"http://127.0.0.1:{a}" for a in admins if a != admin]
            cfg = self.workdir / f"radixgate-{name.replace('/', '_')}{f'-{replica}' if replica else ''}.yaml"
            cfg.write_text(yaml.safe_dump({
                "server": {"host": "127.0.0.1", "port": port, "admin_port": admin, "drain_grace_s": 1.0},
                "workers": {"static": self.workers}, "routing": routing,
                # the window holds a phase and more; each read after a phase asks for that
                # phase's own span (GET /diagnosis?window_s=)
                "diagnose": {"window_s": self.window_s},
                "upstream": {"first_byte_timeout_s": 120.0, "idle_timeout_s": 120.0},
                # kv_events auto: follow each engine's own events (engine_server --kv-events-config)
                **({"kv_events": {"endpoint": kv}} if (kv := spec_kv_events(name, self.kv_events)) else {}),
                "telemetry": {"log_level": "info", "log_requests": True}}))
            cmd = [sys.executable, "-m", "proxy", "serve", "--config", str(cfg)]
            procs.append(await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=asyncio.subprocess.STDOUT))
            self.bases.setdefault(name, []).append(f"http://127.0.0.1:{port}")

    async def _ready(self, name: str, base: str) -> None:
        """Until a one-token request goes through (the router found the workers healthy)."""
        deadline = time.monotonic() + 90
        body = {"text": "ready", "sampling_params": {"max_new_tokens": 1}}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while time.monotonic() < deadline:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(f"{base}/generate", json=body) as resp:
                        await resp.read()
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.5)
        raise RuntimeError(f"router {name} at {base} never answered (see {self.workdir}/router-{name}.log)")

    def target(self, name: str, group: int) -> str:
        if name == "oracle":
            return self.workers[group % len(self.workers)]
        if name == "balanced":
            return self.workers[self.placement[group]]
        if name == "direct0":
            return self.workers[0]
        bases = self.bases[name]
        turn = self._turns.get(name, 0)
        self._turns[name] = turn + 1
        return bases[turn % len(bases)]

    async def diagnosis(self, session: aiohttp.ClientSession, name: str, span_s: float) -> dict[str, Any] | None:
        """A radixgate router's ``GET /diagnosis?window_s=`` over the last ``span_s`` seconds (None for
        the others, or when it does not answer)."""
        if name not in self.admins:
            return None
        span = min(span_s, self.window_s)
        with contextlib.suppress(aiohttp.ClientError, ValueError, TimeoutError):
            async with session.get(f"{self.admins[name]}/diagnosis?window_s={span:.3f}",
                                   timeout=aiohttp.ClientTimeout(total=30)) as resp:
                if resp.status == 200:
                    doc: dict[str, Any] = await resp.json()
                    return doc
        return None

    async def metrics(self, session: aiohttp.ClientSession, name: str) -> list[str]:
        """The first replica's ``/metrics`` exposition, by line (empty when it does not answer)."""
        with contextlib.suppress(aiohttp.ClientError, ValueError, TimeoutError):
            async with session.get(f"{self.admins[name]}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                return (await resp.text()).splitlines()
        return []

    async def peer_counts(self, session: aiohttp.ClientSession, name: str) -> dict[str, float]:
        """The first replica's peer counters so far (``radixgate_peer_*`` samples summed by metric
        and outcome): evidence that ``peers=on`` replicas did tell each other their decisions."""
        totals: dict[str, float] = {}
        for line in await self.metrics(session, name):
            m = re.match(r'(radixgate_peer_\w+?)(?:_total)?\{[^}]*?outcome="([^"]+)"[^}]*\} ([0-9.e+]+)$', line)
            if m:
                key = f"{m[1]}:{m[2]}"
                totals[key] = totals.get(key, 0.0) + float(m[3])
        return totals

    async def model_terms(self, session: aiohttp.ClientSession, name: str) -> dict[str, float]:
        """The first replica's learned TTFT model (``radixgate_routing_ttft_model``; empty for a
        policy that learns none): whether a floor such as ``own_at_least_ahead`` binds on these engines."""
        terms: dict[str, float] = {}
        for line in await self.metrics(session, name):
            m = re.match(r'radixgate_routing_ttft_model\{term="(\w+)"\} ([0-9.e+-]+)$', line)
            if m:
                terms[m[1]] = float(m[2])
        return terms

    async def kv_status(self, session: aiohttp.ClientSession, name: str) -> list[dict[str, Any]]:
        """Each worker's KV-event stream as a radixgate router sees it (``GET /workers``): state,
        source (events / approximate), batches, gaps; empty where it follows no events."""
        with contextlib.suppress(aiohttp.ClientError, ValueError, TimeoutError):
            async with session.get(f"{self.admins[name]}/workers", timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status == 200:
                    doc = await resp.json()
                    return [{"url": w["url"], **w["kv_events"]} for w in doc.get("workers", [])
                            if w.get("kv_events")]
        return []

    async def flushed(self, session: aiohttp.ClientSession) -> None:
        """Tell every radixgate proxy that the engines' caches were flushed, as an operator's
        ``/flush_cache`` through it does (it flushes the idle engines again, harmless): each forgets
        what it believed they held. Without it a proxy's next round on the same text routed, and
        estimated reuse, on caches that were gone (runs 19-27: every round after the first kept the
        first's placement, and the diagnosis read 96% captured where the engines had 75%)."""
        for admin in self.every_admin:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(f"{admin}/flush_cache", timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    await resp.read()

    async def stop(self) -> None:
        await stop_processes(self.procs)


# -- engines -------------------------------------------------------------------------------------

async def engine_stats(session: aiohttp.ClientSession, workers: list[str]) -> list[dict[str, int]]:
    out = []
    for url in workers:
        async with session.get(f"{url}/bench/stats") as resp:
            out.append(await resp.json())
    return out


async def engine_traces(session: aiohttp.ClientSession, workers: list[str]) -> list[dict[str, Any]]:
    """Each engine's per-request times and batch / free-KV timeline since the last call (GPU
    engines only; a worker without ``/bench/trace`` gives an empty one)."""
    out: list[dict[str, Any]] = []
    for url in workers:
        doc: dict[str, Any] = {}
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with session.get(f"{url}/bench/trace") as resp:
                if resp.status == 200:
                    doc = await resp.json()
        out.append({"worker": url, **doc})
    return out


async def front_counts(session: aiohttp.ClientSession, workers: list[str]) -> list[dict[str, Any]]:
    """Each DP front's generations per rank so far, and how many named their rank
    (``dp_front.py``'s ``GET /bench/front``); empty where the workers are engines."""
    out: list[dict[str, Any]] = []
    for url in workers:
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with session.get(f"{url}/bench/front") as resp:
                if resp.status == 200:
                    out.append(await resp.json())
                    continue
        return []
    return out


def front_phase(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """One phase's share of ``front_counts``: per front and rank, generations taken and named."""
    if not before or len(before) != len(after):
        return {}
    took = [[a - b for a, b in zip(x["took"], y["took"], strict=True)] for x, y in zip(after, before, strict=True)]
    named = [[a - b for a, b in zip(x["named"], y["named"], strict=True)] for x, y in zip(after, before, strict=True)]
    return {"took": took, "named": named}


async def set_mode(session: aiohttp.ClientSession, workers: list[str], minimal: bool) -> None:
    for url in workers:
        async with session.post(f"{url}/bench/mode", json={"minimal_reports": minimal}) as resp:
            resp.raise_for_status()


async def wait_idle(session: aiohttp.ClientSession, workers: list[str], limit_s: float) -> list[str]:
    """Until no engine has a request in flight (bounded), then flush their prefix caches: the next
    phase starts from empty pools whatever ran before it (without it, the first router of a cell
    ran on emptier pools and captured more reuse). Returns the engines that refused the flush
    (still busy past ``limit_s``): a phase started on them inherits a backlog and a cache."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if all(s["active"] == 0 for s in await engine_stats(session, workers)):
            break
        await asyncio.sleep(0.25)
    refused = []
    for url in workers:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.post(f"{url}/flush_cache") as resp:
                await resp.read()
                if resp.status != 200:
                    refused.append(url)
    return refused


async def start_sim(n: int, args: argparse.Namespace, workdir: Path) -> tuple[list[str], list[asyncio.subprocess.Process]]:
    """N simulated workers in one process sharing one simulated GPU (as the GPU fleet runs N
    engine processes on one H200); ``--sim-own-gpus`` gives each its own."""
    cmd = [sys.executable, "-m", "proxy.sim", "--port", "0", "--count", str(n),
           *([] if args.sim_own_gpus else ["--shared-gpu"]), "--profile", args.sim_profile,
           "--tokenizer", str(args.tokenizer), "--max-total-tokens", str(args.kv_tokens),
           "--page-size", "32", "--max-running-requests", "64", "--enable-metrics", "--enable-cache-report",
           "--time-scale", str(args.time_scale), *args.sim_arg]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                                stderr=(workdir / "sim.log").open("wb"))
    assert proc.stdout is not None
    urls = []
    for i in range(n):
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        match = re.search(r"READY (\S+)", line)
        if not match:
            raise RuntimeError(f"simulated worker {i} did not start: {line!r}")
        urls.append(match.group(1))
    return urls, [proc]


async def start_fronts(engines: list[str], dp: int) -> tuple[list[str], list[web.AppRunner]]:
    """``dp_front.py`` over every ``dp`` engines in turn, on this loop: the workers the routers see."""
    urls, runners = [], []
    for f in range(len(engines) // dp):
        runner = web.AppRunner(Front(engines[f * dp:(f + 1) * dp]).app(), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    return urls, runners


# -- phases --------------------------------------------------------------------------------------

def trace(rate: float, seconds: float, shape: Shape, seed: int) -> list[tuple[float, int]]:
    """(offset, group) per arrival: the same for every router at this rate."""
    rng = random.Random(f"{seed}:{rate}")
    times = poisson_times(rate, max(1, round(rate * seconds)), rng)
    if shape.workload == "unique":
        return [(t, i) for i, t in enumerate(times)]
    return [(t, rng.randrange(shape.groups)) for t in times]


def balanced_placement(arrivals: list[tuple[float, int]], workers: int) -> dict[int, int]:
    """Group -> worker index, knowing each group's requests in the phase ahead: the groups in
    order of their requests, most first, each on the worker with the fewest requests so far
    (longest-processing-time-first; ties to the lower index). A clairvoyant static placement."""
    counts: dict[int, int] = {}
    for _, group in arrivals:
        counts[group] = counts.get(group, 0) + 1
    load = [0] * workers
    out = {}
    for group in sorted(counts, key=lambda g: (-counts[g], g)):
        w = min(range(workers), key=lambda k: (load[k], k))
        out[group] = w
        load[w] += counts[group]
    return out


def phase_order(names: list[str], rates: list[float], repeat: int = 1) -> list[tuple[float, int, str]]:
    """(rate, round, router) of every phase in run order: per rate, ``repeat`` rounds of every
    router, the order rotated by one per round (and so per rate), so none always runs first."""
    out: list[tuple[float, int, str]] = []
    for k, rate in enumerate(rates):
        for rep in range(repeat):
            turn = (k * repeat + rep) % len(names)
            out.extend((rate, rep, name) for name in names[turn:] + names[:turn])
    return out


def text_key(text: str, phase_base: int, rate: float, phase: int) -> int | str:
    """What seeds a phase's prompt text: the rate (``same``: every router at this rate gets the
    same prompts) or the phase number (``fresh``)."""
    return f"{phase_base}@{rate:g}" if text == "same" else phase


def phase_texts(arrivals: list[tuple[float, int]], shape: Shape, phase: int | str) -> list[tuple[str, str]]:
    """(system, question) of each arrival: fresh text per key, one system prompt per group."""
    rng = random.Random(f"text:{phase}")
    systems: dict[int, str] = {}
    out = []
    for i, (_, group) in enumerate(arrivals):
        if group not in systems:
            systems[group] = texts.mixed_text(rng, shape.system_chars)
        question = f"[{phase}.{i}] " + texts.mixed_text(rng, shape.question_chars)
        system = systems[group] if shape.workload == "shared" else question + systems[group]
        out.append((system, question))
    return out


async def run_phase(session: aiohttp.ClientSession, routers: Routers, router: str, rate: float, phase: int,
                    arrivals: list[tuple[float, int]], shape: Shape, prompts: str, drain_s: float,
                    encode: Any, key: int | str | None = None) -> list[Record]:
    bodies = [request_body(prompts, system, question, shape.output_tokens, encode)
              for system, question in phase_texts(arrivals, shape, phase if key is None else key)]
    records = [Record(router, rate, phase, i, g, t) for i, (t, g) in enumerate(arrivals)]
    if router == "balanced":
        routers.placement = balanced_placement(arrivals, len(routers.workers))
    tasks: list[asyncio.Task[None]] = []
    start = time.perf_counter() + 0.1
    for rec, (path, body) in zip(records, bodies, strict=True):
        await asyncio.sleep(max(0.0, start + rec.at - time.perf_counter()))
        tasks.append(asyncio.create_task(send(session, routers.target(router, rec.group), path, body, rec)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return records


def summarize(records: list[Record], reuse: float | None) -> dict[str, Any]:
    # A failed request counts as infinitely slow: a p95 never improves by dropping requests.
    ttft = [r.ttft if r.ok and r.ttft is not None else math.inf for r in records]
    ok = [r for r in records if r.ok]
    return {
        "n": len(records), "failed": len(records) - len(ok),
        "ttft_p50": pct(ttft, 0.5), "ttft_p95": pct(ttft, 0.95),
        "itl_p50": pct([r.itl for r in ok if r.itl is not None], 0.5),
        "e2e_p50": pct([r.e2e for r in ok if r.e2e is not None], 0.5),
        "reuse": reuse,
        "prompt_tokens_mean": sum(r.prompt_tokens for r in ok) / len(ok) if ok else 0,
    }


async def main_async(args: argparse.Namespace) -> None:
    out = Path(args.out)
    shape = Shape(args.groups, args.system_chars, args.question_chars, args.output_tokens, args.workload)
    sims: list[asyncio.subprocess.Process] = []
    workers = args.workers
    if args.sim:
        workers, sims = await start_sim(args.sim, args, out)
    # --engine-urls: what the routers' workers front (loadtests/gpu/dp_front.py: one worker URL over
    # several engines as its DP ranks); the run's engine-side calls (reports mode, flush, stats) go to them
    engines = args.engine_urls or workers
    front_runners: list[web.AppRunner] = []
    if args.sim and args.sim_dp > 1:  # run_fleet.sh's DP fronts, here in process over the simulated engines
        workers, front_runners = await start_fronts(engines, args.sim_dp)
    encode: Any = None
    if args.prompts == "ids":
        from tokenizers import Tokenizer

        bpe = Tokenizer.from_file(str(Path(args.tokenizer) / "tokenizer.json"))

        def encode(text: str) -> list[int]:
            return list(bpe.encode(text, add_special_tokens=True).ids)

    task = asyncio.current_task()
    if task is not None:  # a time limit's SIGTERM ends the run through the finally below
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    names = [n for n in args.routers.split(",") if n]
    routers = Routers(names, workers, out, Path(args.tokenizer), window_s=args.phase_s + args.drain_s + 60,
                      kv_events=args.kv_events)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    connector = aiohttp.TCPConnector(limit=0)
    summary: dict[str, dict[str, dict[str, Any]]] = {n: {} for n in names}
    rates = [float(r) for r in args.rates.split(",")]
    # every round of a router at a rate: its records, each round's p95, prompt and cached tokens
    pooled: dict[tuple[str, float], tuple[list[Record], list[float], list[int]]] = {}
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        try:
            await set_mode(session, engines, args.reports == "minimal")
            for name in await routers.start():
                print(f"    WARNING router {name} never answered: left out (its log in {out})", flush=True)
                names.remove(name)
                summary.pop(name, None)
            phase = args.phase_base
            if args.warmup_s > 0:
                arrivals = trace(rates[0], args.warmup_s, shape, args.seed + 1)
                warm = names[0] if names[0] in PEERS else "oracle"
                await run_phase(session, routers, warm, rates[0], phase, arrivals, shape, args.prompts,
                                args.drain_s, encode)
                await wait_idle(session, engines, 30)
                # the machine's speed before any judged phase (fleet_windows reads its batches)
                traces = await engine_traces(session, engines)
                if any(t.get("requests") for t in traces):
                    with (out / "warmup.jsonl").open("a") as f:  # one line per cell of the call
                        f.write(json.dumps({"router": warm, "rate": rates[0], "phase": phase, "prompts": args.prompts,
                                            "reports": args.reports, "engines": traces}) + "\n")
            started = time.monotonic()
            with (out / "requests.jsonl").open("a") as log:
                ran: set[str] = set()
                for rate, _, name in phase_order(names, rates, args.repeat):
                    arrivals = trace(rate, args.phase_s, shape, args.seed)
                    phase += 1
                    unclean = await wait_idle(session, engines, 30)
                    if name in ran and spec_fresh(name):
                        await routers.restart(name)  # this round from the prior, as its first was
                    ran.add(name)
                    if not args.warm_index:
                        await routers.flushed(session)
                    if unclean:
                        print(f"    WARNING {name} @ {rate:g}/s starts on busy, unflushed engines: {unclean}", flush=True)
                    before = await engine_stats(session, engines)
                    fronts_before = await front_counts(session, workers) if engines != workers else []
                    await engine_traces(session, engines)  # drop what the last phase left
                    phase_start = time.monotonic()
                    records = await run_phase(session, routers, name, rate, phase, arrivals, shape,
                                              args.prompts, args.drain_s, encode,
                                              text_key(args.text, args.phase_base, rate, phase))
                    # before the flush: what the events say each engine holds at the phase's end
                    kv = await routers.kv_status(session, name) if name in routers.admins else []
                    peers = await routers.peer_counts(session, name) if spec_peers(name) else {}
                    if peers:
                        print(f"    {name} peers (cumulative): {peers}", flush=True)
                    model = await routers.model_terms(session, name) if name in routers.admins else {}
                    if model:
                        print(f"    {name} ttft model: " + ", ".join(f"{k} {v:.3g}" for k, v in sorted(model.items())),
                              flush=True)
                    await wait_idle(session, engines, 30)
                    after = await engine_stats(session, engines)
                    traces = await engine_traces(session, engines)
                    fronts = front_phase(fronts_before, await front_counts(session, workers)) if fronts_before else {}
                    if fronts:
                        print(f"    {name} DP ranks: took {fronts['took']}, named {fronts['named']}", flush=True)
                    if any(t.get("requests") for t in traces):
                        with (out / "engines.jsonl").open("a") as f:
                            f.write(json.dumps({"router": name, "rate": rate, "phase": phase,
                                                "prompts": args.prompts, "reports": args.reports,
                                                "engines": traces, **({"fronts": fronts} if fronts else {})}) + "\n")
                    if name in routers.admins:
                        await asyncio.sleep(2.5)  # past the diagnosis' refresh period (2 s)
                        # this phase's requests only, not the tail of one before it in the window
                        doc = await routers.diagnosis(session, name, time.monotonic() - phase_start)
                        if doc is not None:
                            with (out / "diagnoses.jsonl").open("a") as f:
                                f.write(json.dumps({"router": name, "rate": rate, "phase": phase,
                                                    "prompts": args.prompts, "reports": args.reports,
                                                    "diagnosis": doc, "kv_events": kv, "peers": peers,
                                                    "model": model}) + "\n")
                        if kv:
                            print(f"    {name} kv events: " + ", ".join(
                                f"{k['source']}/{k['state']} {k['batches']} batches {k['blocks']} blocks {k['gaps']} gaps"
                                for k in kv), flush=True)
                    prompt = sum(a["prompt_tokens"] - b["prompt_tokens"] for a, b in zip(after, before, strict=True))
                    cached = sum(a["cached_tokens"] - b["cached_tokens"] for a, b in zip(after, before, strict=True))
                    s = summarize(records, cached / prompt if prompt else None)
                    # --repeat: the table's cell pools every round; each round's p95 is kept beside it
                    recs, p95s, tokens = pooled.setdefault((name, rate), ([], [], [0, 0]))
                    recs.extend(records)
                    p95s.append(s["ttft_p95"])
                    tokens[0] += prompt
                    tokens[1] += cached
                    whole = summarize(recs, tokens[1] / tokens[0] if tokens[0] else None)
                    unclean_phases = summary[name].get(f"{rate:g}", {}).get("unclean_start", 0) + bool(unclean)
                    if unclean_phases:
                        whole["unclean_start"] = unclean_phases  # phases begun on an engine's backlog
                    summary[name][f"{rate:g}"] = whole if len(p95s) == 1 else {**whole, "p95_repeats": p95s}
                    for rec in records:
                        log.write(json.dumps({**asdict(rec), "prompts": args.prompts, "reports": args.reports,
                                              "workload": shape.workload}) + "\n")
                    print(f"[{time.monotonic() - started:6.1f}s] {name:>14} @ {rate:g}/s: "
                          f"p50 {s['ttft_p50']:.3f} p95 {s['ttft_p95']:.3f} reuse {s['reuse'] or 0:.0%} "
                          f"failed {s['failed']}/{s['n']} prompt~{s['prompt_tokens_mean']:.0f}", flush=True)
        finally:
            # Even when cut short (SIGTERM from a time limit): the phases measured so far count. Written
            # before any await here: a SIGTERM landing during the clean-up below cancels that await and
            # would skip the rest (run 74 lost its last cell's summary so).
            # complete: every round of every router at every rate (a cut-short last round too)
            complete = all(len(pooled.get((n, r), ((), ()))[1]) == args.repeat for n in names for r in rates)
            cell = {"argv": args.argv, "prompts": args.prompts, "reports": args.reports, "shape": asdict(shape),
                    "seed": args.seed, "text": args.text, "repeat": args.repeat, "workers": len(workers),
                    **({"dp_engines": len(engines)} if engines != workers else {}), "rates": rates, "routers": names, "summary": summary,
                    "engine": "sim:" + args.sim_profile if args.sim else "gpu", "complete": complete}
            if any(summary.values()):
                with (out / "summary.jsonl").open("a") as f:
                    f.write(json.dumps(cell) + "\n")
            for proc in sims:  # signalled before any await too: a cancelled wait leaves none running
                if proc.returncode is None:
                    proc.terminate()
            await routers.stop()  # signals every router before its first await
            for runner in front_runners:
                await runner.cleanup()
            for proc in sims:
                await proc.wait()
    print(f"\n{cell['engine']}, {len(workers)} workers, prompts={args.prompts}, reports={args.reports}, "
          f"workload={shape.workload}, seed {args.seed}; TTFT p50 / p95 / ITL p50 (ms), prefix reuse captured")
    print(table(summary, rates, names))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", nargs="*", default=[])
    p.add_argument("--engine-urls", nargs="*", default=[],
                   help="the engines behind --workers where those are DP fronts (default: the workers)")
    p.add_argument("--sim", type=int, default=0, help="start this many simulated workers instead")
    # the GPU fleet's engines, the GPU shared in time slices (as fleet_sim.PROFILE)
    p.add_argument("--sim-profile", default=perf.GPU_FLEET_PROFILE)
    p.add_argument("--sim-arg", action="append", default=[], help="extra simworker flag (repeatable)")
    p.add_argument("--sim-dp", type=int, default=1,
                   help="the simulated engines behind DP fronts of this many ranks each (run_fleet.sh DP=)")
    p.add_argument("--sim-own-gpus", action="store_true", help="simulated workers do not share one GPU")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--kv-tokens", type=int, default=48_000, help="KV pool of each simulated worker")
    p.add_argument("--routers", default="oracle,ttft,cache_aware,round_robin")
    p.add_argument("--rates", default="4,8")
    p.add_argument("--prompts", choices=("text", "ids", "chat"), default="text")
    p.add_argument("--reports", choices=("full", "minimal"), default="minimal")
    p.add_argument("--workload", choices=("shared", "unique"), default="shared")
    p.add_argument("--groups", type=int, default=Shape.groups)
    p.add_argument("--system-chars", type=int, default=Shape.system_chars)
    p.add_argument("--question-chars", type=int, default=Shape.question_chars)
    p.add_argument("--output-tokens", type=int, default=Shape.output_tokens)
    p.add_argument("--phase-s", type=float, default=30.0)
    p.add_argument("--drain-s", type=float, default=20.0)
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--phase-base", type=int, default=0, help="phase numbering offset (text keyed by it)")
    p.add_argument("--kv-events", default="", help='radixgate routers\' kv_events.endpoint ("auto": each '
                   "engine's own, started with engine_server --kv-events-config)")
    p.add_argument("--warm-index", action="store_true",
                   help="do not tell the radixgate proxies of the flush between phases (as runs 19-27 did): "
                        "a later round routes on the caches the proxy believes the engines still hold")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of every router per rate (the spread between runs of one router, in one run)")
    p.add_argument("--text", choices=("same", "fresh"), default="same",
                   help="same: one prompt text per rate for every router; fresh: new text per phase")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--tokenizer", default=str(TOKENIZER))
    p.add_argument("--out", default="/tmp/radixgate-fleet")
    p.add_argument("--knee", metavar="SUMMARY", help="print 'knee,past' from the last oracle ladder in SUMMARY and exit")
    p.add_argument("--slo-s", type=float, default=2.0, help="--knee: the oracle's p95 TTFT bound")
    p.add_argument("--report", nargs="+", metavar="SUMMARY", help="print the tables of these summary.jsonl files and exit")
    p.add_argument("--standing", nargs="*", metavar="SUMMARY",
                   help="print --router against the better of smg and sglang-router in each cell of these files "
                        "(none: the runs loadtests/results/STANDING.txt lists), and exit")
    p.add_argument("--router", default="ttft", help="--standing: the radixgate router to rank (comma-separated: the first a cell ran)")
    p.add_argument("--peer", default=",".join(STANDING_PEERS),
                   help="--standing: the gateways to rank against, the better of them each cell (comma-separated)")
    p.add_argument("--repeatability", nargs="+", metavar="SUMMARY",
                   help="print each fixed router's TTFT on the same phases across these runs (the engines' own "
                        "spread between runs), and exit")
    p.add_argument("--growth", nargs="+", metavar="REQUESTS",
                   help="per rate, the phases of these requests.jsonl the diagnosis' overload rule calls past capacity")
    p.add_argument("--tail", nargs="+", metavar="REQUESTS",
                   help="per rate, who the slowest 5%% of each phase of these requests.jsonl are (a group's "
                        "first request or a follower) and when they arrived, and exit")
    p.add_argument("--engines", metavar="ENGINES", help="print the per-engine view of an engines.jsonl and exit")
    p.add_argument("--diagnoses", metavar="DIAGNOSES", help="print the verdicts of a diagnoses.jsonl and exit")
    args = p.parse_args()
    args.argv = sys.argv[1:]
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.knee:
        print(knee(Path(args.knee), args.slo_s))
        return
    if args.report:
        print(report([Path(p) for p in args.report]))
        return
    if args.growth:
        print(growth_report([Path(p) for p in args.growth]))
        return
    if args.tail:
        print(tail_report([Path(p) for p in args.tail]))
        return
    if args.standing is not None:
        print(standing([Path(p) for p in args.standing] or standing_list(), args.router,
                       tuple(n for n in args.peer.split(",") if n)))
        return
    if args.repeatability:
        print(repeatability([Path(p) for p in args.repeatability]))
        return
    if args.engines:
        print(engines_report(Path(args.engines)))
        return
    if args.diagnoses:
        print(diagnoses_report(Path(args.diagnoses)))
        return
    if not args.workers and not args.sim:
        p.error("give --workers URL... or --sim N")
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(main_async(args))
    except asyncio.CancelledError:
        sys.exit("cut short (SIGTERM): the phases measured so far are in summary.jsonl, marked incomplete")


if __name__ == "__main__":
    main()
