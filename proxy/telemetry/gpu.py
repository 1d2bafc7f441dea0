"""NVML sampler: GPU utilisation over a sliding window, turned into the share of time each GPU sat idle.

NVML's "GPU utilisation" is the percentage of each sample period during which at least one kernel
ran, so the idle share over a window is ``1 - mean(utilisation) / 100`` — the gaps between forward
passes where the GPU waited on the scheduler, the host or data. Samples come from
``nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES, last_timestamp)`` (the driver's own ring buffer,
every sample since the previous poll); where a GPU does not support that, one reading of
``nvmlDeviceGetUtilizationRates`` per poll stands in.

With no GPU, no driver or no library the sampler reports ``available=False`` with the reason, and
the idle share is ``None``: unknown, never invented. The NVML module is injected (``pynvml`` in
production, a stand-in with the same function names in tests); time comes from the injected Clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.clock import Clock

log = logging.getLogger(__name__)

SOURCE_SAMPLES = "samples"
SOURCE_RATES = "utilization_rates"

# NVML value types (nvmlValueType_t) → the union member that holds the value.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def idle_share(utilisations: Sequence[float]) -> float | None:
    """Share of time idle given utilisation percentages (0..100); ``None`` without samples."""
    if not utilisations:
        return None
    mean = sum(min(100.0, max(0.0, u)) for u in utilisations) / len(utilisations)
    return 1.0 - mean / 100.0


@dataclass(frozen=True, slots=True)
class GpuIdle:
    index: int
    idle_share: float | None
    samples: int
    source: str


@dataclass(frozen=True, slots=True)
class GpuReport:
    """What the sampler knows about the GPUs' idle time over its window."""

    available: bool
    reason: str = ""
    gpus: tuple[GpuIdle, ...] = ()
    window_s: float = 0.0

    @classmethod
    def unavailable(cls, reason: str) -> GpuReport:
        return cls(available=False, reason=reason)

    @property
    def idle_share(self) -> float | None:
        """Sample-weighted idle share over all sampled GPUs; ``None`` when unknown."""
        known = [g for g in self.gpus if g.idle_share is not None and g.samples > 0]
        if not self.available or not known:
            return None
        total = sum(g.samples for g in known)
        return sum((g.idle_share or 0.0) * g.samples for g in known) / total


def load_nvml() -> Any | None:
    """The ``pynvml`` module (from nvidia-ml-py), or ``None`` when it is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class _Gpu:
    def __init__(self, index: int, handle: Any, max_samples: int) -> None:
        self.index = index
        self.handle = handle
        self.source = SOURCE_SAMPLES
        self.last_timestamp = 0
        # (clock time of the poll that fetched it, utilisation %)
        self.samples: deque[tuple[float, float]] = deque(maxlen=max_samples)


class NvmlSampler:
    """Polls NVML for utilisation samples of the configured GPUs and keeps a sliding window.

    ``indices`` empty means every GPU NVML can see. ``interval_s`` 0 turns the polling loop off
    (``poll()`` can still be called directly).
    """

    def __init__(
        self,
        nvml: Any | None,
        clock: Clock,
        *,
        indices: Sequence[int] = (),
        interval_s: float = 1.0,
        max_age_s: float = 300.0,
        max_samples_per_gpu: int = 4096,
    ) -> None:
        self._nvml = nvml
        self._clock = clock
        self._indices = tuple(indices)
        self._interval_s = interval_s
        self._max_age_s = max_age_s
        self._max_samples = max_samples_per_gpu
        self._gpus: list[_Gpu] = []
        self._unavailable = "not started"
        self._initialised = False
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    def open(self) -> GpuReport:
        """Initialise NVML and find the GPUs; never raises, reports why when it cannot."""
        if self._nvml is None:
            self._unavailable = "pynvml (nvidia-ml-py) is not installed"
            return self.report()
        try:
            self._nvml.nvmlInit()
            self._initialised = True
            count = int(self._nvml.nvmlDeviceGetCount())
            indices = self._indices or tuple(range(count))
            missing = [i for i in indices if not 0 <= i < count]
            if missing:
                raise LookupError(f"GPU index {missing[0]} not present ({count} visible)")
            self._gpus = [
                _Gpu(i, self._nvml.nvmlDeviceGetHandleByIndex(i), self._max_samples) for i in indices
            ]
            self._unavailable = "" if self._gpus else "NVML sees no GPU"
        except Exception as e:  # NVMLError subclasses, OSError from ctypes, LookupError above
            self._unavailable = f"NVML unavailable: {e}"
            self._gpus = []
            self._shutdown()
        return self.report()

    def close(self) -> None:
        self._gpus = []
        self._unavailable = "closed"
        self._shutdown()

    def _shutdown(self) -> None:
        if self._initialised and self._nvml is not None:
            self._initialised = False
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    async def start(self) -> None:
        """Open NVML and, when ``interval_s`` > 0 and a GPU is there, poll in the background."""
        self.open()
        if self._interval_s > 0 and self._gpus:
            self._task = asyncio.create_task(self._loop(), name="nvml-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.close()

    async def _loop(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(self._interval_s)

    # -- sampling ---------------------------------------------------------------------------
    def poll(self) -> int:
        """Fetch new samples from every GPU; returns how many were added."""
        added = 0
        now = self._clock.now()
        for gpu in self._gpus:
            try:
                values = self._read(gpu)
            except Exception as e:  # one bad read must not stop the loop; the window just thins
                log.debug("nvml read failed on GPU %d: %s", gpu.index, e)
                continue
            for v in values:
                gpu.samples.append((now, v))
            added += len(values)
        return added

    def _read(self, gpu: _Gpu) -> list[float]:
        nvml: Any = self._nvml
        if gpu.source == SOURCE_SAMPLES:
            try:
                value_type, samples = nvml.nvmlDeviceGetSamples(
                    gpu.handle, nvml.NVML_GPU_UTILIZATION_SAMPLES, gpu.last_timestamp
                )
            except Exception as e:
                code = getattr(e, "value", None)
                if code == getattr(nvml, "NVML_ERROR_NOT_FOUND", object()):
                    return []  # no sample newer than the last one
                if code != getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                    raise
                gpu.source = SOURCE_RATES
            else:
                field = _VALUE_FIELDS.get(int(value_type), "uiVal")
                fresh = [s for s in samples if int(s.timeStamp) > gpu.last_timestamp]
                if fresh:
                    gpu.last_timestamp = max(int(s.timeStamp) for s in fresh)
                return [float(getattr(s.sampleValue, field)) for s in fresh]
        return [float(nvml.nvmlDeviceGetUtilizationRates(gpu.handle).gpu)]

    def reset(self) -> None:
        """Forget the window's samples (NVML's read position is kept: nothing old comes back)."""
        for gpu in self._gpus:
            gpu.samples.clear()

    def report(self) -> GpuReport:
        if self._unavailable:
            return GpuReport.unavailable(self._unavailable)
        now = self._clock.now()
        oldest = now - self._max_age_s if self._max_age_s > 0 else float("-inf")
        gpus = []
        first_seen = now
        for gpu in self._gpus:
            while gpu.samples and gpu.samples[0][0] < oldest:
                gpu.samples.popleft()
            utils = [u for _, u in gpu.samples]
            if gpu.samples:
                first_seen = min(first_seen, gpu.samples[0][0])
            gpus.append(GpuIdle(gpu.index, idle_share(utils), len(utils), gpu.source))
        return GpuReport(available=True, gpus=tuple(gpus), window_s=max(0.0, now - first_seen))
