"""How engine processes on one GPU share it, for a virtual-time loop (``loadtests/fidelity.py``'s
replay): ``gpu_pool`` picks by ``Profile.gpu_sharing``.

* ``WholeSteps`` (``fcfs``, the default): ``perf.SharedGpu`` behind this interface; each step
  holds the GPU whole, first come first served. The GPU fleet's runs fit it best.
* ``TimeSlicedGpu`` (``slices``): a share to every engine with a step on the GPU, as the driver
  time-slices contexts: equal, or weighted by the step's GPU seconds ** ``gpu_share_exponent``;
  with ``overlap`` (``slices-overlap``) a step's host time also runs beside its own GPU work.
  ``QuantumGpu`` (``quanta``): turns of at most ``gpu_quantum_s``, round robin, between whole
  steps and equal shares. Time slices (profiles ``h200-transformers-7b-slices``, ``-dense``) match the GPU
  engines' own step clock; equal shares, overlap and quanta measured worse than whole steps
  (``proxy/sim/README.md``).

A step's end can depend on steps issued after it, so the loop asks ``next_event`` for the next
instant anything changes, advances to it, and collects the steps ``done`` then. A step of
``host`` + ``device`` seconds spends ``(1 - exclusive) x host`` on the host first (other engines'
GPU work overlaps it), then needs ``exclusive x host + device`` seconds of the GPU: an engine
launching kernels one by one keeps its context resident through part of its host time. Alone on
the GPU a step takes ``host + device`` (with ``overlap``: the longer of the two).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Generic, Protocol, TypeVar

from proxy.sim.perf import Profile, SharedGpu

# Work left below this (seconds of GPU) counts as done: float residue of the shares.
_EPS = 1e-12

# What names a step in a pool (an engine's index or URL, or the step itself): ``done`` gives back
# the keys ``submit`` took.
K = TypeVar("K", bound=Hashable)


class GpuSteps(Protocol[K]):
    """The engines' steps on their GPU(s), for a virtual-time loop."""

    def submit(self, key: K, now: float, host: float, device: float) -> None: ...
    def next_event(self) -> float: ...
    def done(self, now: float) -> list[K]: ...


class TimeSlicedGpu(Generic[K]):
    """Processor sharing: every step on the GPU advances at its weight over the sum of the
    weights of the steps on it (equal shares with ``exponent`` 0)."""

    def __init__(self, exclusive: float = 0.0, overlap: bool = False, exponent: float = 0.0) -> None:
        if not 0.0 <= exclusive <= 1.0:
            raise ValueError("exclusive must be within [0, 1]")
        self.exclusive = exclusive
        # a step's share weighs (its GPU seconds) ** exponent: 0 equal shares; above 0 a step of
        # big kernels (a prefill) keeps the GPU longer per turn than one of small ones (decodes)
        self.exponent = exponent
        self._weight: dict[K, float] = {}
        # overlap: a step's GPU work starts as it is issued and its host time runs beside it (the
        # engine launches kernels asynchronously); it ends at the later of the two
        self.overlap = overlap
        # key -> [GPU seconds left, when it joins the GPU, when it may end at the earliest]
        self._steps: dict[K, list[float]] = {}
        self._now = -math.inf

    def submit(self, key: K, now: float, host: float, device: float) -> None:
        """A step of ``key`` (one engine: one step at a time) issued at ``now``."""
        self.advance(now)
        if key in self._steps:
            raise ValueError(f"{key!r} already has a step on the GPU")
        if self.overlap:
            self._steps[key] = [device, now, now + host]
        else:
            ready = now + (1.0 - self.exclusive) * host
            self._steps[key] = [self.exclusive * host + device, ready, ready]
        self._weight[key] = max(self._steps[key][0], 1e-6) ** self.exponent

    def _on_gpu(self, now: float) -> list[tuple[list[float], float]]:
        return [(s, self._weight[k]) for k, s in self._steps.items() if s[1] <= now and s[0] > _EPS]

    def next_event(self) -> float:
        """The next instant a step ends or joins the GPU (inf: nothing in flight)."""
        now = self._now
        waiting = [ready for _, ready, _ in self._steps.values() if ready > now]
        on = self._on_gpu(now)
        total = sum(w for _, w in on)
        # at least one ulp ahead: with a large clock (the real-time driver's) a residue of work
        # can be below the float resolution of ``now``, and the loop must still move on
        ends = [max(now + min(s[0] * total / w for s, w in on), math.nextafter(now, math.inf))] if on else []
        # a step with no GPU work left ends when its host part does
        ends += [end for left, _, end in self._steps.values() if left <= _EPS]
        return min(waiting + ends, default=math.inf)

    def advance(self, now: float) -> None:
        """Serve the GPU up to ``now``, which must not pass ``next_event`` (the shares are
        constant up to it)."""
        if now <= self._now:
            return
        if self._now > -math.inf:
            on = self._on_gpu(self._now)
            total = sum(w for _, w in on)
            for step, w in on:
                step[0] = max(0.0, step[0] - (now - self._now) * w / total)
        self._now = now

    def done(self, now: float) -> list[K]:
        """The keys whose steps have ended by ``now`` (removed)."""
        self.advance(now)
        out = [k for k, (left, _, end) in self._steps.items() if left <= _EPS and end <= now]
        for k in out:
            del self._steps[k]
            del self._weight[k]
        return out


