"""Replay measured and published engine figures in simulation; print simulated vs reference.

    .venv/bin/python -m loadtests.calibrate_sim

Each case runs the simulated worker's own scheduler and roofline model (proxy/sim) on a
virtual clock: same prompt lengths, same concurrency, no real sleeping, so it takes a second.
Part 1 replays every measurement of shared/reference/gpu-calibration.md (a real continuous-batching
engine on one H200, driven one request at a time) against the `h200-transformers-7b-engine-only`
profile; the target is within 20%. (Under load the served engine is slower: `loadtests/fidelity.py`.)
Part 2 compares the SGLang profiles with published SGLang figures for Llama-3 8B (sources in
proxy/sim/README.md). Exit status 1 if a Part 1 case is off by more than 20%.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from typing import Any

from proxy.sim.config import SimConfig
from proxy.sim.engine import Engine
from proxy.sim.perf import step_seconds
from proxy.sim.scheduler import SimRequest

TOLERANCE = 0.20


@dataclass
class Arrival:
    at: float
    prompt: list[int]
    max_new_tokens: int


def prompt(n: int, salt: int) -> list[int]:
    return [salt * 1_000_003 + i for i in range(n)]


class Replay:
    """One simulated worker on a virtual clock; state (cache, warm-up) persists across runs."""

    def __init__(self, **config: Any) -> None:
        self.engine = Engine(SimConfig(**config))
        self.now = 0.0
        self.busy = 0.0
        self._ids = 0

    def run(self, arrivals: list[Arrival]) -> list[SimRequest]:
        sched, profile = self.engine.scheduler, self.engine.profile
        start = self.now
        pending = sorted(arrivals, key=lambda a: a.at)
        done: list[SimRequest] = []
        while pending or sched.has_work():
            while pending and start + pending[0].at <= self.now:
                a = pending.pop(0)
                self._ids += 1
                req = SimRequest(rid=str(self._ids), input_ids=a.prompt, max_new_tokens=a.max_new_tokens)
                sched.submit(req, self.now)
                done.append(req)
            step = sched.next_step(self.now)
            if step is None:
                self.now = start + pending[0].at
                continue
            seconds = step_seconds(profile, step.work)
            self.now += seconds
            self.busy += seconds
            sched.finish_step(step, self.now)
        return done

    def warm_up(self) -> None:
        self.run([Arrival(0.0, prompt(16, salt=999), 1)])
        self.engine.flush_cache()


def ttft(r: SimRequest) -> float:
    assert r.first_token_at is not None
    return r.first_token_at - r.arrival


def calibration_cases() -> list[tuple[str, float, float]]:
    """(measurement, measured seconds, simulated seconds) for gpu-calibration.md."""
    profile = "h200-transformers-7b-engine-only"
    rows: list[tuple[str, float, float]] = []

    fresh = Replay(profile=profile)
    first = fresh.run([Arrival(0.0, prompt(256, 1), 1)])[0]
    rows.append(("first request after start, 256-token prompt: TTFT", 1.8, ttft(first)))

    fresh = Replay(profile=profile)
    first_cold = fresh.run([Arrival(0.0, prompt(8256, 2), 1)])[0]
    rows.append(("first run of the cold 8,256-token prompt (incl. warm-up): TTFT", 1.57, ttft(first_cold)))

    warm = Replay(profile=profile)
    warm.warm_up()
    cold = warm.run([Arrival(0.0, prompt(8256, 3), 1)])[0]
    rows.append(("cold 8,256-token prompt, nothing cached: TTFT", 0.3825, ttft(cold)))

    warm.run([Arrival(0.0, prompt(8192, 4), 1)])
    hit = warm.run([Arrival(0.0, prompt(8192, 4) + prompt(64, 5), 1)])[0]
    rows.append(("8,192 cached + 64 new tokens: TTFT (measured 0.040-0.051)", 0.0455, ttft(hit)))
    rows.append(("cached prefix removes this share of TTFT (measured ~88%)", 0.88, 1 - ttft(hit) / ttft(cold)))

    single = warm.run([Arrival(0.0, prompt(256, 6), 17)])[0]
    assert single.first_token_at is not None and single.finished_at is not None
    per_token = (single.finished_at - single.first_token_at) / 16
    rows.append(("decode, batch 1: seconds per token (measured 0.036-0.044)", 0.040, per_token))

    crowd_sim = Replay(profile=profile)
    crowd_sim.warm_up()
    t0 = crowd_sim.now
    crowd = crowd_sim.run([Arrival(0.0, prompt(512, 100 + i), 64) for i in range(32)])
    wall = max(r.finished_at or 0.0 for r in crowd) - t0
    rows.append(("32 concurrent x (512 prompt + 64 output): all done (wall)", 10.4, wall))
    rows.append(("32 concurrent: TTFT p50", 1.08, statistics.median(ttft(r) for r in crowd)))
    return rows


def sglang_cases() -> list[tuple[str, str, str, float, float, str]]:
    """(profile, measurement, kind, reference seconds, simulated seconds, source).

    kind "=" compares with a published figure, "<" with a published upper bound, "-" has none.
    """
    rows: list[tuple[str, str, str, float, float, str]] = []
    for profile in ("llama-3.1-8b-h100", "llama-3.1-8b-h200"):
        h100 = profile.endswith("h100")
        r = Replay(profile=profile)
        r.warm_up()
        one = r.run([Arrival(0.0, prompt(128, 7), 8)])[0]
        assert one.first_token_at is not None and one.finished_at is not None
        itl = (one.finished_at - one.first_token_at) / 7
        if h100:
            rows.append((profile, "batch 1, input 128: decode step (ITL)", "=", 0.00706, itl,
                         "sglang PR #1401, bench_latency, Llama-3-8B, triton + CUDA graph"))
            rows.append((profile, "batch 1, input 128: decode step (ITL)", "=", 0.00735, itl,
                         "sglang PR #1401, same, flashinfer + CUDA graph"))
            rows.append((profile, "batch 1: decode step (ITL)", "<", 1 / 135, itl,
                         "sglang test_bench_one_batch.py CI bound: > 135 token/s"))
        else:
            rows.append((profile, "batch 1, input 128: decode step (ITL)", "-", float("nan"), itl,
                         "no published SGLang H200 figure found"))
        batch = r.run([Arrival(0.0, prompt(128, 200 + i), 1) for i in range(128)])
        prefill = max(q.first_token_at or 0.0 for q in batch) - min(q.arrival for q in batch)
        rows.append((profile, "batch 128 x input 128: prefill", "=" if h100 else "-", 0.373 if h100 else float("nan"),
                     prefill, "sglang PR #2134, bench_one_batch, Llama-3.1-8B (GPU not stated)" if h100
                     else "no published SGLang H200 figure found"))
        for n in (1024, 2048, 4096):
            r.engine.flush_cache()
            solo = r.run([Arrival(0.0, prompt(n, 300 + n), 1)])[0]
            bounded = h100 and n <= 2048  # the CI workload's median prompt is not longer than this
            rows.append((profile, f"single request, input {n}: TTFT (engine only)", "<" if bounded else "-",
                         0.080 if bounded else float("nan"), ttft(solo),
                         "sglang test_bench_serving.py CI bound: median TTFT < 80 ms at 1 req/s" if bounded
                         else "no published figure found"))
    return rows


def main() -> int:
    print("Part 1: gpu-calibration.md (real engine on one H200) vs profile h200-transformers-7b-engine-only")
    print(f"{'measurement':<66} {'measured':>9} {'simulated':>9} {'error':>7}")
    worst = 0.0
    for what, measured, simulated in calibration_cases():
        err = simulated / measured - 1
        worst = max(worst, abs(err))
        flag = "" if abs(err) <= TOLERANCE else "  <-- off by more than 20%"
        print(f"{what:<66} {measured:>9.4f} {simulated:>9.4f} {err:>+7.1%}{flag}")
    print(f"worst error: {worst:.1%} (target <= {TOLERANCE:.0%})\n")
    print("Part 2: SGLang profiles vs published SGLang figures (Llama-3(.1)-8B, bf16, TP1)")
    print(f"{'profile':<19} {'measurement':<46} {'published':>10} {'simulated':>9} {'error':>7}  source")
    for profile, what, kind, published, simulated, source in sglang_cases():
        if kind == "=":
            pub, verdict = f"{published:.4f}", f"{simulated / published - 1:>+7.1%}"
        elif kind == "<":
            pub, verdict = f"< {published:.4f}", "ok" if simulated < published else "ABOVE"
        else:
            pub, verdict = "-", ""
        print(f"{profile:<19} {what:<46} {pub:>10} {simulated:>9.4f} {verdict:>7}  {source}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
