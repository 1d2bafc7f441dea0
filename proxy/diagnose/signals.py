"""Signals: pure functions from the windows (finished requests, worker snapshots, GPU report) to numbers.

**Prefix cache**: captured vs available vs reuse ceiling (``cache_replay.py`` says how each is
counted). **Occupancy**: running / max_running_requests and KV token usage per worker, averaged over
the snapshot samples (stale snapshots skipped). **Latency split**: TTFT, worker queue time, admission
wait and proxy overhead p50/p95 over successful requests; inter-token latency over every token gap,
jitter = ITL p95 / p50. **Proxy overhead share** = Σ proxy overhead / Σ TTFT. **GPU idle** is passed
through from ``telemetry.gpu`` and stays ``None`` when unknown.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from proxy.diagnose.cache_replay import CacheSignal, cache_resets, cache_signal, fleet_capacity_tokens
from proxy.diagnose.shadow import Replay, ShadowResult, replay
from proxy.diagnose.window import RequestRecord, SnapshotSample
from proxy.telemetry.gpu import GpuReport
from proxy.timing import RequestTiming


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


@dataclass(frozen=True, slots=True)
class Distribution:
    n: int = 0
    p50: float | None = None
    p95: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Distribution:
        known = [v for v in values if v is not None]
        return cls(len(known), percentile(known, 0.50), percentile(known, 0.95))

    @property
    def spread(self) -> float | None:
        """p95 / p50: how far the tail sits from the middle."""
        return ratio(self.p95, self.p50)


# -- occupancy ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerOccupancy:
    worker: str
    samples: int
    occupancy_mean: float | None
    occupancy_max: float | None
    token_usage_mean: float | None
    token_usage_max: float | None
    running_mean: float | None
    queued_mean: float | None
    max_running_requests: int | None
    max_total_tokens: int | None
    page_size: int


@dataclass(frozen=True, slots=True)
class OccupancySignal:
    workers: tuple[WorkerOccupancy, ...] = ()
    # Fleet means over worker-samples (None when no worker reported the gauge).
    occupancy_mean: float | None = None
    token_usage_mean: float | None = None
    queued_mean: float | None = None
    # Share of worker-samples with a non-empty engine queue.
    queueing_share: float | None = None
    samples: int = 0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def occupancy_signal(samples: Sequence[SnapshotSample]) -> OccupancySignal:
    by_worker: dict[str, list[SnapshotSample]] = {}
    occ_all: list[float] = []
    usage_all: list[float] = []
    queued_all: list[float] = []
    per_worker: dict[str, tuple[list[float], list[float], list[float], list[float]]] = {}
    latest = {}
    for s in samples:
        for w in s.workers:
            if w.stale or not w.healthy:
                continue
            by_worker.setdefault(w.url, []).append(s)
            occ, usage, running, queued = per_worker.setdefault(w.url, ([], [], [], []))
            latest[w.url] = w
            if w.occupancy is not None:
                occ.append(w.occupancy)
                occ_all.append(w.occupancy)
            if w.token_usage is not None:
                usage.append(w.token_usage)
                usage_all.append(w.token_usage)
            if w.running is not None:
                running.append(float(w.running))
            if w.queued is not None:
                queued.append(float(w.queued))
                queued_all.append(float(w.queued))
    workers = tuple(
        WorkerOccupancy(
            worker=url,
            samples=len(by_worker[url]),
            occupancy_mean=_mean(occ),
            occupancy_max=max(occ) if occ else None,
            token_usage_mean=_mean(usage),
            token_usage_max=max(usage) if usage else None,
            running_mean=_mean(running),
            queued_mean=_mean(queued),
            max_running_requests=latest[url].max_running_requests,
            max_total_tokens=latest[url].max_total_tokens,
            page_size=latest[url].page_size,
        )
        for url, (occ, usage, running, queued) in sorted(per_worker.items())
    )
    return OccupancySignal(
        workers=workers,
        occupancy_mean=_mean(occ_all),
        token_usage_mean=_mean(usage_all),
        queued_mean=_mean(queued_all),
        queueing_share=_mean([1.0 if q > 0 else 0.0 for q in queued_all]),
        samples=len(samples),
    )


# -- latency split -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencySignal:
    ttft: Distribution = Distribution()
    upstream_ttft: Distribution = Distribution()
    worker_queue: Distribution = Distribution()
    admission_wait: Distribution = Distribution()
    proxy_overhead: Distribution = Distribution()
    itl: Distribution = Distribution()
    # The fastest decode steps (ITL p10): what a step costs when no prefill shares it.
    itl_floor: float | None = None
    # Each request's worst gap: a stall that hits every request once is rare among gaps (invisible
    # at the ITL p95) but sets the median of this.
    itl_max: Distribution = Distribution()
    # p95 of the prefill each request brought (prompt - cached tokens): the size of the big prefills.
    uncached_tokens_p95: float | None = None
    # TTFT p10 of the requests that brought the most prefill (uncached tokens where reported, else
    # prompt tokens; the biggest tenth, at least 5): the fastest the biggest prompts got.
    # Over the SLO, even those missed it: a floor's direct evidence (``rules.rule_latency_floor``).
    ttft_big_p10: float | None = None
    proxy_overhead_share: float | None = None
    # Median TTFT of the window's first and last third of requests by arrival (30 or more
    # requests): a fleet past its capacity queues more the longer the window runs.
    ttft_early_p50: float | None = None
    ttft_late_p50: float | None = None
    # ...and of its middle third: a queue still growing puts it between the two, where a closed
    # loop's first burst (every client at once, then one in per one out) puts it at the last's.
    ttft_mid_p50: float | None = None
    # ``ttft`` (and its thirds) holds every request whose TTFT is known, whatever its ending, and
    # these at how long they waited before their client left or their time ran out
    # (``RequestRecord.waited_out``): their TTFT is at least that.
    ttft_waited_out: int = 0
    # Every stage of the request path, in path order (name, distribution), for the report.
    stages: tuple[tuple[str, Distribution], ...] = ()

    @property
    def itl_jitter(self) -> float | None:
        return self.itl.spread


BIG_PROMPTS_MIN = 5


def _big_prompts_ttft_p10(timings: Sequence[RequestTiming]) -> float | None:
    sized = [(float(size), t.ttft) for t in timings
             if t.ttft is not None and (size := t.uncached_prompt_tokens if t.uncached_prompt_tokens is not None
                                        else t.prompt_tokens) is not None]
    if len(sized) < BIG_PROMPTS_MIN:
        return None
    # The biggest tenth (at least 5), and every request as big as the smallest of them: ties are
    # all in, so which of equal prompts count never depends on their order.
    sizes = sorted((size for size, _ in sized), reverse=True)
    cut = sizes[max(BIG_PROMPTS_MIN, math.ceil(len(sizes) / 10)) - 1]
    return percentile([ttft for size, ttft in sized if size >= cut], 0.10)


def latency_signal(records: Sequence[RequestRecord]) -> LatencySignal:
    ok = [r for r in records if r.ok]
    timings = [r.timing for r in ok]
    gaps = [g for t in timings for g in t.token_gaps]
    overhead_pairs = [(t.proxy_overhead, t.ttft) for t in timings]
    overhead_sum = sum(o for o, f in overhead_pairs if o is not None and f is not None)
    ttft_sum = sum(f for o, f in overhead_pairs if o is not None and f is not None)
    # Every request's TTFT where it is known or bounded, not only the answered ones': past
    # capacity most requests end early, and the survivors' TTFT would hide the queue.
    timed = [(r.timing.received, v) for r in records if (v := r.ttft_evidence) is not None]
    waited = sum(1 for r in records if r.waited_out is not None)
    ttft = Distribution.of(v for _, v in timed)
    worker_queue = Distribution.of(t.worker_queue_time for t in timings)
    admission_wait = Distribution.of(t.admission_wait for t in timings)
    proxy_overhead = Distribution.of(t.proxy_overhead for t in timings)
    itl = Distribution.of(gaps)
    early, mid, late = _thirds(timed)
    stages = (
        ("admission_wait", admission_wait),
        # Only the requests routing held for a prefix being prefilled (routing.hold_max_s).
        ("prefix_hold", Distribution.of(t.prefix_hold or None for t in timings)),
        ("proxy_overhead", proxy_overhead),
        ("worker_queue", worker_queue),
        ("prefill", Distribution.of(_prefill(t) for t in timings)),
        ("ttft", ttft),
        ("itl", itl),
        ("decode", Distribution.of(t.decode for t in timings)),
        ("e2e", Distribution.of(t.e2e for t in timings)),
    )
    return LatencySignal(
        ttft=ttft,
        upstream_ttft=Distribution.of(t.upstream_ttft for t in timings),
        worker_queue=worker_queue,
        admission_wait=admission_wait,
        proxy_overhead=proxy_overhead,
        itl=itl,
        itl_floor=percentile(gaps, 0.10),
        itl_max=Distribution.of(t.itl_max for t in timings),
        uncached_tokens_p95=percentile([float(u) for t in timings if (u := t.uncached_prompt_tokens) is not None],
                                       0.95),
        ttft_big_p10=_big_prompts_ttft_p10(timings),
        proxy_overhead_share=ratio(overhead_sum, ttft_sum),
        ttft_early_p50=early,
        ttft_late_p50=late,
        ttft_mid_p50=mid,
        ttft_waited_out=waited,
        stages=stages,
    )


def _thirds(ttfts: Sequence[tuple[float, float]]) -> tuple[float | None, float | None, float | None]:
    """Median TTFT of the first, the middle and the last third of requests by arrival time
    ((received, ttft))."""
    ordered = [v for _, v in sorted(ttfts, key=lambda rv: rv[0])]
    if len(ordered) < 30:
        return None, None, None
    third = len(ordered) // 3
    return (percentile(ordered[:third], 0.5), percentile(ordered[third:-third], 0.5),
            percentile(ordered[-third:], 0.5))


def _prefill(t: RequestTiming) -> float | None:
    """Dispatch → first token, less the worker's own queue time (prefill compute + transport)."""
    upstream = t.upstream_ttft
    if upstream is None:
        return None
    return max(0.0, upstream - (t.worker_queue_time or 0.0))


