"""One typed record per request: monotonic stage marks and the durations derived from them.

Marks are set by the pipeline as the request moves; every derived duration is ``None`` until both
of its marks exist, so a request that failed early never reports a made-up stage.

    received ─ admitted ─ dispatched ─ upstream_headers ─ first_byte ─ first_token ─ … tokens … ─ done
      └ admission_wait ┘            └── upstream_ttfb ──┘
                        (prefix_hold: part of admitted ─ dispatched, when routing held the request)
      └──────────────────────── ttft (as the client sees it) ─────────┘
                                                          └──────── decode ──────────┘
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTiming:
    received: float
    admitted: float | None = None
    dispatched: float | None = None
    upstream_headers: float | None = None
    first_byte: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    done: float | None = None
    # Seconds held between admitted and dispatched for a prefix being prefilled (routing.hold_max_s).
    prefix_hold: float = 0.0
    # Gaps between consecutive token-bearing chunks, seconds.
    token_gaps: list[float] = field(default_factory=list)
    # What the worker itself reported (meta_info, --enable-metrics), seconds.
    worker_queue_time: float | None = None
    worker_first_token_latency: float | None = None
    worker_e2e_latency: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None

    def mark_token(self, t: float) -> None:
        """Record a chunk that carried new output; the first one is the first token."""
        if self.first_token is None:
            self.first_token = t
        elif self.last_token is not None:
            self.token_gaps.append(t - self.last_token)
        self.last_token = t

    # -- derived durations ------------------------------------------------------------------
    @staticmethod
    def _span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else max(0.0, b - a)

    @property
    def admission_wait(self) -> float | None:
        return self._span(self.received, self.admitted)

    @property
    def upstream_ttfb(self) -> float | None:
        return self._span(self.dispatched, self.upstream_headers)

    @property
    def ttft(self) -> float | None:
        return self._span(self.received, self.first_token)

    @property
    def upstream_ttft(self) -> float | None:
        return self._span(self.dispatched, self.first_token)

    @property
    def proxy_overhead(self) -> float | None:
        """Our share of TTFT: time before dispatch, excluding the admission queue wait and a hold."""
        if self.dispatched is None:
            return None
        wait = self.admission_wait or 0.0
        return max(0.0, self.dispatched - self.received - wait - self.prefix_hold)

    @property
    def decode(self) -> float | None:
        return self._span(self.first_token, self.last_token)

    @property
    def e2e(self) -> float | None:
        return self._span(self.received, self.done)

    @property
    def itl_mean(self) -> float | None:
        return sum(self.token_gaps) / len(self.token_gaps) if self.token_gaps else None

    @property
    def itl_max(self) -> float | None:
        return max(self.token_gaps) if self.token_gaps else None

    @property
    def itl_p95(self) -> float | None:
        if not self.token_gaps:
            return None
        ordered = sorted(self.token_gaps)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]

    @property
    def uncached_prompt_tokens(self) -> int | None:
        if self.prompt_tokens is None:
            return None
        return max(0, self.prompt_tokens - (self.cached_tokens or 0))

    def stages(self) -> dict[str, float | None]:
        """Named durations for logs and reports (seconds)."""
        return {
            "admission_wait": self.admission_wait,
            "prefix_hold": self.prefix_hold or None,
            "proxy_overhead": self.proxy_overhead,
            "upstream_ttfb": self.upstream_ttfb,
            "worker_queue": self.worker_queue_time,
            "ttft": self.ttft,
            "itl_mean": self.itl_mean,
            "itl_p95": self.itl_p95,
            "itl_max": self.itl_max,
            "decode": self.decode,
            "e2e": self.e2e,
        }
