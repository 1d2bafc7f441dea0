"""Builders shared by the diagnosis tests: finished request records and baseline signals."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.diagnose.cache_replay import CacheSignal
from proxy.diagnose.signals import (
    Distribution,
    LatencySignal,
    OccupancySignal,
    Signals,
    WindowInfo,
)
from proxy.diagnose.window import RequestRecord
from proxy.routing.prefix_key import prefix_tokens
from proxy.telemetry.gpu import GpuIdle, GpuReport
from proxy.timing import RequestTiming


def record(
    *,
    worker: str = "http://w0",
    received: float = 0.0,
    admission: float = 0.0,
    overhead: float = 0.0,
    queue: float | None = None,
    prefill: float = 0.1,
    gaps: Sequence[float] = (0.02, 0.02),
    blocks: Sequence[int] = (),
    block_tokens: int = 16,
    prompt: int | None = None,
    cached: int | None = 0,
    outcome: str = "ok",
    policy: str = "",
) -> RequestRecord:
    """A finished request: received → admitted → dispatched → (queue) → first token → tokens."""
    t = RequestTiming(received=received)
    t.admitted = received + admission
    t.dispatched = t.admitted + overhead
    t.worker_queue_time = queue
    t.mark_token(t.dispatched + (queue or 0.0) + prefill)
    now = t.first_token or 0.0
    for g in gaps:
        now += g
        t.mark_token(now)
    t.done = now
    tokens = prefix_tokens(len(blocks), block_tokens)
    t.prompt_tokens = prompt if prompt is not None else (tokens or 100)
    t.cached_tokens = cached
    t.completion_tokens = len(gaps) + 1
    return RequestRecord(
        timing=t, worker=worker, outcome=outcome, prompt_tokens=t.prompt_tokens, cached_tokens=cached,
        completion_tokens=t.completion_tokens, block_hashes=tuple(blocks), block_tokens=block_tokens,
        estimated_prompt_tokens=tokens, policy=policy,
    )


def chain(prefix: int, n: int) -> tuple[int, ...]:
    """Chained block hashes of a prompt: blocks of one prefix family share their first hashes."""
    return tuple(prefix * 1_000 + i for i in range(n))


def dist(p50: float | None, p95: float | None, n: int = 200) -> Distribution:
    return Distribution(n if p50 is not None else 0, p50, p95)


def gpu(idle: float | None) -> GpuReport:
    if idle is None:
        return GpuReport.unavailable("no GPU in this test")
    return GpuReport(available=True, gpus=(GpuIdle(0, idle, 100, "samples"),), window_s=60.0)


def healthy_signals() -> Signals:
    """A fleet doing well: cache captures what is available, half occupied, fast, under SLO."""
    return Signals(
        window=WindowInfo(requests=200, ok=200, errors=0, span_s=60.0, snapshot_samples=120),
        cache=CacheSignal(captured=0.60, available=0.62, reuse_ceiling=0.65, capacity_tokens=1_000_000,
                          reporting_requests=200, prompt_tokens=200_000),
        occupancy=OccupancySignal(occupancy_mean=0.40, token_usage_mean=0.40, queued_mean=0.0,
                                  queueing_share=0.0, samples=120),
        latency=LatencySignal(ttft=dist(0.2, 0.5), worker_queue=dist(0.0, 0.01), admission_wait=dist(0.0, 0.0),
                              proxy_overhead=dist(0.001, 0.002), itl=dist(0.020, 0.025, 4000),
                              proxy_overhead_share=0.01),
        gpu=gpu(None),
        block_tokens=(16,),
        page_sizes=(1,),
        policies=("cache_aware",),
    )
