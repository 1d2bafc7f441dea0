"""How long one diagnosis takes over a full window (the cost of /diagnosis, /metrics and the refresh).

    .venv/bin/python -m loadtests.bench_diagnosis [--requests 1000] [--blocks 32 64 128] [--repeat 5]

Builds a window of finished requests over 50 shared prefixes (each prompt ``blocks`` hash blocks of
16 tokens in routing/prefix_key.py's growing layout, 64 streamed tokens each) on 4 workers with 600
snapshot samples, then times ``Diagnoser.diagnose()`` (signals + cache replay + rules + cost).
Bounded: ``repeat`` diagnoses per size.
"""

from __future__ import annotations

import argparse
import random
import time

from proxy.clock import ManualClock
from proxy.diagnose.service import Diagnoser
from proxy.diagnose.window import DiagnosisWindows, RequestRecord
from proxy.routing.base import WorkerSnapshot
from proxy.routing.prefix_key import prefix_tokens
from proxy.timing import RequestTiming


def window(requests: int, blocks: int, rng: random.Random) -> DiagnosisWindows:
    w = DiagnosisWindows(ManualClock(), max_requests=requests, max_age_s=0)
    for i in range(requests):
        family = rng.randrange(50)
        dispatched = i * 0.01 + 0.0002
        t = RequestTiming(received=i * 0.01, admitted=i * 0.01, dispatched=dispatched)
        now = dispatched + 0.05
        for _ in range(64):
            t.mark_token(now)
            now += 0.01
        t.done = now
        tokens = prefix_tokens(blocks, 16)
        w.record(RequestRecord(timing=t, worker=f"w{i % 4}", prompt_tokens=tokens, cached_tokens=0,
                               completion_tokens=64, block_hashes=tuple(family * 10_000 + b for b in range(blocks)),
                               block_tokens=16, estimated_prompt_tokens=tokens, policy="cache_aware"))
    for _ in range(600):
        w.observe([WorkerSnapshot(f"w{k}", running=3, queued=0, max_running_requests=16, token_usage=0.3,
                                  max_total_tokens=200_000) for k in range(4)])
    return w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(1)
    for blocks in args.blocks:
        w = window(args.requests, blocks, rng)
        d = Diagnoser(w, ManualClock())
        start = time.perf_counter()
        for _ in range(args.repeat):
            d.diagnose()
        ms = (time.perf_counter() - start) / args.repeat * 1000
        print(f"{args.requests} requests x {blocks} blocks ({prefix_tokens(blocks, 16)} tokens each): "
              f"{ms:.0f} ms per diagnosis")


if __name__ == "__main__":
    main()
