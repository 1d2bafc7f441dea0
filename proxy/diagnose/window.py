"""Sliding windows of finished requests and of worker snapshots, the raw material of a diagnosis.

A window keeps the newest items, bounded two ways at once: by count (``max_items``) and by age
(``max_age_s`` seconds on the injected ``Clock``; 0 = no age bound). Trimming happens on every
``add`` and every read, so a quiet proxy forgets old traffic even when nothing new arrives.
Adding is O(1) amortised; reading copies the live items.

``RequestRecord`` is the one typed record per finished request that the diagnosis reads: the
request's ``RequestTiming`` plus where it went, how it ended, the token counts the worker reported,
and the chained block hashes routing computed (so the fleet-wide cache can be replayed later).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from proxy.clock import Clock
from proxy.routing.base import PINNED, Decision, RouteRequest, WorkerSnapshot
from proxy.routing.prefix_key import prefix_tokens
from proxy.timing import RequestTiming

T = TypeVar("T")

OUTCOME_OK = "ok"
OUTCOME_CANCELLED = "cancelled"  # the client went away (proxy/pipeline/end.py)
# Errors that mean "waited too long", not "could not be served" (a bad request, a sick worker).
WAITED_OUT_CAUSES = frozenset({"upstream_timeout"})


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One finished request as the diagnosis sees it.

    ``timing`` must no longer change once the record exists (the pipeline records at ``done``).
    Token counts are what the worker reported (``None`` = not reported); ``estimated_prompt_tokens``
    is the proxy's own estimate that sized ``block_hashes``.
    """

    timing: RequestTiming
    worker: str
    outcome: str = OUTCOME_OK
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    block_hashes: tuple[int, ...] = ()
    block_tokens: int = 16
    estimated_prompt_tokens: int = 0
    policy: str = ""
    # A text prompt: ``block_tokens`` is an estimate (a fixed byte span over the learned bytes per
    # token), not a hash block in tokens that a worker's page size could divide.
    text_prompt: bool = False
    # What the routing decision expected the chosen worker to hold of the prompt, in the proxy's
    # token units (exact from KV events); the captured reuse when workers report none.
    predicted_cached_tokens: int | None = None
    cause: str | None = None  # why it did not end ok (proxy/errors.py causes), None when it did
    # The peer replica that routed it and told us (``diagnose.fleet_view``); "" = this one.
    peer: str = ""
    # To find its log line and spans (GET /diagnosis/tail); not shared with peers.
    rid: str = ""
    trace_id: str | None = None
    # The DP rank of ``worker`` the request named (radixgate's choice or its caller's, with
    # routing.dp_ranks on); None: one rank, or the worker's own controller chose.
    dp_rank: int | None = None

    @classmethod
    def of(
        cls,
        timing: RequestTiming,
        *,
        worker: str,
        outcome: str = OUTCOME_OK,
        route: RouteRequest | None = None,
        policy: str = "",
        decision: Decision | None = None,
        cause: str | None = None,
        rid: str = "",
        trace_id: str | None = None,
        dp_rank: int | None = None,
    ) -> RequestRecord:
        """Build a record from the pipeline's objects; token counts come from ``timing``."""
        predicted = None
        if route is not None and decision is not None and decision.branch != PINNED:
            matched = decision.matched_tokens
            predicted = min(route.prompt_tokens,
                            prefix_tokens(decision.matched_blocks, route.block_tokens) if matched is None else matched)
        return cls(
            timing=timing,
            worker=worker,
            outcome=outcome,
            prompt_tokens=timing.prompt_tokens,
            cached_tokens=timing.cached_tokens,
            completion_tokens=timing.completion_tokens,
            block_hashes=route.block_hashes if route else (),
            block_tokens=route.block_tokens if route else 16,
            estimated_prompt_tokens=route.prompt_tokens if route else 0,
            policy=policy,
            text_prompt=route is not None and route.prompt_bytes > 0,
            predicted_cached_tokens=predicted,
            cause=cause,
            rid=rid,
            trace_id=trace_id,
            dp_rank=dp_rank,
        )

    @property
    def ok(self) -> bool:
        return self.outcome == OUTCOME_OK

    @property
    def ttft_evidence(self) -> float | None:
        """Its TTFT where the first token came, whatever the ending (a client that left mid-answer
        still got its first token then), else ``waited_out``."""
        return self.timing.ttft if self.timing.first_token is not None else self.waited_out

    @property
    def waited_out(self) -> float | None:
        """How long a request waited that ended without a first token because its client left or
        its time ran out: a lower bound of its TTFT (None for any other request). Past a fleet's
        capacity most requests end so; a latency read from the answered ones alone would be the
        survivors' (on the GPU fleet: 89 of 135 given up, the answered ones' p95 7.8 s)."""
        t = self.timing
        if self.ok or t.first_token is not None or t.done is None:
            return None
        if self.outcome == OUTCOME_CANCELLED or self.cause in WAITED_OUT_CAUSES:
            return max(0.0, t.done - t.received)
        return None

    @property
    def order_key(self) -> float:
        """When the request reached a worker's cache (dispatch), else when it arrived."""
        t = self.timing
        return t.dispatched if t.dispatched is not None else t.received


