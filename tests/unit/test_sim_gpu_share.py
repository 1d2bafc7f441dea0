"""proxy.sim.gpu_share: engine processes time-slicing one GPU, and whole steps first come first
served behind the same interface."""

import dataclasses
import math

import pytest

from proxy.sim import perf
from proxy.sim.gpu_share import GpuSteps, QuantumGpu, TimeSlicedGpu, WholeSteps, gpu_pool


def run(gpu: GpuSteps, steps: dict[str, tuple[float, float, float]]) -> dict[str, float]:
    """Issue each key's (at, host, device) step and drive the GPU: each key's end."""
    pending = sorted(steps.items(), key=lambda kv: kv[1][0])
    ends: dict[str, float] = {}
    now = 0.0
    for _ in range(1000):
        while pending and pending[0][1][0] <= now:
            key, (_at, host, device) = pending.pop(0)
            gpu.submit(key, now, host, device)
        for key in gpu.done(now):
            ends[str(key)] = now
        if not pending and len(ends) == len(steps):
            return ends
        now = min([gpu.next_event()] + [p[1][0] for p in pending])
    raise AssertionError("did not finish")


def test_alone_a_step_takes_host_plus_device_in_either() -> None:
    for gpu in (TimeSlicedGpu(0.2), WholeSteps(0.2)):
        assert run(gpu, {"a": (1.0, 0.06, 0.5)})["a"] == pytest.approx(1.56)


def test_time_slices_let_a_short_step_pass_a_long_one() -> None:
    steps = {"long": (0.0, 0.0, 1.0), "short": (0.1, 0.0, 0.1)}
    sliced = run(TimeSlicedGpu(0.0), steps)
    # from 0.1 both share: short needs 0.1 s of GPU at half speed -> 0.3; long then gets it whole
    assert sliced["short"] == pytest.approx(0.3)
    assert sliced["long"] == pytest.approx(1.1)  # work conserved: 1.1 s of GPU work in all
    whole = run(WholeSteps(0.0), steps)
    assert whole["short"] == pytest.approx(1.1) and whole["long"] == pytest.approx(1.0)


def test_weighted_slices_give_a_step_of_more_gpu_work_a_larger_share() -> None:
    steps = {"prefill": (0.0, 0.0, 4.0), "decode": (0.0, 0.0, 1.0)}
    equal = run(TimeSlicedGpu(0.0), steps)
    assert equal["decode"] == pytest.approx(2.0) and equal["prefill"] == pytest.approx(5.0)
    # weights 4 ** 0.5 = 2 and 1: the prefill runs at 2/3, the decode at 1/3 until it ends at 3
    weighted = run(TimeSlicedGpu(0.0, exponent=0.5), steps)
    assert weighted["decode"] == pytest.approx(3.0) and weighted["prefill"] == pytest.approx(5.0)
    # exponent 1: shares in proportion to the work, so both end together (work conserved)
    both = run(TimeSlicedGpu(0.0, exponent=1.0), steps)
    assert both["decode"] == pytest.approx(5.0) and both["prefill"] == pytest.approx(5.0)


def test_host_time_overlaps_other_engines_gpu_work() -> None:
    # exclusive 0.5: b's 0.2 s of host time is half on the host alone (0.1) then half on the GPU
    ends = run(TimeSlicedGpu(0.5), {"a": (0.0, 0.0, 1.0), "b": (0.0, 0.2, 0.0)})
    # b joins the GPU at 0.1 with 0.1 s of work, shared: done at 0.3; a: 1.0 + 0.1 = 1.1
    assert ends["b"] == pytest.approx(0.3)
    assert ends["a"] == pytest.approx(1.1)


def test_one_step_per_key_and_the_pool_by_profile() -> None:
    gpu = TimeSlicedGpu()
    gpu.submit("a", 0.0, 0.0, 1.0)
    with pytest.raises(ValueError):
        gpu.submit("a", 0.5, 0.0, 1.0)
    assert TimeSlicedGpu().next_event() == math.inf
    profile = perf.PROFILES["h200-transformers-7b"]
    assert isinstance(gpu_pool(profile, 4), WholeSteps)
    sliced = dataclasses.replace(profile, gpu_sharing="slices")
    assert isinstance(gpu_pool(sliced, 4), TimeSlicedGpu)
    assert isinstance(gpu_pool(sliced, 4, shared=False), WholeSteps)
    with pytest.raises(ValueError, match="gpu_sharing"):
        gpu_pool(dataclasses.replace(profile, gpu_sharing="mps"), 4)


def test_separate_gpus_do_not_queue() -> None:
    ends = run(WholeSteps(0.0, shared=False), {"a": (0.0, 0.0, 1.0), "b": (0.0, 0.0, 1.0)})
    assert ends == {"a": pytest.approx(1.0), "b": pytest.approx(1.0)}


def test_overlap_ends_a_step_at_the_later_of_host_and_gpu_time() -> None:
    # alone: max(host, device), not their sum
    assert run(TimeSlicedGpu(overlap=True), {"a": (0.0, 0.06, 0.5)})["a"] == pytest.approx(0.5)
    assert run(TimeSlicedGpu(overlap=True), {"a": (0.0, 0.06, 0.01)})["a"] == pytest.approx(0.06)
    # two engines: the GPU shared from the start, host time beside it
    ends = run(TimeSlicedGpu(overlap=True), {"a": (0.0, 0.06, 0.1), "b": (0.0, 0.3, 0.1)})
    assert ends["a"] == pytest.approx(0.2) and ends["b"] == pytest.approx(0.3)
    profile = dataclasses.replace(perf.PROFILES["h200-transformers-7b"], gpu_sharing="slices-overlap")
    lone = gpu_pool(profile, 1)
    assert isinstance(lone, TimeSlicedGpu) and lone.overlap
    with pytest.raises(ValueError, match="one GPU for every engine"):
        gpu_pool(profile, 4, shared=False)


def test_quanta_between_whole_steps_and_equal_shares() -> None:
    steps = {"long": (0.0, 0.0, 1.0), "short": (0.1, 0.0, 0.1)}
    # a quantum longer than any step: whole steps, first come first served
    assert run(QuantumGpu(0.0, 10.0), steps) == {"long": pytest.approx(1.0), "short": pytest.approx(1.1)}
    # 0.05 s turns: short joins at 0.1 (long's turn ends at 0.15), runs 0.15-0.2, long's turn,
    # short again 0.25-0.3; long ends at 1.1 (work conserved)
    ends = run(QuantumGpu(0.0, 0.05), steps)
    assert ends["short"] == pytest.approx(0.3) and ends["long"] == pytest.approx(1.1)
    # alone, host + device whatever the quantum
    assert run(QuantumGpu(0.2, 0.01), {"a": (1.0, 0.06, 0.5)})["a"] == pytest.approx(1.56)
    with pytest.raises(ValueError):
        QuantumGpu(0.0, 0.0)
