"""The contract between the data path and every routing policy.

A policy is pure: it reads a ``RouteRequest`` and frozen ``WorkerSnapshot``s and returns a
``Decision``. It reads no clock, does no I/O and touches no metric; the caller records
``Decision.branch`` as a metric label. Snapshots that are stale arrive already marked
``saturated`` by the scraper, never as idle.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class KvMatch(Protocol):
    @property
    def tokens(self) -> int: ...
    @property
    def evicted(self) -> bool: ...


class KvView(Protocol):
    """What a worker's KV cache events say it holds (``proxy.workers.kv_fleet``)."""

    def match(self, token_ids: Sequence[int]) -> KvMatch | None:
        """Leading tokens of this token-id prompt the engine holds, and whether the next block
        was reported removed; None while its event stream cannot be trusted (then use the
        approximate index)."""
        ...

    def rank_matches(self, token_ids: Sequence[int]) -> Sequence[int] | None:
        """The same per data-parallel rank of the worker, in rank order (one entry for a worker
        of one rank); None as above."""
        ...


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """What the proxy knows of one worker at decision time."""

    url: str
    healthy: bool = True
    # Our own count of requests dispatched to this worker and not yet finished.
    in_flight: int = 0
    # Engine state from the last scrape (``None`` = never scraped).
    running: int | None = None
    queued: int | None = None
    waiting_uncached_tokens: int | None = None
    token_usage: float | None = None
    cache_hit_rate: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    page_size: int = 1
    # True when the scrape is too old to trust: treat as saturated.
    stale: bool = False
    # Bumped when the worker restarts or flushes its cache (prefix index resets on change).
    generation: int = 0
    models: tuple[str, ...] = ()
    # The engine's own account of its cache, where it publishes KV events (else None).
    kv: KvView | None = None
    # Its event stream's state when the snapshot was taken (``kv_subscriber.route_state``:
    # live, resynced, connecting, unconfirmed, failed); None where it publishes none.
    kv_state: str | None = None
    # Its data-parallel ranks (SGLang --dp-size), each a scheduler with its own cache; 1 = one.
    dp_size: int = 1

    @property
    def occupancy(self) -> float | None:
        if self.running is None or not self.max_running_requests:
            return None
        return self.running / self.max_running_requests


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """The routing-relevant view of one request (built once by the pipeline)."""

    model: str
    # Chained block hashes of the canonical prompt, in order (see prefix_key.py).
    block_hashes: tuple[int, ...] = ()
    # Tokens per unit block of ``block_hashes``: exact for token ids; for text, the unit's bytes
    # over the learned bytes per token (the block's byte span itself never moves).
    block_tokens: int = 16
    # Estimated prompt length in tokens (exact for token ids).
    prompt_tokens: int = 0
    # UTF-8 bytes of the canonical prompt text (0 for token ids): what the token estimate learns from.
    prompt_bytes: int = 0
    # Sticky key from a session header, if any.
    session_key: str | None = None
    # Canonical prompt text, for policies that match characters (cache_aware baseline).
    prompt_text: str = ""
    # The prompt's token ids when it came as ids (empty for text and chat), for the same policies.
    prompt_ids: Sequence[int] = ()
    priority: int = 0
    # The answer is streamed, so its first token (prefill done) will be reported: a later
    # request can be held until then (``Decision.after``).
    stream: bool = False
    # The proxy already held this request once for a prefix being prefilled: route it now.
    held: bool = False
    # It names a LoRA adapter, extra_key or cache_salt (prefix_key.cache_scope): its hashes carry
    # the scope, but an engine's KV events, keyed here by tokens alone, cannot tell its blocks.
    cache_scoped: bool = False


# The branch of a decision no policy made: a request that must go to one worker (a Responses
# follow-up, to the worker holding its conversation). Routing telemetry and the diagnosis's
# reuse model leave these out: nothing was predicted, and the prompt they key is not the prompt.
PINNED = "pinned"


@dataclass(frozen=True, slots=True)
class Decision:
    worker: str
    branch: str
    matched_blocks: int = 0
    # The exact prefix match in tokens where the worker's own KV events gave it (else None: the
    # match is ``matched_blocks`` of the request's blocks).
    matched_tokens: int | None = None
    reason: str = ""
    # Branch "hold": nothing was sent. Hold the request until the prefill named by this key ends
    # (``Pipeline.prefilled``: an own request's first token, ``id`` of its RouteRequest, or a
    # peer's, the key of ``on_peer_decision``): the prefix they share is then cached on
    # ``worker``. Then select again with ``held=True``.
    after: Hashable | None = None
    # With ``after``: the most the hold is worth, in seconds — the policy's estimate of the wait
    # past which holding costs more than recomputing the held part of the prefix on ``worker``.
    # The pipeline waits at most ``min(routing.hold_max_s, hold_s, deadline)``; None = no
    # estimate (hold_max_s alone).
    hold_s: float | None = None


