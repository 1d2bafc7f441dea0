"""Soak with accounting: a long mixed run against radixgate while workers fail at random.

    python -m loadtests.soak                      # ~150 s, 3 workers, 24 clients
    python -m loadtests.soak --duration-s 30      # shorter
    python -m loadtests.soak --json loadtests/results/soak.json

Set-up: N simulated SGLang workers as separate processes (``Fleet.subprocesses``), the proxy in this
process (so its tasks can be counted), clients in this process speaking HTTP on loopback. Clients
send a random mix — SGLang native / OpenAI completions / chat, streamed or not, shared prompt
prefixes — and a few leave mid-stream on purpose. Every few seconds one worker suffers a fault:
killed and restarted, restarted answering 500 to half its requests, restarted to die after N tokens
(mid-stream), restarted hanging before its first token, or restarted slow to start; each fault is
healed a few seconds later by a clean restart.

Every request a client sent ends in exactly one of: ``ok`` (a complete answer), ``explicit error``
(an HTTP error status with a JSON message, or a stream ended by an error event then ``[DONE]`` on a
clean close), ``abandoned`` (the client left on purpose) or ``unexplained`` (anything else: a
transport error, a truncated stream, a client timeout). The run passes when nothing is
unexplained and the proxy's own counters agree: ``accepted = succeeded + failed``,
``accepted = sent``, ``succeeded = ok``, ``failed = explicit errors + abandoned``. It also reports
resident memory after warm-up and at the end, asyncio tasks, open file descriptors and TCP
connections before and after (connections to the public port must all be gone once the clients
closed). Exit status 0 when every check holds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import psutil
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import App
from proxy.config import load
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet, SubprocessWorker

PREFIXES = [f"You are assistant #{i}. Answer briefly and precisely. " * 8 for i in range(6)]
CLEAN = {"error_rate": 0.0, "die_after_tokens": None, "hang_before_first_token": False, "slow_start": 0.0}


@dataclass
class Tally:
    sent: int = 0
    ok: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # "http 503", "stream 502", ...
    abandoned: int = 0
    unexplained: list[str] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def explicit_errors(self) -> int:
        return sum(self.errors.values())


def request(rng: random.Random) -> tuple[str, dict[str, Any], bool, bool]:
    """(path, body, streamed, leave early) for one random request."""
    prompt = rng.choice(PREFIXES) + f"Question {rng.randint(0, 10**6)}: what is {rng.randint(2, 99)} squared?"
    streamed = rng.random() < 0.7
    leave = streamed and rng.random() < 0.05
    tokens = 2000 if leave else rng.randint(8, 120)
    kind = rng.choice(["generate", "generate", "completions", "chat"])
    if kind == "generate":
        body = {"text": prompt, "stream": streamed, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
        return "/generate", body, streamed, leave
    if kind == "completions":
        return "/v1/completions", {"model": "", "prompt": prompt, "max_tokens": tokens, "stream": streamed}, streamed, leave
    body = {"model": "", "messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": streamed}
    return "/v1/chat/completions", body, streamed, leave


async def one(session: aiohttp.ClientSession, url: str, rng: random.Random, tally: Tally) -> None:
    path, body, streamed, leave = request(rng)
    tally.sent += 1
    try:
        async with session.post(url + path, json=body) as r:
            if r.status != 200:
                err = (await r.json(content_type=None)).get("error")
                message = err.get("message") if isinstance(err, dict) else None
                if isinstance(message, str) and message:
                    tally.errors[f"http {r.status}"] += 1
                else:
                    tally.unexplained.append(f"HTTP {r.status} without a JSON error message")
                return
            if leave:
                await r.content.readuntil(b"\n\n")
                r.close()
                tally.abandoned += 1
                return
            raw = await r.read()
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        tally.unexplained.append(f"{path}: {e!r}")
        return
    classify(raw, streamed, tally)


def classify(raw: bytes, streamed: bool, tally: Tally) -> None:
    if not streamed:
        doc = json.loads(raw)
        if "error" in doc:
            tally.unexplained.append(f"200 with an error body: {raw[:200]!r}")
        else:
            tally.ok += 1
        return
    events = [e[len(b"data: "):] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    if not events or events[-1] != b"[DONE]" or not raw.endswith(b"\n\n"):
        tally.unexplained.append(f"stream without [DONE]: ...{raw[-200:]!r}")
        return
    errors = [json.loads(e)["error"] for e in events[:-1] if e.startswith(b'{"error"')]
    if errors:
        tally.errors[f"stream {errors[-1].get('code')}"] += 1
    else:
        tally.ok += 1


async def clients(url: str, n: int, deadline: float, seed: int, tally: Tally) -> None:
    timeout = aiohttp.ClientTimeout(total=90)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=n)) as session:
        async def loop(i: int) -> None:
            rng = random.Random(seed * 1000 + i)
            while time.monotonic() < deadline:
                await one(session, url, rng, tally)

        await asyncio.gather(*(loop(i) for i in range(n)))


async def chaos(fleet: Fleet, rng: random.Random, deadline: float, every_s: float, time_scale: float,
                tally: Tally) -> None:
    """One fault every ``every_s`` (jittered) on a worker not already faulted; each healed later."""
    busy: set[int] = set()
    healing: list[asyncio.Task[None]] = []

    async def restart(i: int, **faults: Any) -> None:
        w = fleet.workers[i]
        assert isinstance(w, SubprocessWorker)
        w.set_faults(**{**CLEAN, **faults})
        for attempt in range(5):  # a busy machine can make a start miss its readiness bound
            await w.kill()
            try:
                await w.start()
                return
            except (TimeoutError, RuntimeError) as e:
                tally.faults["restart_retried"] += 1
                print(f"soak: restarting worker {i} failed ({e}); attempt {attempt + 2}", file=sys.stderr)
        raise RuntimeError(f"worker {i} did not come back")

    async def fault(i: int, kind: str) -> None:
        try:
            if kind == "kill":
                await fleet.workers[i].kill()
                await asyncio.sleep(rng.uniform(1.0, 3.0))
                await restart(i)
                return
            knobs: dict[str, dict[str, Any]] = {
                "error_rate": {"error_rate": 0.5},
                "die_mid_stream": {"die_after_tokens": rng.randint(50, 400)},
                "hang": {"hang_before_first_token": True},
                "slow_start": {"slow_start": rng.uniform(2.0, 4.0) * time_scale},
            }
            await restart(i, **knobs[kind])
            await asyncio.sleep(rng.uniform(3.0, 6.0))
            await restart(i)
        finally:
            busy.discard(i)

    while time.monotonic() + every_s * 2 < deadline:
        await asyncio.sleep(rng.uniform(0.5, 1.5) * every_s)
        free = [i for i in range(len(fleet.workers)) if i not in busy]
        if not free:
            continue
        i = rng.choice(free)
        kind = rng.choice(["kill", "error_rate", "die_mid_stream", "hang", "slow_start"])
        busy.add(i)
        tally.faults[kind] += 1
        healing.append(asyncio.ensure_future(fault(i, kind)))
    await asyncio.gather(*healing)


async def scrape(admin_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as s, s.get(admin_url + "/metrics") as r:
        text = await r.text()
    out: defaultdict[str, float] = defaultdict(float)  # the samples are floats
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "radixgate_errors_total":
                out["cause:" + sample.labels["cause"]] += sample.value
            elif sample.name in ("radixgate_requests_accepted_total", "radixgate_requests_succeeded_total",
                                 "radixgate_requests_failed_total", "radixgate_retries_total",
                                 "radixgate_worker_ejections_total", "radixgate_upstream_aborts_total"):
                out[sample.name.removeprefix("radixgate_")] += sample.value
    return dict(out)


def tcp_to(ports: set[int]) -> int:
    """ESTABLISHED TCP connections of this process with a local or remote port in ``ports``."""
    return sum(1 for c in psutil.Process().net_connections(kind="tcp")
               if c.status == psutil.CONN_ESTABLISHED
               and (c.laddr.port in ports or (c.raddr and c.raddr.port in ports)))


def snapshot(app: App, fleet: Fleet) -> dict[str, float]:
    gc.collect()
    me = psutil.Process()
    workers = {int(u.rsplit(":", 1)[1]) for u in fleet.urls}
    return {"rss_mib": me.memory_info().rss / 2**20, "tasks": len(asyncio.all_tasks()), "fds": me.num_fds(),
            "public_port_conns": tcp_to({app.http_port}), "upstream_conns": tcp_to(workers)}


async def sample_rss(deadline: float, every_s: float, out: list[float]) -> None:
    while time.monotonic() < deadline:
        await asyncio.sleep(min(every_s, max(0.0, deadline - time.monotonic())))
        out.append(round(psutil.Process().memory_info().rss / 2**20, 1))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tally = Tally()
    configs = [SimConfig(time_scale=args.time_scale, seed=args.seed + i, max_running_requests=32,
                         max_total_tokens=args.kv_tokens) for i in range(args.workers)]
    async with Fleet.subprocesses(configs) as fleet:
        app = App(load(env={}, overrides={
            "workers.static": fleet.urls, "server.port": 0, "server.admin_port": 0, "routing.policy": args.policy,
            "health.interval_s": 0.5, "health.eject_cooldown_s": 2.0, "scrape.interval_s": 0.5,
            "upstream.first_byte_timeout_s": 2.0, "upstream.total_timeout_s": 30.0,
            "admission.queue_timeout_s": 10.0, "telemetry.log_requests": False}), registry=CollectorRegistry())
        await app.start()
        url, admin_url = f"http://127.0.0.1:{app.http_port}", f"http://127.0.0.1:{app.admin_port}"
        try:
            await clients(url, 4, time.monotonic() + 2.0, args.seed + 99, Tally())  # warm-up, not counted
            base = await scrape(admin_url)
            start = snapshot(app, fleet)
            began = time.monotonic()
            deadline = began + args.duration_s
            rss: list[float] = []
            await asyncio.gather(clients(url, args.concurrency, deadline, args.seed, tally),
                                 chaos(fleet, rng, deadline, args.fault_every_s, args.time_scale, tally),
                                 sample_rss(deadline, max(1.0, args.duration_s / 10), rss))
            elapsed = time.monotonic() - began
            await app.pipeline.drained(30.0)  # the last disconnects are recorded
            metrics = {k: v - base.get(k, 0.0) for k, v in (await scrape(admin_url)).items()}
            end = snapshot(app, fleet)
        finally:
            await app.stop(5.0)
    accepted, succeeded, failed = (metrics.get(k, 0.0) for k in
                                   ("requests_accepted_total", "requests_succeeded_total", "requests_failed_total"))
    checks = {
        "nothing unexplained": not tally.unexplained,
        "accepted == succeeded + failed": accepted == succeeded + failed,
        "accepted == sent": accepted == tally.sent,
        "succeeded == ok": succeeded == tally.ok,
        "failed == explicit errors + abandoned": failed == tally.explicit_errors + tally.abandoned,
        "no connection left on the public port": end["public_port_conns"] == 0,
        "no task left behind": end["tasks"] <= start["tasks"],
        # Idle keep-alive connections per worker: at most its peak concurrency, plus probes / scrapes.
        "upstream connections bounded": end["upstream_conns"] <= args.workers * (args.concurrency + 2),
    }
    return {"duration_s": round(elapsed, 1), "workers": args.workers, "concurrency": args.concurrency,
            "seed": args.seed, "faults": dict(tally.faults),
            "client": {"sent": tally.sent, "ok": tally.ok, "explicit_errors": dict(tally.errors),
                       "abandoned": tally.abandoned, "unexplained": len(tally.unexplained)},
            "unexplained_examples": tally.unexplained[:5], "proxy": metrics,
            "start": start, "end": end, "rss_mib_during": rss, "checks": checks, "passed": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__.split("\n")[0])
    p.add_argument("--duration-s", type=float, default=150.0)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=24)
    p.add_argument("--fault-every-s", type=float, default=5.0)
    p.add_argument("--time-scale", type=float, default=20.0, help="simulated workers run this much faster")
    p.add_argument("--policy", default="round_robin")
    p.add_argument("--kv-tokens", type=int, help="each worker's KV pool (default: its profile's); the proxy's "
                   "routing-quality cache is sized to the fleet's KV and grows until it holds that much")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    import uvloop

    result = uvloop.run(run(args))
    c, m, s, e = result["client"], result["proxy"], result["start"], result["end"]
    print(f"soak: {result['duration_s']} s, {args.workers} workers, {args.concurrency} clients, seed {args.seed}")
    print(f"faults injected: {result['faults']}")
    print(f"client: sent {c['sent']}, ok {c['ok']}, explicit errors {sum(c['explicit_errors'].values())} "
          f"{c['explicit_errors']}, abandoned {c['abandoned']}, unexplained {c['unexplained']}")
    for example in result["unexplained_examples"]:
        print(f"  unexplained: {example}")
    print(f"proxy /metrics: accepted {m.get('requests_accepted_total', 0):.0f}, succeeded "
          f"{m.get('requests_succeeded_total', 0):.0f}, failed {m.get('requests_failed_total', 0):.0f}; "
          f"retries {m.get('retries_total', 0):.0f}, ejections {m.get('worker_ejections_total', 0):.0f}, "
          f"aborts {m.get('upstream_aborts_total', 0):.0f}; errors by cause "
          f"{ {k[6:]: int(v) for k, v in m.items() if k.startswith('cause:') and v} }")
    print(f"memory: RSS {s['rss_mib']:.1f} MiB after warm-up, {e['rss_mib']:.1f} MiB at the end "
          f"({e['rss_mib'] - s['rss_mib']:+.1f} MiB); during the run (MiB): {result['rss_mib_during']}")
    print(f"tasks {s['tasks']} -> {e['tasks']}, fds {s['fds']} -> {e['fds']}, "
          f"public-port connections {s['public_port_conns']} -> {e['public_port_conns']}, "
          f"upstream connections {s['upstream_conns']} -> {e['upstream_conns']}")
    for name, ok in result["checks"].items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
