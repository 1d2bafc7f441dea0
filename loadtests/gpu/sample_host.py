"""Once a second, what the machine under the engines was doing: the GPU's SM clock, utilization and
power (NVML), and the CPU time the hypervisor gave to other guests (steal, /proc/stat).

    python3 loadtests/gpu/sample_host.py --out FILE --max-s 600     # run_fleet.sh starts it

The same engine on the same arrivals stepped at 60-70 ms on one machine and 90-130 ms on another,
and on that one the same step's time fell from 120 to 77 ms in mid-phase (runs 57-58). Each line is
stamped with ``time.monotonic()``, the clock of the engines' batch logs (``perf_counter``, the
same CLOCK_MONOTONIC on Linux), so a step's time lines up with the machine's state then.
Bounded by ``--max-s``; without NVML the GPU columns are empty.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

FIELDS = ["t", "sm_mhz", "gpu_util", "power_w", "cpu_busy", "cpu_steal"]


def cpu_times() -> tuple[int, int, int]:
    """(total, idle + iowait, steal) jiffies of all CPUs since boot."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    steal = parts[7] if len(parts) > 7 else 0
    return sum(parts[:8]), parts[3] + parts[4], steal


def gpu_reader() -> Any:
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no NVML here: CPU columns only
        return lambda: ("", "", "")

    def read() -> tuple[Any, Any, Any]:
        try:
            return (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000, 1))
        except Exception:
            return ("", "", "")
    return read


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--max-s", type=float, default=600.0)
    p.add_argument("--every-s", type=float, default=1.0)
    a = p.parse_args()
    gpu = gpu_reader()
    end = time.monotonic() + a.max_s
    with open(a.out, "w", buffering=1) as out:
        out.write(",".join(FIELDS) + "\n")
        before = cpu_times()
        while time.monotonic() < end:
            time.sleep(a.every_s)
            now = cpu_times()
            total = max(1, now[0] - before[0])
            busy = 1 - (now[1] - before[1]) / total
            steal = (now[2] - before[2]) / total
            before = now
            out.write(",".join(str(x) for x in (round(time.monotonic(), 3), *gpu(), round(busy, 3), round(steal, 4)))
                      + "\n")


if __name__ == "__main__":
    main()