# -- everything together -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowInfo:
    requests: int = 0
    ok: int = 0
    errors: int = 0
    # Seconds from the first request received to the last one done.
    span_s: float = 0.0
    snapshot_samples: int = 0
    # Requests that did not end ok but whose TTFT is known (the first token came) or bounded (their
    # client left or their time ran out first: ``RequestRecord.ttft_evidence``): evidence about
    # latency, so they count towards the data floor.
    cut_short: int = 0
    # Of ``requests``, those the peer replicas routed and told us (``diagnose.fleet_view``), and the
    # replicas the window's requests came through (this one included).
    from_peers: int = 0
    replicas: int = 1


@dataclass(frozen=True, slots=True)
class Signals:
    window: WindowInfo = WindowInfo()
    # A factory: ruff cannot see that a dataclass from another module is frozen (RUF009).
    cache: CacheSignal = field(default_factory=CacheSignal)
    occupancy: OccupancySignal = OccupancySignal()
    latency: LatencySignal = LatencySignal()
    gpu: GpuReport = field(default_factory=lambda: GpuReport.unavailable("not sampled"))
    block_tokens: tuple[int, ...] = ()
    page_sizes: tuple[int, ...] = ()
    policies: tuple[str, ...] = ()
    # The other policies on the same traffic, replayed (``shadow.py``).
    shadow: tuple[ShadowResult, ...] = ()
    # Those prompts' TTFT p95 on idle engines, by the same replay's fitted model (an estimate).
    unloaded_ttft_p95: float | None = None
    hot_prefix: HotPrefix | None = None
    workers: int = 0
    # Workers whose KV event stream is live but does not show what their engine prefilled
    # (``unconfirmed``), or is not a KV event stream (``failed``), in the newest snapshot.
    kv_doubted: tuple[str, ...] = ()
    # Requests the peer replicas routed over the window (routing.peers): the fleet served these
    # too, so this window's cache and shadow figures cover a share of its traffic.
    peer_requests: int = 0
    # Workers of several data-parallel ranks in the newest snapshot (each rank its own cache), and
    # whether this proxy names the rank of each request to them (routing.dp_ranks).
    dp_workers: int = 0
    dp_ranks: bool = False


