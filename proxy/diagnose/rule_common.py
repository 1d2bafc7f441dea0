"""What several diagnosis rules share: how sure a finding is, and the queueing / saturation evidence."""

from __future__ import annotations

from proxy.diagnose.findings import Evidence, RuleParams, ev
from proxy.diagnose.signals import Signals


def strength(value: float | None, threshold: float, *, above: bool = True) -> float:
    """0.6 at the threshold, rising to 1.0 once the value is twice as far past it."""
    if value is None or threshold <= 0:
        return 0.6
    margin = (value - threshold) / threshold if above else (threshold - value) / threshold
    return 0.6 + 0.4 * min(1.0, max(0.0, margin))


def data_weight(s: Signals, p: RuleParams) -> float:
    return 0.5 + 0.5 * min(1.0, s.window.ok / max(1, 4 * p.min_requests))


def requests_queue(s: Signals, p: RuleParams) -> tuple[bool, list[Evidence]]:
    """Requests queue: a standing engine queue, a long reported queue time, or a long admission wait."""
    wait_limit = p.queue_wait_fraction * p.slo_ttft_p95_s
    evidence = [
        ev("occupancy.queued_mean", s.occupancy.queued_mean, ">=", p.standing_queue),
        ev("latency.worker_queue.p95_s", s.latency.worker_queue.p95, ">=", wait_limit),
        ev("latency.admission_wait.p95_s", s.latency.admission_wait.p95, ">=", wait_limit),
    ]
    return any(e.holds for e in evidence), evidence


def queue_waits(s: Signals) -> list[float]:
    """The reported queue waits' p95s: the worker's own queue time and our admission wait."""
    return [d.p95 for d in (s.latency.worker_queue, s.latency.admission_wait) if d.p95 is not None]


def queue_concentration(s: Signals) -> float | None:
    """The most-queued worker's share of the fleet's engine queue (1 / workers when even, 1.0 when
    one worker holds all of it); ``None`` with fewer than two workers reporting a queue, or none queued."""
    queued = [w.queued_mean for w in s.occupancy.workers if w.queued_mean is not None]
    total = sum(queued)
    if len(queued) < 2 or total <= 0:
        return None
    return max(queued) / total


def queue_balance(s: Signals) -> float:
    """How evenly the engine queue stands over the workers: 1.0 even (or unknown), 0.0 when one
    worker holds all of it while the others have none."""
    conc, n = queue_concentration(s), sum(1 for w in s.occupancy.workers if w.queued_mean is not None)
    if conc is None:
        return 1.0
    return max(0.0, min(1.0, (1.0 - conc) / (1.0 - 1.0 / n)))


def saturation(s: Signals) -> float | None:
    known = [v for v in (s.occupancy.occupancy_mean, s.occupancy.token_usage_mean) if v is not None]
    return max(known) if known else None
