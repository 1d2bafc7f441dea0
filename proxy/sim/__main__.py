"""CLI: ``python -m proxy.sim --port PORT [SGLang-style flags]`` serves one simulated worker.

Prints ``READY http://HOST:PORT`` as its first stdout line once listening (useful with --port 0).
``--count N --shared-gpu`` serves N workers from this one process on one simulated GPU (as N
engine processes sharing a GPU; ports PORT, PORT+1, ... or all 0), one READY line each.
Exits 0 on SIGTERM/SIGINT, 3 when the die-after-tokens fault fires.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import signal
import sys
from collections.abc import Sequence

from proxy.clock import MonotonicClock
from proxy.sim.config import SimConfig
from proxy.sim.gpu_realtime import RealTimeGpu
from proxy.sim.gpu_share import gpu_pool
from proxy.sim.kv_publish import offset_config
from proxy.sim.perf import PROFILES
from proxy.sim.server import SimWorker

DIED_EXIT_CODE = 3


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    """The worker's SimConfig from its command line (``--count`` / ``--shared-gpu`` aside)."""
    return parse_cli(argv)[0]


def parse_cli(argv: Sequence[str] | None = None) -> tuple[SimConfig, int, bool]:
    """(config, workers to serve, whether they share one GPU)."""
    p = argparse.ArgumentParser(prog="python -m proxy.sim", description=__doc__)
    d = SimConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--profile", default=d.profile, choices=sorted(PROFILES))
    p.add_argument("--profile-set", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a profile constant (repeatable), e.g. the output of loadtests.fit_steps")
    p.add_argument("--time-scale", type=float, default=d.time_scale)
    p.add_argument("--served-model-name", default=d.served_model_name)
    p.add_argument("--worker-id", default=None)
    p.add_argument("--api-key", default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-cache-report", action="store_true")
    p.add_argument("--minimal-reports", action="store_true",
                   help="report no cached_tokens and serve no /v1/loads (an engine without cache reports)")
    p.add_argument("--tokenizer", default=None, help="Hugging Face tokenizer.json (file or directory)")
    p.add_argument("--max-running-requests", type=int)
    p.add_argument("--max-total-tokens", type=int)
    p.add_argument("--page-size", type=int, default=d.page_size)
    p.add_argument("--kv-events-config", default=None,
                   help='as SGLang: \'{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}\'')
    p.add_argument("--kv-events-at", default=d.kv_events_at, choices=("prefill", "schedule"),
                   help="when a prompt's blocks are published: after its prefill (SGLang) or when scheduled (vLLM)")
    p.add_argument("--schedule-policy", default=d.schedule_policy, choices=("fcfs", "lpm"))
    p.add_argument("--chunked-prefill-size", type=int)
    p.add_argument("--max-prefill-tokens", type=int, default=d.max_prefill_tokens)
    p.add_argument("--max-queued-requests", type=int)
    p.add_argument("--prefill-max-requests", type=int)
    p.add_argument("--stream-interval", type=int, default=d.stream_interval)
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--enable-mixed-chunk", action="store_true")
    p.add_argument("--context-length", type=int)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--responses-store-max", type=int, default=d.responses_store_max,
                   help="stored /v1/responses responses kept (least recently stored dropped first)")
    p.add_argument("--fault-die-after-tokens", type=int)
    p.add_argument("--fault-hang-before-first-token", action="store_true")
    p.add_argument("--fault-error-rate", type=float, default=0.0)
    p.add_argument("--fault-slow-start", type=float, default=0.0)
    p.add_argument("--fault-fail-health", action="store_true")
    p.add_argument("--count", type=int, default=1, help="workers served by this process")
    p.add_argument("--shared-gpu", action="store_true", help="the --count workers share one GPU")
    ns = vars(p.parse_args(argv))
    count, shared = ns.pop("count"), ns.pop("shared_gpu")
    if count < 1:
        p.error("--count must be >= 1")
    if ns["tokenizer"] and importlib.util.find_spec("tokenizers") is None:
        p.error("--tokenizer needs the tokenizers package: pip install 'radixgate[bpe]'")
    ns["profile_set"] = tuple(ns["profile_set"])
    config = SimConfig(**ns)
    try:
        config.validate()
    except ValueError as e:
        p.error(str(e))
    return config, count, shared


async def serve(config: SimConfig, count: int = 1, shared_gpu: bool = False) -> int:
    done = asyncio.Event()
    died = False

    def on_die() -> None:
        nonlocal died
        died = True
        done.set()

    # one clock for the shared GPU and its engines (SimWorker's default is a MonotonicClock too)
    clock = MonotonicClock()
    gpu = RealTimeGpu(gpu_pool(config.resolved_profile(), count), clock) if shared_gpu else None
    workers = []
    for i in range(count):
        port = config.port + i if config.port else 0
        kv = offset_config(config.kv_events_config, i) if config.kv_events_config else None
        worker = SimWorker(dataclasses.replace(config, port=port, seed=config.seed + i, kv_events_config=kv),
                           on_die=on_die, gpu=gpu, clock=clock)
        await worker.start()
        workers.append(worker)
        print(f"READY {worker.url}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    for worker in workers:
        await worker.stop()
    return DIED_EXIT_CODE if died else 0


def main(argv: Sequence[str] | None = None) -> int:
    config, count, shared = parse_cli(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(serve(config, count, shared))
    return asyncio.run(serve(config, count, shared))


if __name__ == "__main__":
    sys.exit(main())
