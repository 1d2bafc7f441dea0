"""Cost per request by stage: GPU-seconds of queue admission, prefill, decode and idle, times a price.

Accounting (pure; every GPU-second of the window is charged to exactly one request and stage):

1. The bill is the fleet's GPU time over the window: span (first request received → last done)
   x workers x ``gpus_per_worker``. Price = GPU-seconds x ``price_per_gpu_hour`` / 3600.
2. Each request lives on its worker as three intervals: *queue* = dispatch → dispatch + the worker's
   reported ``queue_time`` (0 when not reported), *prefill* = end of queue → first token, *decode* =
   first token → last token (or done). A request that produced no token stays in prefill until done.
3. Each worker's timeline is swept (O(n log n) via running integrals of 1 / active count):
   * while requests are **running** (prefill or decode) the worker's GPU time is shared equally among
     them (processor sharing: a continuous batch advances every member each step), charged to each
     request's current stage;
   * while nothing runs but requests **wait**, the GPU is held idle with work queued: that time is
     *queue admission*, shared among the waiting requests (queueing behind running work costs
     latency, not GPU time, so it is not charged);
   * while nothing runs or waits the GPU is **idle** with no demand; that time is shared evenly over
     every request of the window (the cost of keeping the fleet up).
4. When NVML reports the idle share, the idle time it measured beyond the no-demand and queue-only
   time is the gaps *between passes inside busy periods*; that fraction of every request's
   prefill/decode charge moves to *idle* (fleet-mean share, as NVML GPUs are not mapped to workers).
   When NVML is unknown those gaps stay inside prefill/decode and ``busy_gaps_known`` is False.

The stage with the largest share of the bill "drives" it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.diagnose.signals import Distribution
from proxy.diagnose.window import RequestRecord

STAGES = ("queue", "prefill", "decode", "idle")


@dataclass(frozen=True, slots=True)
class StageCost:
    stage: str
    gpu_seconds: float
    share: float
    # Per request, GPU-seconds.
    per_request: Distribution
    mean_per_request: float
    cost_per_request: float


@dataclass(frozen=True, slots=True)
class CostReport:
    stages: tuple[StageCost, ...] = ()
    requests: int = 0
    total_gpu_seconds: float = 0.0
    total_cost: float = 0.0
    cost_per_request: float | None = None
    price_per_gpu_hour: float = 0.0
    gpus_per_worker: int = 1
    driver: str | None = None
    busy_gaps_known: bool = False

    def stage(self, name: str) -> StageCost | None:
        return next((s for s in self.stages if s.stage == name), None)


@dataclass(frozen=True, slots=True)
class _Interval:
    request: int
    stage: str
    start: float
    end: float


def _end(r: RequestRecord) -> float:
    t = r.timing
    for mark in (t.done, t.last_token, t.first_token, t.dispatched):
        if mark is not None:
            return mark
    return t.received


def _intervals(i: int, r: RequestRecord, lo: float, hi: float) -> list[_Interval]:
    t = r.timing
    if t.dispatched is None:
        return []
    end = _end(r)
    first = t.first_token if t.first_token is not None else end
    queue_end = min(first, t.dispatched + max(0.0, t.worker_queue_time or 0.0))
    decode_end = t.last_token if t.last_token is not None else end
    spans = [("queue", t.dispatched, queue_end), ("prefill", queue_end, first), ("decode", first, decode_end)]
    out = []
    for stage, a, b in spans:
        a, b = max(lo, a), min(hi, b)
        if b > a:
            out.append(_Interval(i, stage, a, b))
    return out


def _sweep(intervals: Sequence[_Interval], lo: float, hi: float) -> tuple[dict[int, dict[str, float]], float]:
    """Charge one worker's time to its intervals; returns charges and the no-demand idle time."""
    events: list[tuple[float, int, int]] = []  # (time, +1 start / -1 end, interval index)
    for k, iv in enumerate(intervals):
        events.append((iv.start, 1, k))
        events.append((iv.end, -1, k))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    running_integral = queue_integral = idle = 0.0
    n_running = n_queued = 0
    prev = lo
    opened: dict[int, float] = {}
    charges: dict[int, dict[str, float]] = {}
    for t, delta, k in events:
        span = t - prev
        if span > 0:
            if n_running:
                running_integral += span / n_running
            elif n_queued:
                queue_integral += span / n_queued
            else:
                idle += span
            prev = t
        iv = intervals[k]
        is_queue = iv.stage == "queue"
        now = queue_integral if is_queue else running_integral
        if delta > 0:
            opened[k] = now
        else:
            stages = charges.setdefault(iv.request, dict.fromkeys(STAGES, 0.0))
            stages[iv.stage] += now - opened.pop(k)
        if is_queue:
            n_queued += delta
        else:
            n_running += delta
    idle += max(0.0, hi - prev)
    return charges, idle


def stage_costs(
    records: Sequence[RequestRecord],
    *,
    workers: Iterable[str] = (),
    price_per_gpu_hour: float,
    gpus_per_worker: int = 1,
    gpu_idle_share: float | None = None,
) -> CostReport:
    """Charge the window's GPU time to its requests by stage (see the module docstring)."""
    charged = [r for r in records if r.timing.dispatched is not None]
    if not charged:
        return CostReport(price_per_gpu_hour=price_per_gpu_hour, gpus_per_worker=gpus_per_worker)
    lo = min(r.timing.received for r in charged)
    hi = max(_end(r) for r in charged)
    span = max(0.0, hi - lo)
    fleet = sorted(set(workers) | {r.worker for r in charged})
    per_request = [dict.fromkeys(STAGES, 0.0) for _ in charged]
    no_demand = queue_only = 0.0
    for worker in fleet:
        ivs = [iv for i, r in enumerate(charged) if r.worker == worker for iv in _intervals(i, r, lo, hi)]
        charges, idle = _sweep(ivs, lo, hi)
        no_demand += idle
        for i, stages in charges.items():
            for stage, seconds in stages.items():
                per_request[i][stage] += seconds
                if stage == "queue":
                    queue_only += seconds
    busy_gaps_known = gpu_idle_share is not None
    if gpu_idle_share is not None:
        busy = span * len(fleet) - no_demand - queue_only
        gaps = min(max(0.0, gpu_idle_share * span * len(fleet) - no_demand - queue_only), max(0.0, busy))
        fraction = gaps / busy if busy > 0 else 0.0
        for stages in per_request:
            moved = (stages["prefill"] + stages["decode"]) * fraction
            stages["prefill"] *= 1 - fraction
            stages["decode"] *= 1 - fraction
            stages["idle"] += moved
    amortised = no_demand / len(charged)
    for stages in per_request:
        stages["idle"] += amortised
    scale = float(gpus_per_worker)
    price_per_s = price_per_gpu_hour / 3600.0
    total = span * len(fleet) * scale
    out = []
    for stage in STAGES:
        values = [s[stage] * scale for s in per_request]
        seconds = sum(values)
        mean = seconds / len(values)
        out.append(StageCost(stage, seconds, seconds / total if total > 0 else 0.0,
                             Distribution.of(values), mean, mean * price_per_s))
    driver = max(out, key=lambda s: s.gpu_seconds).stage if total > 0 else None
    return CostReport(
        stages=tuple(out),
        requests=len(charged),
        total_gpu_seconds=total,
        total_cost=total * price_per_s,
        cost_per_request=total * price_per_s / len(charged),
        price_per_gpu_hour=price_per_gpu_hour,
        gpus_per_worker=gpus_per_worker,
        driver=driver,
        busy_gaps_known=busy_gaps_known,
    )
