"""CLI: ``python -m loadtests.simworker --port PORT [SGLang-style flags]`` serves one simulated worker.

Prints ``READY http://HOST:PORT`` as its first stdout line once listening (useful with --port 0).
Exits 0 on SIGTERM/SIGINT, 3 when the die-after-tokens fault fires.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence

from .config import SimConfig
from .perf import PROFILES
from .server import SimWorker

DIED_EXIT_CODE = 3


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    p = argparse.ArgumentParser(prog="python -m loadtests.simworker", description=__doc__)
    d = SimConfig()
    p.add_argument("--host", default=d.host)
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--profile", default=d.profile, choices=sorted(PROFILES))
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
    p.add_argument("--fault-die-after-tokens", type=int)
    p.add_argument("--fault-hang-before-first-token", action="store_true")
    p.add_argument("--fault-error-rate", type=float, default=0.0)
    p.add_argument("--fault-slow-start", type=float, default=0.0)
    p.add_argument("--fault-fail-health", action="store_true")
    ns = p.parse_args(argv)
    config = SimConfig(**vars(ns))
    config.validate()
    return config


async def serve(config: SimConfig) -> int:
    done = asyncio.Event()
    died = False

    def on_die() -> None:
        nonlocal died
        died = True
        done.set()

    worker = SimWorker(config, on_die=on_die)
    await worker.start()
    print(f"READY {worker.url}", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, done.set)
    await done.wait()
    await worker.stop()
    return DIED_EXIT_CODE if died else 0


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run(serve(config))
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
