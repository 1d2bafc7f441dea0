"""Families read at scrape time: worker and admission state, KV event streams, the prompt token
estimate (registered by Metrics), and the diagnosis (registered by the diagnosis).

Current state (worker health, scraped engine state, in-flight, queue depth) is read from a
``StateProvider`` when Prometheus scrapes, so it can never go stale or outlive a worker. Unknown
values are omitted, never exported as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.routing.base import WorkerSnapshot

if TYPE_CHECKING:
    from proxy.diagnose.service import Diagnosis
    from proxy.workers.kv_subscriber import KvSubscriber


class StateProvider(Protocol):
    """What the scrape-time collector reads."""

    def worker_snapshots(self) -> Sequence[WorkerSnapshot]: ...

    def worker_ejected(self, url: str) -> bool: ...

    def worker_snapshot_age(self, url: str) -> float | None: ...

    def admission_queue_depth(self) -> int: ...

    def admission_limits(self) -> dict[str, int]: ...


class StateCollector(Collector):
    def __init__(self, provider: StateProvider) -> None:
        self._p = provider

    def describe(self) -> Iterable[Metric]:
        return []  # collected lazily; avoid calling the provider at registration

    def collect(self) -> Iterable[Metric]:
        p = self._p
        snaps = p.worker_snapshots()
        limits = p.admission_limits()

        def fam(name: str, help_: str, value_of: Callable[[WorkerSnapshot], float | None]) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, help_, labels=["worker"])
            for s in snaps:
                v = value_of(s)
                if v is not None:
                    g.add_metric([s.url], float(v))
            return g

        yield fam("radixgate_worker_healthy", "1 when the worker may receive requests (probe ok, not ejected).",
                  lambda s: 1.0 if s.healthy else 0.0)
        yield fam("radixgate_worker_ejected", "1 while the worker is passively ejected.",
                  lambda s: 1.0 if p.worker_ejected(s.url) else 0.0)
        yield fam("radixgate_worker_in_flight_requests", "Requests this proxy has outstanding on the worker.",
                  lambda s: s.in_flight)
        yield fam("radixgate_worker_admission_limit", "Outstanding requests the proxy allows on the worker.",
                  lambda s: limits.get(s.url))
        yield fam("radixgate_worker_running_requests", "Scraped: requests running on the engine.",
                  lambda s: s.running)
        yield fam("radixgate_worker_queued_requests", "Scraped: requests waiting in the engine's queue.",
                  lambda s: s.queued)
        yield fam("radixgate_worker_occupancy_ratio", "Scraped: running / max_running_requests.",
                  lambda s: s.occupancy)
        yield fam("radixgate_worker_token_usage_ratio", "Scraped: KV cache token usage (0..1).",
                  lambda s: s.token_usage)
        yield fam("radixgate_worker_cache_hit_ratio", "Scraped: the engine's prefix cache hit rate (0..1).",
                  lambda s: s.cache_hit_rate)
        yield fam("radixgate_worker_max_running_requests", "Scraped: the engine's max_running_requests.",
                  lambda s: s.max_running_requests)
        yield fam("radixgate_worker_snapshot_age_seconds", "Seconds since the last successful scrape.",
                  lambda s: p.worker_snapshot_age(s.url))
        yield fam("radixgate_worker_stale", "1 when the scrape is too old and the worker counts as saturated.",
                  lambda s: 1.0 if s.stale else 0.0)
        yield fam("radixgate_worker_generation", "Restart / cache-flush generation of the worker.",
                  lambda s: s.generation)
        q = GaugeMetricFamily("radixgate_admission_queue_depth", "Requests waiting in the proxy's admission queue.")
        q.add_metric([], float(p.admission_queue_depth()))
        yield q
        n = GaugeMetricFamily("radixgate_workers", "Workers known to the proxy, by health.", labels=["state"])
        n.add_metric(["healthy"], float(sum(1 for s in snaps if s.healthy)))
        n.add_metric(["unhealthy"], float(sum(1 for s in snaps if not s.healthy)))
        yield n


# -- KV event streams and the token estimate (registered by Metrics.attach_kv_events /
# attach_prompt_bytes_per_token): read from their owners at scrape time, like the state above.

KV_STATES = ("connecting", "live", "resynced", "unconfirmed", "failed")


class KvEventsCollector(Collector):
    def __init__(self, subscribers: Callable[[], Iterable[KvSubscriber]]) -> None:
        self._subscribers = subscribers

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        # one stream per worker, or per data-parallel rank of a worker that has several
        state = GaugeMetricFamily(
            "radixgate_kv_events_state",
            "1 for the state of each worker's KV event stream, per data-parallel rank (live / resynced: "
            "routing reads the engine's events; connecting / unconfirmed / failed: the approximate index).",
            labels=["worker", "rank", "state"])
        blocks = GaugeMetricFamily("radixgate_kv_events_blocks", "Blocks the worker's events say it holds on GPU.",
                                   labels=["worker", "rank"])
        lag = GaugeMetricFamily("radixgate_kv_events_lag_seconds",
                                "Our clock minus the engine's timestamp of its last batch, when it arrived.",
                                labels=["worker", "rank"])
        counters = {name: CounterMetricFamily(f"radixgate_kv_events_{name}", text, labels=["worker", "rank"])
                    for name, text in (
            ("batches", "Event batches applied."),
            ("gaps", "Lost batches detected (a sequence number skipped)."),
            ("resyncs", "Tables cleared because lost batches could not be replayed or the engine restarted."),
            ("errors", "Frames or batches that were not a well-formed KV event stream."),
            ("reconnects", "Event connections re-opened after the transport dropped them."),
        )}
        probes = CounterMetricFamily(
            "radixgate_kv_events_probes", "Prompts the worker prefilled, checked against its stream "
            "(proxy/workers/kv_trust.py; a worker's ranks together), by whether the stream showed them.",
            labels=["worker", "shown"])
        checks: set[int] = set()
        for sub in self._subscribers():
            labels = [sub.url, str(sub.rank)]
            for name in KV_STATES:
                state.add_metric([*labels, name], 1.0 if sub.route_state == name else 0.0)
            blocks.add_metric(labels, float(len(sub.table)))
            if sub.stats.lag_s is not None:
                lag.add_metric(labels, sub.stats.lag_s)
            for name, family in counters.items():
                family.add_metric(labels, float(getattr(sub.stats, name)))
            if id(sub.trust) not in checks:  # shared by a worker's ranks: once
                checks.add(id(sub.trust))
                probes.add_metric([sub.url, "true"], float(sub.trust.confirmed))
                probes.add_metric([sub.url, "false"], float(sub.trust.probes - sub.trust.confirmed))
        yield state
        yield blocks
        yield lag
        yield from counters.values()
        yield probes


class MappingGauge(Collector):
    """One gauge family with one label, read at scrape time from ``current`` (label value -> value)."""

    def __init__(self, name: str, documentation: str, label: str,
                 current: Callable[[], Mapping[str, float]]) -> None:
        self._name, self._doc, self._label, self._current = name, documentation, label, current

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        g = GaugeMetricFamily(self._name, self._doc, labels=[self._label])
        for key, value in sorted(self._current().items()):
            g.add_metric([key], value)
        yield g


# -- diagnosis gauges (owned by the diagnosis: proxy/diagnose) ---------------------------------
# Read at scrape time from the Diagnoser (which reuses a result for diagnose.refresh_s), so the
# gauges always describe the current window. Unknown values (no GPU, no cache reports) are omitted,
# never exported as 0. Labels are bounded: kind / q / stage / rule / cause are fixed sets.


def attach_diagnosis(registry: CollectorRegistry, current: Callable[[], Diagnosis]) -> None:
    """Register the diagnosis gauges; ``current`` returns the latest Diagnosis."""
    registry.register(_DiagnosisCollector(current))


class _DiagnosisCollector(Collector):
    def __init__(self, current: Callable[[], Diagnosis]) -> None:
        self._current = current

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        from proxy.diagnose.rules import VERDICT_KINDS

        d = self._current()
        s, v, c = d.signals, d.verdict, d.cost

        def gauge(name: str, help_: str, values: Iterable[tuple[list[str], float | None]],
                  labels: Sequence[str] = ()) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, help_, labels=list(labels))
            for label_values, value in values:
                if value is not None:
                    g.add_metric(label_values, float(value))
            return g

        yield gauge("radixgate_diagnosis_window_requests", "Finished requests in the diagnosis window.",
                    [([], s.window.requests)])
        yield gauge("radixgate_diagnosis_cache_estimated",
                    "1 when no worker reported cached tokens and the cache ratios are the proxy's estimate.",
                    [([], 1.0 if s.cache.estimated else 0.0)])
        yield gauge("radixgate_diagnosis_cache_hit_ratio",
                    "Prefix cache hit rate: captured (workers reported), available (one fleet-wide LRU of "
                    "the fleet's KV capacity), reuse_ceiling (unbounded cache).",
                    [(["captured"], s.cache.captured), (["available"], s.cache.available),
                     (["reuse_ceiling"], s.cache.reuse_ceiling)], ["kind"])
        yield gauge("radixgate_diagnosis_occupancy_ratio", "Mean running / max_running_requests over the window.",
                    [([], s.occupancy.occupancy_mean)])
        yield gauge("radixgate_diagnosis_kv_token_usage_ratio", "Mean KV token usage over the window.",
                    [([], s.occupancy.token_usage_mean)])
        lat = s.latency
        for name, dist, help_ in (("ttft", lat.ttft, "Time to first token"),
                                  ("worker_queue", lat.worker_queue, "Worker-reported queue time"),
                                  ("itl", lat.itl, "Inter-token latency")):
            # The label is q, not quantile: quantile is reserved for summaries (promtool check metrics
            # refuses it on a gauge), and a windowed p95 has no cumulative _sum / _count to be one.
            yield gauge(f"radixgate_diagnosis_{name}_seconds", f"{help_} over the window, by quantile (q).",
                        [(["0.5"], dist.p50), (["0.95"], dist.p95)], ["q"])
        yield gauge("radixgate_diagnosis_gpu_idle_ratio", "Share of time the sampled GPUs were idle (NVML).",
                    [([], s.gpu.idle_share)])
        yield gauge("radixgate_diagnosis_proxy_overhead_ratio", "radixgate's own share of TTFT.",
                    [([], lat.proxy_overhead_share)])
        yield gauge("radixgate_diagnosis_verdict", "1 for the current verdict kind, 0 for the others.",
                    [([k], 1.0 if k == v.kind else 0.0) for k in VERDICT_KINDS], ["kind"])
        yield gauge("radixgate_diagnosis_verdict_confidence_ratio", "Confidence of the current verdict (0..1).",
                    [([], v.confidence)])
        yield gauge("radixgate_diagnosis_finding", "1 per rule that fired in the current diagnosis.",
                    [([f.rule, f.cause], 1.0) for f in v.findings], ["rule", "cause"])
        yield gauge("radixgate_diagnosis_stage_gpu_seconds_per_request",
                    "Mean GPU-seconds charged per request, by stage (queue, prefill, decode, idle).",
                    [([st.stage], st.mean_per_request) for st in c.stages], ["stage"])
        yield gauge("radixgate_diagnosis_stage_cost_per_request_dollars",
                    "Mean cost per request by stage at diagnose.price_per_gpu_hour.",
                    [([st.stage], st.cost_per_request) for st in c.stages], ["stage"])
        yield gauge("radixgate_diagnosis_stage_cost_share_ratio", "Share of the window's GPU bill by stage.",
                    [([st.stage], st.share) for st in c.stages], ["stage"])
# -- end of diagnosis gauges -------------------------------------------------------------------
