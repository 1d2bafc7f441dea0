"""``radixgate demo``: the proxy in front of simulated SGLang workers under a real workload.

What it does, end to end, on loopback:
1. starts a fleet of simulated SGLang workers (one OS process each; Llama-3.1-8B on H100 by
   default, real time unless ``--time-scale`` says otherwise) with a deliberately modest KV pool;
2. starts radixgate in this process (default routing policy) in front of them;
3. replays one seeded shared-prefix workload open-loop (Poisson arrivals) through the proxy, and
   then — after flushing the workers' caches — the same trace through ``round_robin``, so the
   routing lever shows up as a number rather than a claim;
4. prints, for each run, the client-side TTFT/e2e and the accounting (sent = ok + failed), and for
   the default policy the proxy's own stage breakdown, the four numbers and the verdict, read
   from its admin port (``GET /diagnosis``) exactly as an operator would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from proxy import config as config_mod
from proxy.app import App
from proxy.diagnose.report import render_tail, render_text
from proxy.loadgen.arrivals import poisson_times
from proxy.loadgen.client import Sample, flush, send
from proxy.loadgen.workloads import RequestSpec, shared_prefix
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet


@dataclass(frozen=True)
class RunSummary:
    policy: str
    sent: int
    ok: int
    failed: int
    ttft: list[float]
    e2e: list[float]
    cached_share: float
    wall_s: float


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _ms(v: float | None) -> str:
    return "   n/a" if v is None else f"{v * 1000:7.0f} ms"


async def _drive(base_url: str, specs: Sequence[RequestSpec], times: Sequence[float], policy: str,
                 stream_interval: int) -> RunSummary:
    start = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(i: int) -> Sample:
            delay = start + times[i] - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            return await send(session, base_url, specs[i], f"demo-{policy}-{i}", stream_interval)

        samples = await asyncio.gather(*(one(i) for i in range(len(specs))))
    ok = [s for s in samples if s.ok]
    prompt = sum(s.prompt_tokens for s in ok)
    return RunSummary(
        policy=policy, sent=len(samples), ok=len(ok), failed=len(samples) - len(ok),
        ttft=[s.first - s.sent for s in ok if s.first is not None],
        e2e=[s.done - s.sent for s in ok if s.done is not None],
        cached_share=(sum(s.cached_tokens for s in ok) / prompt) if prompt else 0.0,
        wall_s=time.perf_counter() - start,
    )


async def _run_policy(policy: str, urls: list[str], specs: Sequence[RequestSpec], times: Sequence[float],
                      args: argparse.Namespace) -> tuple[RunSummary, dict[str, Any] | None, dict[str, Any] | None]:
    """The run's client summary, its diagnosis, and its slowest requests (GET /diagnosis/tail)."""
    cfg = config_mod.load(env={}, overrides={
        "server.port": 0, "server.admin_port": 0, "routing.policy": policy,
        "workers.static": list(urls), "telemetry.log_requests": False,
        "diagnose.slo_ttft_p95_s": args.slo_ttft_s, "diagnose.refresh_s": 0.5,
        **dict(args.set),
    })
    app = App(cfg)
    await app.start()
    try:
        await _wait_ready(app, len(urls))
        summary = await _drive(f"http://127.0.0.1:{app.http_port}", specs, times, policy, 1)
        await asyncio.sleep(1.0)  # let the diagnosis refresh over the finished window
        doc = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{app.admin_port}/diagnosis")
        tail = await asyncio.to_thread(_get_json, f"http://127.0.0.1:{app.admin_port}/diagnosis/tail?n=5")
        return summary, doc, tail
    finally:
        await app.stop(grace_s=5.0)