class QuantumGpu(Generic[K]):
    """Steps take the GPU in arrival order for at most ``quantum_s`` at a time, an unfinished one
    going to the back of the queue (round robin): whole steps first come first served as the
    quantum grows (``SharedGpu``), equal shares as it shrinks (``TimeSlicedGpu``). Host time as
    ``TimeSlicedGpu``'s (``exclusive``)."""

    def __init__(self, exclusive: float = 0.0, quantum_s: float = math.inf) -> None:
        if not 0.0 <= exclusive <= 1.0 or not quantum_s > 0:
            raise ValueError("exclusive must be within [0, 1] and quantum_s > 0")
        self.exclusive, self.quantum_s = exclusive, quantum_s
        self._steps: dict[K, list[float]] = {}  # key -> [GPU seconds left, joins the GPU at]
        self._queue: list[K] = []  # on the GPU: the head runs
        self._slice_left = quantum_s
        self._now = -math.inf

    def submit(self, key: K, now: float, host: float, device: float) -> None:
        self.advance(now)
        if key in self._steps:
            raise ValueError(f"{key!r} already has a step on the GPU")
        self._steps[key] = [self.exclusive * host + device, now + (1.0 - self.exclusive) * host]
        self._join(now)

    def _join(self, now: float) -> None:
        """Steps whose host part has ended queue for the GPU, in the order they got there."""
        ready = sorted((at, str(k), k) for k, (left, at) in self._steps.items()
                       if at <= now and left > _EPS and k not in self._queue)
        if not self._queue and ready:
            self._slice_left = self.quantum_s
        self._queue += [k for _, _, k in ready]

    def next_event(self) -> float:
        now = self._now
        times = [at for left, at in self._steps.values() if at > now]
        if self._queue:
            turn = now + min(self._steps[self._queue[0]][0], self._slice_left)
            times.append(max(turn, math.nextafter(now, math.inf)))  # as TimeSlicedGpu's
        times += [at for left, at in self._steps.values() if left <= _EPS]
        return min(times, default=math.inf)

    def advance(self, now: float) -> None:
        """Serve the head up to ``now`` (not past ``next_event``), rotate it at its quantum's end."""
        if now <= self._now:
            return
        if self._queue and self._now > -math.inf:
            head = self._steps[self._queue[0]]
            used = now - self._now
            head[0] = max(0.0, head[0] - used)
            self._slice_left -= used
            if head[0] <= _EPS:
                self._queue.pop(0)
                self._slice_left = self.quantum_s
            elif self._slice_left <= _EPS:
                self._queue.append(self._queue.pop(0))
                self._slice_left = self.quantum_s
        self._now = now
        self._join(now)

    def done(self, now: float) -> list[K]:
        self.advance(now)
        out = [k for k, (left, at) in self._steps.items() if left <= _EPS and at <= now]
        for k in out:
            del self._steps[k]
        return out


class WholeSteps(Generic[K]):
    """``SharedGpu`` (whole steps, first come first served) behind ``TimeSlicedGpu``'s interface:
    one GPU for every key, or one each (``shared`` False)."""

    def __init__(self, exclusive: float, shared: bool = True) -> None:
        self._one = SharedGpu(exclusive) if shared else None
        self._exclusive = exclusive
        self._gpus: dict[K, SharedGpu] = {}
        self._ends: dict[K, float] = {}

    def submit(self, key: K, now: float, host: float, device: float) -> None:
        if key in self._ends:
            raise ValueError(f"{key!r} already has a step on the GPU")
        gpu = self._one or self._gpus.setdefault(key, SharedGpu(self._exclusive))
        self._ends[key] = gpu.reserve(now, host, device)

    def next_event(self) -> float:
        return min(self._ends.values(), default=math.inf)

    def done(self, now: float) -> list[K]:
        out = [k for k, end in self._ends.items() if end <= now]
        for k in out:
            del self._ends[k]
        return out


def gpu_pool(profile: Profile, engines: int, shared: bool = True) -> GpuSteps[K]:
    """The GPU(s) ``engines`` engine processes run on, shared as ``profile.gpu_sharing`` says."""
    sharing = profile.gpu_sharing
    if sharing not in ("fcfs", "slices", "slices-overlap", "quanta"):
        raise ValueError(f"gpu_sharing: {sharing!r} is none of fcfs, slices, slices-overlap, quanta")
    if sharing == "slices-overlap":
        # the overlap of a step's host and GPU time holds for an engine alone as well
        if not shared and engines > 1:
            raise ValueError("gpu_sharing slices-overlap: one GPU for every engine only")
        return TimeSlicedGpu(profile.gpu_exclusive_host, overlap=True)
    if shared and engines > 1 and sharing == "slices":
        return TimeSlicedGpu(profile.gpu_exclusive_host, exponent=profile.gpu_share_exponent)
    if shared and engines > 1 and sharing == "quanta":
        return QuantumGpu(profile.gpu_exclusive_host, profile.gpu_quantum_s)
    return WholeSteps(profile.gpu_exclusive_host, shared)
