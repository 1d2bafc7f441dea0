"""The diagnosis as a service: windows + GPU sampler + thresholds → one ``Diagnosis`` on demand.

``Diagnoser.diagnose()`` reads the windows, computes signals, rules and stage costs (pure code) and
stamps the result with the clock. ``current()`` reuses the last result while it is younger than
``min_interval_s`` so that scrapes of /metrics and /diagnosis do not each replay the cache
(O(Σ prompt blocks in the window)).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from proxy.clock import Clock
from proxy.config import DiagnoseConfig
from proxy.diagnose.cost import CostReport, stage_costs
from proxy.diagnose.rules import RuleParams, Verdict, verdict
from proxy.diagnose.signals import Signals, compute_signals
from proxy.diagnose.window import DiagnosisWindows
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
        self.params = params or RuleParams()
        self._clock = clock
        self._price = price_per_gpu_hour
        self._gpus_per_worker = gpus_per_worker
        self._gpu = gpu
        self._min_interval_s = min_interval_s
        self._last: Diagnosis | None = None

    @classmethod
    def from_config(
        cls, cfg: DiagnoseConfig, windows: DiagnosisWindows, clock: Clock, gpu: NvmlSampler | None = None
    ) -> Diagnoser:
        return cls(windows, clock, params=params_from_config(cfg), price_per_gpu_hour=cfg.price_per_gpu_hour,
                   gpus_per_worker=cfg.gpus_per_worker, gpu=gpu, min_interval_s=cfg.refresh_s)

    def gpu_report(self) -> GpuReport:
        if self._gpu is None:
            return GpuReport.unavailable("GPU sampling is off (diagnose.nvml_interval_s = 0)")
        return self._gpu.report()

    def diagnose(self) -> Diagnosis:
        records = self.windows.requests.items()
        samples = self.windows.snapshots.items()
        gpu = self.gpu_report()
        signals = compute_signals(records, samples, gpu)
        workers = [w.url for w in samples[-1].workers] if samples else []
        cost = stage_costs(
            records,
            workers=workers,
            price_per_gpu_hour=self._price,
            gpus_per_worker=self._gpus_per_worker,
            gpu_idle_share=gpu.idle_share,
        )
        self._last = Diagnosis(
            generated_at=self._clock.now(),
            signals=signals,
            verdict=verdict(signals, self.params),
            cost=cost,
            params=self.params,
            max_requests=self.windows.requests.max_items,
            max_age_s=self.windows.requests.max_age_s,
        )
        return self._last

    def current(self) -> Diagnosis:
        """The last diagnosis if fresh enough, else a new one."""
        last = self._last
        if last is not None and self._clock.now() - last.generated_at < self._min_interval_s:
            return last
        return self.diagnose()