@dataclass(frozen=True, slots=True)
class HotPrefix:
    """The window's most requested shared prefix (its first ``HOT_BLOCKS`` blocks) and where it ran."""

    share: float  # of the window's requests
    workers: int  # workers that served it
    requests: int
    ttft_p95: float | None  # of its own requests


HOT_BLOCKS = 4  # a shared system prompt: the same first blocks


def hot_prefix(records: Sequence[RequestRecord]) -> HotPrefix | None:
    keyed = [r for r in records if r.ok and len(r.block_hashes) >= HOT_BLOCKS]
    if not keyed:
        return None
    groups: dict[tuple[int, ...], list[RequestRecord]] = {}
    for r in keyed:
        groups.setdefault(r.block_hashes[:HOT_BLOCKS], []).append(r)
    top = max(groups.values(), key=len)
    return HotPrefix(len(top) / len(keyed), len({r.worker for r in top}), len(top),
                     percentile([t for r in top if (t := r.timing.ttft) is not None], 0.95))


def window_info(records: Sequence[RequestRecord], samples: Sequence[SnapshotSample]) -> WindowInfo:
    if not records:
        return WindowInfo(snapshot_samples=len(samples))
    start = min(r.timing.received for r in records)
    end = max((r.timing.done or r.timing.received) for r in records)
    ok = sum(1 for r in records if r.ok)
    cut = sum(1 for r in records if not r.ok and r.ttft_evidence is not None)
    peers = {r.peer for r in records if r.peer}
    return WindowInfo(len(records), ok, len(records) - ok, max(0.0, end - start), len(samples), cut,
                      sum(1 for r in records if r.peer), 1 + len(peers))