async def _wait_ready(app: App, n_workers: int, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if sum(1 for s in app.workers.published() if s.healthy and s.running is not None) >= n_workers:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("workers did not become healthy and scraped in time")


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def _print_summary(s: RunSummary) -> None:
    print(f"  {s.policy:<12} sent {s.sent:4d} = ok {s.ok:4d} + failed {s.failed:3d}   "
          f"TTFT p50 {_ms(_pct(s.ttft, 0.5))}  p95 {_ms(_pct(s.ttft, 0.95))}   "
          f"e2e p50 {_ms(_pct(s.e2e, 0.5))}  p95 {_ms(_pct(s.e2e, 0.95))}   "
          f"prefix cached {s.cached_share:6.1%}")


async def main_async(args: argparse.Namespace) -> int:
    specs = make_specs(args, seed=args.seed)
    times = poisson_times(args.rate, len(specs), random.Random(args.seed))
    sim = SimConfig(profile=args.profile, time_scale=args.time_scale, enable_metrics=True,
                    enable_cache_report=True, max_total_tokens=args.kv_tokens,
                    max_running_requests=args.max_running_requests)
    if args.worker:
        print(f"radixgate demo: {len(args.worker)} external SGLang-protocol workers: {', '.join(args.worker)}")
    else:
        print(f"radixgate demo: {args.workers} simulated SGLang workers ({args.profile}, time scale "
              f"{args.time_scale:g}, KV pool {args.kv_tokens} tokens, max running {args.max_running_requests})")
    print(f"workload: shared prefix, {args.groups} groups x {args.prompts_per_group} prompts, "
          f"{args.system_tokens}-token system prompt + {args.question_tokens}-token question, "
          f"{args.output_tokens} output tokens; {len(specs)} requests, Poisson {args.rate:g} req/s "
          f"(~{times[-1]:.0f} s per run)\n")
    policies = [args.policy] + [p for p in args.compare if p != args.policy]
    results: list[RunSummary] = []
    doc: dict[str, Any] | None = None
    tail: dict[str, Any] | None = None
    verdicts: dict[str, str] = {}
    async with contextlib.AsyncExitStack() as stack:
        if args.worker:
            urls = list(args.worker)
        else:
            urls = (await stack.enter_async_context(Fleet.subprocesses([sim] * args.workers))).urls
        for i, policy in enumerate(policies):
            if i and not args.worker:
                await _flush(urls)
            elif i:
                # External engines may not support /flush_cache: give each run a trace of the same
                # shape with fresh text, so no run inherits another's cache.
                specs = make_specs(args, seed=args.seed + i)
            print(f"... running {policy}", flush=True)
            summary, d, t = await _run_policy(policy, urls, specs, times, args)
            results.append(summary)
            if i == 0:
                doc, tail = d, t
            if d is not None:
                verdicts[policy] = str(d['verdict']['summary'])
            if args.save_dir:
                _save(args.save_dir, policy, summary, d)
    how = ("same shape, fresh text per run" if args.worker else "same trace, caches flushed between runs")
    print(f"\nClient-side results ({how})")
    for s in results:
        _print_summary(s)
    if len(results) > 1 and results[0].ttft and results[1].ttft:
        a, b = _pct(results[0].ttft, 0.95), _pct(results[1].ttft, 0.95)
        if a and b:
            print(f"  -> {results[0].policy} TTFT p95 is {a / b:.2f}x {results[1].policy}'s")
    print("\nradixgate's verdict on each run")
    for policy, line in verdicts.items():
        print(f"  {policy:<12} {line}")
    if doc is not None:
        print(f"\nWhat radixgate reports for the {results[0].policy} run (GET /diagnosis on its admin port)\n")
        print(render_text(doc))
    if tail is not None:
        print("\n" + render_tail(tail))
    lost = sum(s.failed for s in results)
    return 0 if lost == 0 else 1


def make_specs(args: argparse.Namespace, *, seed: int) -> list[RequestSpec]:
    return shared_prefix(groups=args.groups, prompts_per_group=args.prompts_per_group,
                         system_tokens=args.system_tokens, question_tokens=args.question_tokens,
                         output_tokens=args.output_tokens, seed=seed)


def _save(folder: str, policy: str, summary: RunSummary, doc: dict[str, Any] | None) -> None:
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    client = {"policy": summary.policy, "sent": summary.sent, "ok": summary.ok, "failed": summary.failed,
              "ttft_p50": _pct(summary.ttft, 0.5), "ttft_p95": _pct(summary.ttft, 0.95),
              "e2e_p50": _pct(summary.e2e, 0.5), "e2e_p95": _pct(summary.e2e, 0.95),
              "cached_share": summary.cached_share, "wall_s": summary.wall_s}
    (out / f"client_{policy}.json").write_text(json.dumps(client, indent=1))
    if doc is not None:
        (out / f"diagnosis_{policy}.json").write_text(json.dumps(doc, indent=1))
        (out / f"diagnosis_{policy}.txt").write_text(render_text(doc) + "\n")


async def _flush(urls: Sequence[str]) -> None:
    async with aiohttp.ClientSession() as session:
        await flush(session, list(urls))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="radixgate demo", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--profile", default="llama-3.1-8b-h100")
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--kv-tokens", type=int, default=24_000, help="each worker's KV pool (tokens)")
    p.add_argument("--max-running-requests", type=int, default=32)
    p.add_argument("--policy", default=config_mod.RoutingConfig().policy, help="policy under test")
    p.add_argument("--compare", nargs="*", default=["round_robin", "cache_aware"],
                   help="baseline policies (cache_aware = SGLang router's algorithm)")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prompts-per-group", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=4096)
    p.add_argument("--question-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--rate", type=float, default=20.0, help="arrivals per second")
    p.add_argument("--slo-ttft-s", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--worker", action="append", default=[], metavar="URL",
                   help="use these running SGLang-protocol workers instead of a simulated fleet")
    p.add_argument("--save-dir", help="write each run's client summary and diagnosis (JSON + text) here")
    p.add_argument("--set", action="append", default=[], type=_setting, metavar="KEY=VALUE",
                   help="a proxy config field for every run, e.g. routing.hold_max_s=0 (YAML value)")
    return p


def _setting(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, config_mod.parse_scalar(value)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import uvloop

    return uvloop.run(main_async(args))