@dataclass(frozen=True, slots=True)
class SnapshotSample:
    """The fleet's worker snapshots as they stood at one moment (clock seconds)."""

    at: float
    workers: tuple[WorkerSnapshot, ...]


class SlidingWindow(Generic[T]):
    """The newest items, at most ``max_items`` of them and none older than ``max_age_s``."""

    def __init__(self, clock: Clock, *, max_items: int, max_age_s: float = 0.0) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        if max_age_s < 0:
            raise ValueError("max_age_s must be >= 0 (0 = no age bound)")
        self._clock = clock
        self._max_age_s = max_age_s
        self._entries: deque[tuple[float, T]] = deque(maxlen=max_items)

    @property
    def max_items(self) -> int:
        return self._entries.maxlen or 0

    @property
    def max_age_s(self) -> float:
        return self._max_age_s

    def add(self, item: T) -> None:
        now = self._clock.now()
        self._entries.append((now, item))
        self._trim(now)

    def items(self) -> list[T]:
        self._trim(self._clock.now())
        return [item for _, item in self._entries]

    def stamped(self) -> list[tuple[float, T]]:
        """Items with the clock time each was added."""
        self._trim(self._clock.now())
        return list(self._entries)

    def __len__(self) -> int:
        self._trim(self._clock.now())
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()

    def _trim(self, now: float) -> None:
        if self._max_age_s <= 0:
            return
        oldest_allowed = now - self._max_age_s
        while self._entries and self._entries[0][0] < oldest_allowed:
            self._entries.popleft()


class DiagnosisWindows:
    """The two windows a diagnosis reads: finished requests and worker snapshots over time."""

    def __init__(
        self,
        clock: Clock,
        *,
        max_requests: int = 1000,
        max_age_s: float = 300.0,
        max_snapshot_samples: int = 600,
        snapshot_interval_s: float = 0.0,
    ) -> None:
        self._clock = clock
        # Snapshots are published on every scrape of every worker; keep at most one sample per interval.
        self._snapshot_interval_s = snapshot_interval_s
        self._last_sample_at: float | None = None
        self.requests: SlidingWindow[RequestRecord] = SlidingWindow(
            clock, max_items=max_requests, max_age_s=max_age_s
        )
        self.snapshots: SlidingWindow[SnapshotSample] = SlidingWindow(
            clock, max_items=max_snapshot_samples, max_age_s=max_age_s
        )

    def record(self, record: RequestRecord) -> None:
        self.requests.add(record)

    def observe(self, workers: Sequence[WorkerSnapshot]) -> None:
        """Keep a sample of the fleet's snapshots, at most one per ``snapshot_interval_s``."""
        now = self._clock.now()
        last = self._last_sample_at
        if last is not None and now - last < self._snapshot_interval_s:
            return
        self._last_sample_at = now
        self.snapshots.add(SnapshotSample(at=now, workers=tuple(workers)))