# KV event stream states routing does not read (proxy/workers/kv_subscriber.py).
KV_DOUBTED = ("unconfirmed", "failed")


def compute_signals(
    records: Sequence[RequestRecord],
    samples: Sequence[SnapshotSample],
    gpu: GpuReport | None = None,
    *,
    capacity_tokens: int | None = None,
    with_shadow: bool = True,
    peer_requests: int = 0,
    dp_ranks: bool = False,
) -> Signals:
    """All signals of one window; ``capacity_tokens`` overrides the capacity read from snapshots."""
    capacity = capacity_tokens if capacity_tokens is not None else fleet_capacity_tokens(samples)
    occupancy = occupancy_signal(samples)
    resets = cache_resets(samples)
    dp_sizes = {w.url: w.dp_size for w in samples[-1].workers if w.dp_size > 1} if samples else {}
    # The caches as they are now hold nothing from before a fleet-wide reset: replay what came since.
    replayed = replay(resets.since_fleet(records), [w.url for w in samples[-1].workers] if samples else [],
                      capacity, dp_sizes=dp_sizes, dp_ranks=dp_ranks) if with_shadow else Replay()
    return Signals(
        window=window_info(records, samples),
        cache=cache_signal(records, capacity, resets, dp_sizes),
        occupancy=occupancy,
        latency=latency_signal(records),
        gpu=gpu if gpu is not None else GpuReport.unavailable("no GPU sampler"),
        # Hash blocks in tokens, for the page-alignment check: a text prompt's are byte spans.
        block_tokens=tuple(sorted({r.block_tokens for r in records if r.block_hashes and not r.text_prompt})),
        page_sizes=tuple(sorted({w.page_size for w in occupancy.workers})),
        policies=tuple(sorted({r.policy for r in records if r.policy})),
        shadow=replayed.results,
        unloaded_ttft_p95=replayed.unloaded_ttft_p95,
        hot_prefix=hot_prefix(records),
        workers=len({w.url for w in samples[-1].workers}) if samples else len({r.worker for r in records}),
        kv_doubted=tuple(sorted(w.url for w in samples[-1].workers if w.kv_state in KV_DOUBTED)) if samples else (),
        peer_requests=peer_requests,
        dp_workers=sum(1 for w in samples[-1].workers if w.dp_size > 1) if samples else 0,
        dp_ranks=dp_ranks,
    )
