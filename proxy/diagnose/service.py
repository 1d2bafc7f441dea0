"""The diagnosis as a service: windows + GPU sampler + thresholds → one ``Diagnosis`` on demand.

``Diagnoser.diagnose()`` reads the windows, computes signals, rules and stage costs (pure code) and
stamps the result with the clock. ``current()`` reuses the last result while it is younger than
``min_interval_s`` so that scrapes of /metrics and /diagnosis do not each replay the cache
(O(Σ prompt blocks in the window)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from proxy.clock import Clock
from proxy.config import DiagnoseConfig
from proxy.diagnose.cost import CostReport, stage_costs
from proxy.diagnose.rules import RuleParams, Verdict, verdict
from proxy.diagnose.signals import Signals, compute_signals
from proxy.diagnose.window import DiagnosisWindows, RequestRecord, SnapshotSample
from proxy.telemetry.gpu import GpuReport, NvmlSampler


@dataclass(frozen=True, slots=True)
class Diagnosis:
    generated_at: float
    signals: Signals
    verdict: Verdict
    cost: CostReport
    params: RuleParams
    max_requests: int
    max_age_s: float


def params_from_config(cfg: DiagnoseConfig) -> RuleParams:
    """RuleParams from the ``diagnose`` section: its thresholds, then its SLO."""
    return dataclasses.replace(RuleParams.from_mapping(cfg.thresholds), slo_ttft_p95_s=cfg.slo_ttft_p95_s)


@dataclass(frozen=True, slots=True)
class DiagnosisInputs:
    records: tuple[RequestRecord, ...]
    samples: tuple[SnapshotSample, ...]
    gpu: GpuReport
    now: float
    # Requests the peer replicas routed over the window's span (0 without peers).
    peer_requests: int = 0
    # The span asked for (``inputs(since=...)``), reported as the window's age bound; None = the window's.
    span_s: float | None = None


class Diagnoser:
    def __init__(
        self,
        windows: DiagnosisWindows,
        clock: Clock,
        *,
        params: RuleParams | None = None,
        price_per_gpu_hour: float = 3.0,
        gpus_per_worker: int = 1,
        gpu: NvmlSampler | None = None,
        min_interval_s: float = 2.0,
    ) -> None:
        self.windows = windows
        # routing.dp_ranks: whether the proxy names the workers' DP ranks (set by the composition root)
        self.dp_ranks = False
        self.params = params or RuleParams()
        self._clock = clock
        self._price = price_per_gpu_hour
        self._gpus_per_worker = gpus_per_worker
        self._gpu = gpu
        self._min_interval_s = min_interval_s
        self._last: Diagnosis | None = None
        # Behind several replicas (routing.peers): how many requests the others routed since a
        # clock time (set by the composition root); the window then holds a share of the fleet's.
        self.peer_requests: Callable[[float], int] | None = None

    @classmethod
    def from_config(
        cls, cfg: DiagnoseConfig, windows: DiagnosisWindows, clock: Clock, gpu: NvmlSampler | None = None
    ) -> Diagnoser:
        # The refresh loop recomputes every refresh_s; reads reuse a result up to twice that old.
        return cls(windows, clock, params=params_from_config(cfg), price_per_gpu_hour=cfg.price_per_gpu_hour,
                   gpus_per_worker=cfg.gpus_per_worker, gpu=gpu, min_interval_s=2 * cfg.refresh_s)

    def gpu_report(self) -> GpuReport:
        if self._gpu is None:
            return GpuReport.unavailable("GPU sampling is off (diagnose.nvml_interval_s = 0)")
        return self._gpu.report()

    def inputs(self, since: float | None = None) -> DiagnosisInputs:
        """Copy what a diagnosis reads (cheap); call on the event loop that feeds the windows.
        ``since`` (clock seconds): only the requests received and the snapshots taken from then on."""
        records = tuple(self.windows.requests.items())
        samples = tuple(self.windows.snapshots.items())
        if since is not None:
            records = tuple(r for r in records if r.timing.received >= since)
            samples = tuple(s for s in samples if s.at >= since)
        peers = 0
        if self.peer_requests is not None and records:
            peers = self.peer_requests(min(r.timing.received for r in records))
        return DiagnosisInputs(
            records=records,
            samples=samples,
            gpu=self.gpu_report(),
            now=self._clock.now(),
            peer_requests=peers,
            span_s=None if since is None else self._clock.now() - since,
        )

    def compute(self, inputs: DiagnosisInputs) -> Diagnosis:
        """Signals, verdict and cost of one copy of the windows; pure, safe to run in a thread."""
        signals = compute_signals(inputs.records, inputs.samples, inputs.gpu, peer_requests=inputs.peer_requests,
                                  dp_ranks=self.dp_ranks)
        workers = [w.url for w in inputs.samples[-1].workers] if inputs.samples else []
        cost = stage_costs(
            inputs.records,
            workers=workers,
            price_per_gpu_hour=self._price,
            gpus_per_worker=self._gpus_per_worker,
            gpu_idle_share=inputs.gpu.idle_share,
        )
        return Diagnosis(
            generated_at=inputs.now,
            signals=signals,
            verdict=verdict(signals, self.params),
            cost=cost,
            params=self.params,
            max_requests=self.windows.requests.max_items,
            max_age_s=self.windows.requests.max_age_s if inputs.span_s is None else inputs.span_s,
        )

    def store(self, diagnosis: Diagnosis) -> None:
        self._last = diagnosis

    def diagnose(self) -> Diagnosis:
        """A fresh diagnosis, computed inline."""
        d = self.compute(self.inputs())
        self.store(d)
        return d

    def current(self) -> Diagnosis:
        """The last diagnosis if fresh enough, else a new one."""
        last = self._last
        if last is not None and self._clock.now() - last.generated_at < self._min_interval_s:
            return last
        return self.diagnose()