@dataclass(frozen=True, slots=True)
class Completion:
    """What the pipeline tells a policy when a request it routed has finished."""

    worker: str
    request: RouteRequest
    ok: bool
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # Observed upstream TTFT (dispatch → first token), seconds.
    ttft: float | None = None
    # Output tokens, and seconds from the first token to the last (the KV-wait term's decode length).
    completion_tokens: int | None = None
    decode_s: float | None = None


@dataclass(frozen=True, slots=True)
class FirstToken:
    """What the pipeline tells a policy when a streamed answer's first token arrives: the prompt
    is prefilled and cached on ``worker`` from now on, an answer's whole decode before completion."""

    worker: str
    request: RouteRequest
    # From the first chunk's meta_info (SGLang /generate); None where the dialect sends them last.
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


class NoWorkerAvailable(Exception):
    """No healthy worker can take the request."""


@runtime_checkable
class ExplainsModel(Protocol):
    """A policy that learns a cost model online and can show it (``ttft``): seconds per unit of
    each term, exported on /metrics so that what it learned on a fleet can be read."""

    def model_terms(self) -> Mapping[str, float]: ...


class Policy(Protocol):
    name: str

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        """Pick a worker among ``workers`` (healthy ones only); raise NoWorkerAvailable if none."""
        ...

    def on_first_token(self, first: FirstToken) -> None:
        """The prompt of a request it routed is now in its worker's cache (streamed answers only)."""
        ...

    def on_complete(self, completion: Completion) -> None:
        """Learn from a finished request (cache correction, rate estimates)."""
        ...

    def on_peer_decision(self, worker: str, request: RouteRequest, uncached: int, key: Hashable) -> None:
        """Another proxy replica routed ``request`` to ``worker`` (``routing.peers``), estimating
        ``uncached`` prompt tokens to prefill there; ``key`` names it in ``on_peer_prefilled``."""
        ...

    def on_peer_prefilled(self, worker: str, key: Hashable) -> None:
        """That peer's request has its first token: its prefill is no longer queued on ``worker``
        (also called when a hold for ``key`` timed out: nobody should wait for it again)."""
        ...

    def on_peer_load(self, peer: str, in_flight: Mapping[str, int]) -> None:
        """Peer replica ``peer`` has ``in_flight[worker]`` requests dispatched and unfinished on
        each worker, as of now (each notice replaces the last; empty: the peer is gone)."""
        ...

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        """Workers joined, left, restarted or flushed: drop state about the ones gone."""
        ...


class IgnoresFeedback:
    """No-op feedback hooks, for policies that learn nothing from answers or from peers."""

    def on_first_token(self, first: FirstToken) -> None:
        pass

    def on_complete(self, completion: Completion) -> None:
        pass

    def on_peer_decision(self, worker: str, request: RouteRequest, uncached: int, key: Hashable) -> None:
        pass

    def on_peer_prefilled(self, worker: str, key: Hashable) -> None:
        pass

    def on_peer_load(self, peer: str, in_flight: Mapping[str, int]) -> None:
        pass


def summed_in_flight(loads: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Several replicas' requests in flight per worker (``Policy.on_peer_load`` notices), added up."""
    totals: dict[str, int] = {}
    for load in loads:
        for worker, n in load.items():
            totals[worker] = totals.get(worker, 0) + n
    return totals


def healthy(workers: Sequence[WorkerSnapshot]) -> list[WorkerSnapshot]:
    """The workers a decision may name."""
    return [w for w in workers if w.healthy]


def past_mean(load: float, loads: Sequence[float], ratio: float, cap: float = math.inf) -> bool:
    """smg 1.13.0's spill gate: ``load`` exceeds the mean of ``loads`` by two standard deviations
    of a count at that mean (a Poisson count's swing), at least 4 (both at most ``cap``), and by
    ``ratio`` times the mean. Shared by ``cache_aware`` (``gate: mean``) and ``ttft``
    (``spill_over_mean``)."""
    mean = sum(loads) / len(loads)
    margin = min(cap, max(min(4.0, cap), 2.0 * math.sqrt(mean)))
    return load > mean + margin and load > ratio * mean
