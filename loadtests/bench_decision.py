"""Cost of one routing decision on a long prompt, and the prefix index's memory.

    python -m loadtests.bench_decision [--iterations 2000] [--workers 8] [--prompt-tokens 32000]

1. Decision cost: for each policy, time ``build_route_request`` (canonicalise + hash) plus
   ``policy.select`` (+ ``on_complete`` outside the timed part) on distinct 32k-token prompts
   (~128k characters) that share a 2k-token system prompt with 1 of 16 groups, over 8 workers
   whose indexes are already warm, with the garbage-collector settings ``radixgate serve`` runs
   with (``proxy/gctune.py``: start-up heap frozen, young generation at 20,000). Prints p50 / p99
   / max in microseconds.
2. Index memory: fill 8 ``WorkerIndex`` of 500k KV tokens each to capacity with 16-token blocks
   (the worst case: short prompts, every block one unit), and report the resident-set growth
   (psutil).

Goals (issue 4): decision <= 200 us p99 on a 32k-token prompt; index <= 100 MB for 8 x 500k.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import psutil

from loadtests.gpu.fleet import routing_section
from proxy.gctune import settle_after_startup
from proxy.loadgen.workloads import words
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import Completion, WorkerSnapshot
from proxy.routing.prefix_index import WorkerIndex
from proxy.routing.prefix_key import BLOCKS_PER_DOUBLING, build_route_request
from proxy.routing.registry import build_named

POLICIES = ("ttft", "consistent_hash", "least_load", "round_robin", "cache_aware")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_decisions(policy_name: str, iterations: int, n_workers: int, prompt_tokens: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    workers = [
        WorkerSnapshot(f"http://w{i}", running=rng.randrange(32), queued=rng.randrange(4),
                       waiting_uncached_tokens=rng.randrange(20_000), max_running_requests=64,
                       max_total_tokens=500_000, token_usage=0.5)
        for i in range(n_workers)
    ]
    systems = [words(rng, 2048) for _ in range(16)]
    # One long body reused at random offsets keeps prompts distinct without generating 128k
    # random characters per iteration.
    body = words(rng, prompt_tokens * 2)
    # "ttft/popularity=false": a policy with its params changed (the fleet benchmark's router
    # spec), so variants are timed side by side
    section = routing_section(policy_name)
    policy = build_named(section["policy"], section["params"], rng=random.Random(seed))
    samples: list[float] = []
    settle_after_startup()  # the collector settings `radixgate serve` runs with (proxy/gctune.py)
    for i in range(iterations):
        start = rng.randrange(0, len(body) // 2)
        text = systems[i % len(systems)] + body[start : start + 4 * (prompt_tokens - 2048)]
        req = GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", text=text)
        t0 = time.perf_counter_ns()
        route = build_route_request(req, block_tokens=16, chars_per_token=4.0, max_blocks=2048)
        decision = policy.select(route, workers)
        samples.append((time.perf_counter_ns() - t0) / 1000)
        policy.on_complete(Completion(decision.worker, route, ok=True, prompt_tokens=route.prompt_tokens,
                                      cached_tokens=0, ttft=0.5))
    return samples[iterations // 10 :]  # drop warm-up


def bench_index_memory(n_workers: int, kv_tokens: int, block_tokens: int = 16) -> tuple[float, int]:
    """(resident-set growth in MB, blocks held) after filling every worker's index to capacity."""
    gc.collect()
    process = psutil.Process()
    rss_before = process.memory_info().rss
    indexes = [WorkerIndex(kv_tokens) for _ in range(n_workers)]
    rng = random.Random(1)
    for index in indexes:
        # Short prompts (all one-unit blocks, the most entries per token), until the LRU is full.
        while index.tokens < kv_tokens:
            index.record([rng.getrandbits(64) for _ in range(2 * BLOCKS_PER_DOUBLING)], block_tokens)
    gc.collect()
    rss_after = process.memory_info().rss
    return (rss_after - rss_before) / 2**20, sum(len(i) for i in indexes)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=2000)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=32_000)
    ap.add_argument("--kv-tokens", type=int, default=500_000)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"decision cost, {args.prompt_tokens}-token prompts (~{4 * args.prompt_tokens} chars), "
          f"{args.workers} workers, hashing included, {args.iterations} decisions")
    print(f"{'policy':<16} {'p50 us':>8} {'p99 us':>8} {'max us':>8}")
    for name in args.policies.split(","):
        s = bench_decisions(name, args.iterations, args.workers, args.prompt_tokens, args.seed)
        print(f"{name:<16} {statistics.median(s):8.0f} {percentile(s, 0.99):8.0f} {max(s):8.0f}")
    rss_mb, blocks = bench_index_memory(args.workers, args.kv_tokens)
    print(f"prefix index, {args.workers} workers x {args.kv_tokens} KV tokens in 16-token blocks: "
          f"{blocks} blocks, resident set +{rss_mb:.1f} MB")


if __name__ == "__main__":
    main()
