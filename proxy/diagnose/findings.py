"""What the rules say: their thresholds (``RuleParams``), the evidence, levers and findings they
return, and the verdict they add up to (``rules.py`` computes them; ``report.py`` renders them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

TUNE, AT_CEILING, HEALTHY, INSUFFICIENT = "tune", "at_ceiling", "healthy", "insufficient_data"
VERDICT_KINDS = (TUNE, AT_CEILING, HEALTHY, INSUFFICIENT)
# Policies that ignore the prompt, so they cannot keep a prefix on the worker that holds it.
PREFIX_BLIND_POLICIES = frozenset({"round_robin", "least_load", "random", "power_of_two"})


@dataclass(frozen=True)
class RuleParams:
    """Thresholds of the rules; every default is the value documented beside it."""

    slo_ttft_p95_s: float = 2.0  # TTFT p95 target, seconds
    min_requests: int = 50  # fewer successful requests in the window → insufficient data
    min_cache_reports: int = 20  # cache rules need this many requests with cached_tokens reported
    min_available: float = 0.10  # below this the workload offers too little reuse to chase
    capture_gap: float = 0.15  # available - captured at least this (absolute share of prompt tokens)…
    capture_ratio: float = 0.75  # …and captured / available at most this → captured ≪ available
    capacity_gap: float = 0.15  # reuse ceiling - available at least this → KV pool too small
    saturation: float = 0.85  # occupancy or KV usage at or above this = saturated
    kv_headroom: float = 0.60  # KV usage below this while requests queue = admission holds back
    running_at_cap: float = 0.90  # running / max_running at or above this = the batch cap binds
    standing_queue: float = 1.0  # mean engine queue per worker at or above this…
    queue_wait_fraction: float = 0.25  # …or worker queue / admission wait p95 ≥ this x SLO → requests queue
    idle_gap_share: float = 0.30  # GPU idle share at or above this with demand = large gaps
    small_idle_share: float = 0.10  # GPU idle share at or below this = gaps small
    tail_spread: float = 3.0  # TTFT p95 / p50 at or above this = a tail
    queue_tail_share: float = 0.50  # (worker queue + admission wait) p95 / TTFT p95 ≥ this = tail is queueing
    flat_decode_jitter: float = 1.5  # ITL p95 / p50 at or below this = flat decode
    jittery_decode: float = 2.0  # ITL p95 / p50 at or above this = jittery decode
    proxy_overhead_share: float = 0.10  # our share of TTFT at or above this
    prefill_stall_ratio: float = 3.0  # median per-request worst gap / ITL p10 at or above this…
    prefill_stall_s: float = 0.05  # …and at least this far above p10 (seconds) = decode steps wait for prefill
    prefill_heavy_tokens: float = 1024.0  # uncached prompt tokens p95 at or above this = big prefills arrive
    overload_growth: float = 2.0  # median TTFT of the window's last third at or above this x its first third…
    overload_min_s: float = 0.5  # …and that many seconds above it, with the SLO missed = arrivals outrun the fleet…
    overload_still_growing: float = 0.25  # …and the last third this share of that rise above the middle third's
    load_bound_ratio: float = 2.0  # TTFT p95 at or above this x the same prompts' unloaded estimate = load-bound
    hot_prefix_share: float = 1.5  # one prefix's share of requests at or above this x (1 / workers)…
    # …on each worker that served it, while its own TTFT p95 misses the SLO = a hot prefix

    @classmethod
    def from_mapping(cls, values: Mapping[str, float], base: RuleParams | None = None) -> RuleParams:
        """Override named thresholds; an unknown name raises ValueError naming it."""
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, float | int] = {}
        for name, value in values.items():
            if name not in known:
                raise ValueError(f"{name}: unknown threshold (known: {', '.join(sorted(known))})")
            kwargs[name] = int(value) if known[name].type in ("int", int) else float(value)
        return dataclasses.replace(base or cls(), **kwargs)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Evidence:
    signal: str
    value: float | None
    op: str
    threshold: float | None
    holds: bool
    note: str = ""


@dataclass(frozen=True, slots=True)
class Lever:
    setting: str  # an SGLang flag, a radixgate setting, or a fleet/model action
    where: str  # "sglang" | "radixgate" | "fleet" | "model_or_hardware" | "profiling"
    change: str


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    kind: str
    cause: str
    summary: str
    confidence: float
    evidence: tuple[Evidence, ...]
    levers: tuple[Lever, ...]

    @property
    def confidence_label(self) -> str:
        return confidence_label(self.confidence)


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str
    summary: str
    confidence: float
    levers: tuple[Lever, ...]
    findings: tuple[Finding, ...]
    slo_ttft_p95_s: float
    ttft_p95_s: float | None
    slo_met: bool | None

    @property
    def confidence_label(self) -> str:
        return confidence_label(self.confidence)


def confidence_label(c: float) -> str:
    return "high" if c >= 0.75 else "medium" if c >= 0.5 else "low"


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda a, b: a >= b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
}


def ev(signal: str, value: float | None, op: str, threshold: float | None, note: str = "") -> Evidence:
    holds = value is not None and threshold is not None and _OPS[op](value, threshold)
    return Evidence(signal, value, op, threshold, holds, note)
