"""Show the NVML sampler (proxy/telemetry/gpu.py) on a real GPU: idle share at rest, under steady
load and under a ~50 % duty cycle of matrix products. Prints one line per phase and a JSON summary.

    PYTHONPATH=. python3 loadtests/gpu/nvml_probe.py [--phase-s 8] [--gpu 0] [--out FILE]

Without a GPU (or without torch) it says why and exits 0: the sampler reports "unavailable" and the
load phases are skipped. Every phase is bounded by --phase-s; the whole run by ~4 x phase-s + start-up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from proxy.clock import MonotonicClock
from proxy.telemetry.gpu import NvmlSampler, load_nvml


def run_phase(sampler: NvmlSampler, name: str, seconds: float, work: Any | None) -> dict[str, Any]:
    """Poll NVML every 0.25 s while ``work(deadline)`` keeps the GPU as busy as it likes."""
    sampler.poll()
    sampler.reset()  # only samples taken during this phase count
    start = time.monotonic()
    deadline = start + seconds
    polls = 0
    while time.monotonic() < deadline:  # bounded by the phase length
        step_end = min(deadline, time.monotonic() + 0.25)
        if work is None:
            time.sleep(max(0.0, step_end - time.monotonic()))
        else:
            work(step_end)
        sampler.poll()
        polls += 1
    report = sampler.report()
    row: dict[str, Any] = {
        "phase": name,
        "seconds": round(time.monotonic() - start, 2),
        "polls": polls,
        "idle_share": None if report.idle_share is None else round(report.idle_share, 3),
        "gpus": [{"index": g.index, "samples": g.samples, "source": g.source,
                  "idle_share": None if g.idle_share is None else round(g.idle_share, 3)} for g in report.gpus],
    }
    print(f"{name:<10} idle share {row['idle_share']}  samples {[g['samples'] for g in row['gpus']]}  "
          f"source {[g['source'] for g in row['gpus']]}", flush=True)
    return row


def make_work(gpu: int, duty: float) -> Any | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device(f"cuda:{gpu}")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def work(until: float) -> None:
        # Busy for `duty` of each 100 ms slice, then idle for the rest (sleep, nothing queued).
        while time.monotonic() < until:
            slice_end = min(until, time.monotonic() + 0.1)
            busy_end = time.monotonic() + 0.1 * duty
            while time.monotonic() < busy_end:
                for _ in range(4):
                    a @ b
                torch.cuda.synchronize(dev)
            time.sleep(max(0.0, slice_end - time.monotonic()))

    return work


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    sampler = NvmlSampler(load_nvml(), MonotonicClock(), indices=[args.gpu], interval_s=0, max_age_s=0)
    opened = sampler.open()
    summary: dict[str, Any] = {"available": opened.available, "reason": opened.reason, "phases": []}
    if not opened.available:
        print(opened.reason)
    else:
        summary["phases"].append(run_phase(sampler, "rest", args.phase_s, None))
        busy, half = make_work(args.gpu, 1.0), make_work(args.gpu, 0.5)
        if busy is None or half is None:
            print("torch with CUDA is not available: load phases skipped")
        else:
            half(time.monotonic() + 1.0)  # warm-up: cuBLAS handles, clocks
            summary["phases"].append(run_phase(sampler, "busy", args.phase_s, busy))
            summary["phases"].append(run_phase(sampler, "half-duty", args.phase_s, half))
            summary["phases"].append(run_phase(sampler, "rest-again", args.phase_s, None))
        sampler.close()
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
