"""consistent_hash: bounded-load consistent hashing on the prompt prefix (or a session key).

Rule:
  * Key: ``RouteRequest.session_key`` when the caller sent one; else the chained hash of the
    first ``key_blocks`` prefix blocks (which names the whole leading ``key_blocks`` blocks), or
    of as many full blocks as the prompt has; a prompt shorter than one block is keyed by its
    text. Requests that share their first ``key_blocks`` blocks get the same key.
  * Ring: every known worker (healthy or not) gets ``virtual_nodes`` points at
    ``xxh3_64("<url>#<i>")``. The key's home is the first point clockwise from ``xxh3_64(key)``.
    The ring depends only on the worker URLs, so independent proxy replicas that see the same
    workers send the same key to the same worker without talking to each other, and adding or
    removing one of N workers moves only about 1/N of the keys.
  * Bounded load (Mirrokni et al., "Consistent Hashing with Bounded Loads", 2018): a worker may
    take the request only while its load (our in-flight requests plus its scraped queue) is
    below ``ceil(load_factor * (total load + 1) / healthy workers)``; otherwise the walk goes
    on clockwise. Unhealthy workers are skipped, so only their keys move. Stale snapshots count
    as full. If every worker is full, the least loaded wins.
  * Branches: ``home`` (the key's own worker), ``spill`` (walked past a full or unhealthy home),
    ``overloaded`` (all full), ``only`` (one healthy worker).

Complexity: O(log(workers x virtual_nodes)) for the lookup plus O(workers) for the load bound;
the ring is rebuilt (O(W V log(W V))) only when the worker set changes.

When to choose it: several proxy replicas without shared state, session stickiness, or many
distinct shared prefixes where load-blind affinity is acceptable. It knows nothing about what a
worker actually holds or how long its prefill queue is; ``ttft`` does.

Params (``ConsistentHashParams``): ``virtual_nodes`` = 150 (as SMG's ring), ``key_blocks`` = 16
(16 x 16-token blocks = SMG ``prefix_hash``'s 256 tokens), ``load_factor`` = 1.25.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from proxy.config import ConfigError
from proxy.routing.base import (
    Decision,
    IgnoresFeedback,
    NoWorkerAvailable,
    RouteRequest,
    WorkerSnapshot,
    healthy,
)
from proxy.routing.registry import PolicySpec


@dataclass(frozen=True)
class ConsistentHashParams:
    virtual_nodes: int = 150
    key_blocks: int = 16
    load_factor: float = 1.25

    def validate(self) -> None:
        if self.virtual_nodes < 1:
            raise ConfigError("routing.params.virtual_nodes: must be >= 1")
        if self.key_blocks < 1:
            raise ConfigError("routing.params.key_blocks: must be >= 1")
        if self.load_factor < 1.0:
            raise ConfigError("routing.params.load_factor: must be >= 1.0")


def _h64(data: str) -> int:
    value: int = xxhash.xxh3_64_intdigest(data.encode("utf-8", "surrogatepass"))
    return value


def routing_key(request: RouteRequest, key_blocks: int) -> int:
    """The ring key of a request (see the module docstring)."""
    if request.session_key:
        return _h64("session\x00" + request.session_key)
    if request.block_hashes:
        return request.block_hashes[min(key_blocks, len(request.block_hashes)) - 1]
    return _h64(f"text\x00{request.model}\x00{request.prompt_text}")


class HashRing:
    """Virtual-node ring over a fixed set of worker URLs."""

    def __init__(self, urls: Sequence[str], virtual_nodes: int) -> None:
        points = sorted((_h64(f"{url}#{i}"), url) for url in set(urls) for i in range(virtual_nodes))
        self._points = [p for p, _ in points]
        self._owners = [u for _, u in points]
        self.urls = frozenset(urls)

    @staticmethod
    def position(key: int) -> int:
        """Where a key lands: re-hashed, so keys that are not uniform (small ints) spread too."""
        value: int = xxhash.xxh3_64_intdigest((key % (1 << 64)).to_bytes(8, "little"))
        return value

    def walk(self, key: int) -> list[str]:
        """Distinct workers in ring order, starting at the key's home."""
        if not self._points:
            return []
        start = bisect.bisect_left(self._points, self.position(key))
        seen: dict[str, None] = {}
        n = len(self._owners)
        for i in range(n):
            url = self._owners[(start + i) % n]
            if url not in seen:
                seen[url] = None
                if len(seen) == len(self.urls):
                    break
        return list(seen)

    def home(self, key: int) -> str:
        start = bisect.bisect_left(self._points, self.position(key))
        return self._owners[start % len(self._owners)]


def _load(worker: WorkerSnapshot) -> int:
    return worker.in_flight + (worker.queued or 0)


class ConsistentHash(IgnoresFeedback):
    name = "consistent_hash"

    def __init__(self, params: ConsistentHashParams) -> None:
        self.params = params
        self._ring = HashRing((), params.virtual_nodes)

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        if len(candidates) == 1:
            return Decision(candidates[0].url, "only")
        urls = frozenset(w.url for w in workers)
        if urls != self._ring.urls:
            self._ring = HashRing(sorted(urls), self.params.virtual_nodes)
        by_url = {w.url: w for w in candidates}
        total = sum(_load(w) for w in candidates)
        bound = math.ceil(self.params.load_factor * (total + 1) / len(candidates))
        key = routing_key(request, self.params.key_blocks)
        order = self._ring.walk(key)
        for position, url in enumerate(order):
            worker = by_url.get(url)
            if worker is None or worker.stale or _load(worker) >= bound:
                continue
            return Decision(url, "home" if position == 0 else "spill", reason=f"load={_load(worker)} bound={bound}")
        least = min(candidates, key=lambda w: (w.stale, _load(w), order.index(w.url)))
        return Decision(least.url, "overloaded", reason=f"load={_load(least)} bound={bound}")

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        urls = frozenset(w.url for w in workers)
        if urls != self._ring.urls:
            self._ring = HashRing(sorted(urls), self.params.virtual_nodes)


def _factory(params: ConsistentHashParams, rng: random.Random) -> ConsistentHash:
    return ConsistentHash(params)


SPEC = PolicySpec("consistent_hash", ConsistentHashParams, _factory)
