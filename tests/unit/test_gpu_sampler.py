"""The NVML sampler's arithmetic against a stand-in NVML (the one place a fake is allowed: no GPU here),
and the real pynvml on this machine, which must report "unavailable" without raising."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from proxy.clock import ManualClock
from proxy.telemetry import gpu as gpu_mod
from proxy.telemetry.gpu import GpuIdle, GpuReport, NvmlSampler, idle_share


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


@dataclass
class FakeNvml:
    """Same function names and constants as pynvml; utilisation samples per GPU, timestamps in µs."""

    samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    supports_samples: bool = True
    rates: int = 40
    init_error: Exception | None = None
    shutdowns: int = 0

    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_NOT_SUPPORTED = 3
    NVMLError = FakeNvmlError

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.samples)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetSamples(self, handle: int, kind: int, since: int):
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        if not self.supports_samples:
            raise FakeNvmlError(self.NVML_ERROR_NOT_SUPPORTED)
        fresh = [s for s in self.samples[handle] if s[0] > since]
        if not fresh:
            raise FakeNvmlError(self.NVML_ERROR_NOT_FOUND)
        return 1, [SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=u)) for t, u in fresh]

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return SimpleNamespace(gpu=self.rates, memory=0)


def test_idle_share_is_one_minus_mean_utilisation() -> None:
    assert idle_share([100, 100]) == 0.0
    assert idle_share([0, 50]) == pytest.approx(0.75)
    assert idle_share([150, -10]) == pytest.approx(0.5)  # clamped to 0..100
    assert idle_share([]) is None


def test_sampler_reads_new_samples_once_and_reports_idle_per_gpu() -> None:
    nvml = FakeNvml(samples={0: [(1, 100), (2, 60)], 1: [(1, 0), (2, 0)]})
    clock = ManualClock()
    s = NvmlSampler(nvml, clock, interval_s=0)
    assert s.open().available
    assert s.poll() == 4
    assert s.poll() == 0  # nothing newer than the last timestamp
    nvml.samples[0].append((3, 20))
    assert s.poll() == 1
    report = s.report()
    idle0, idle1 = report.gpus
    assert idle0.idle_share == pytest.approx(1 - 60 / 100) and idle0.samples == 3
    assert idle1.idle_share == 1.0
    assert report.idle_share == pytest.approx((0.4 * 3 + 1.0 * 2) / 5)


def test_configured_indices_limit_the_gpus_sampled() -> None:
    nvml = FakeNvml(samples={0: [(1, 100)], 1: [(1, 0)]})
    s = NvmlSampler(nvml, ManualClock(), indices=[1], interval_s=0)
    s.open()
    s.poll()
    assert [g.index for g in s.report().gpus] == [1]


def test_a_missing_index_makes_the_sampler_unavailable_not_crash() -> None:
    nvml = FakeNvml(samples={0: [(1, 100)]})
    report = NvmlSampler(nvml, ManualClock(), indices=[3], interval_s=0).open()
    assert not report.available and "index 3" in report.reason
    assert nvml.shutdowns == 1


def test_falls_back_to_utilization_rates_when_samples_are_not_supported() -> None:
    nvml = FakeNvml(samples={0: []}, supports_samples=False, rates=30)
    s = NvmlSampler(nvml, ManualClock(), interval_s=0)
    s.open()
    s.poll()
    s.poll()
    (g,) = s.report().gpus
    assert g.source == gpu_mod.SOURCE_RATES and g.samples == 2
    assert g.idle_share == pytest.approx(0.7)


def test_samples_older_than_the_window_are_forgotten() -> None:
    nvml = FakeNvml(samples={0: [(1, 0)]})
    clock = ManualClock()
    s = NvmlSampler(nvml, clock, interval_s=0, max_age_s=10.0)
    s.open()
    s.poll()
    clock.advance(5.0)
    nvml.samples[0].append((2, 100))
    s.poll()
    assert s.report().idle_share == pytest.approx(0.5)
    clock.advance(6.0)
    assert s.report().idle_share == 0.0


def test_init_failure_reports_unavailable_with_the_reason() -> None:
    nvml = FakeNvml(init_error=FakeNvmlError(12))
    report = NvmlSampler(nvml, ManualClock(), interval_s=0).open()
    assert report == GpuReport(available=False, reason="NVML unavailable: nvml error 12")
    assert report.idle_share is None


def test_no_pynvml_module_is_reported_not_raised() -> None:
    report = NvmlSampler(None, ManualClock(), interval_s=0).open()
    assert not report.available and "not installed" in report.reason


def test_idle_share_is_unknown_until_a_sample_arrives() -> None:
    report = GpuReport(available=True, gpus=(GpuIdle(0, None, 0, "samples"),))
    assert report.idle_share is None


async def test_real_nvml_on_a_machine_without_a_gpu_reports_unavailable_without_raising() -> None:
    nvml = gpu_mod.load_nvml()
    assert nvml is not None, "nvidia-ml-py is a dependency"
    s = NvmlSampler(nvml, ManualClock(), interval_s=0.01)
    await s.start()
    try:
        report = s.report()
        if report.available:  # pragma: no cover - only on a machine with a GPU and a driver
            assert all(g.index >= 0 for g in report.gpus)
        else:
            assert report.reason and report.idle_share is None
            assert s.poll() == 0
    finally:
        await s.stop()
    assert not s.report().available


async def test_background_loop_polls_until_stopped() -> None:
    import asyncio

    nvml = FakeNvml(samples={0: []}, supports_samples=False, rates=90)
    s = NvmlSampler(nvml, ManualClock(), interval_s=0.001)
    await s.start()
    try:
        for _ in range(2000):  # bounded wait for the loop's first polls
            if s.report().gpus[0].samples >= 3:
                break
            await asyncio.sleep(0.001)
        assert s.report().gpus[0].samples >= 3
    finally:
        await s.stop()
    assert nvml.shutdowns == 1 and not s.report().available
