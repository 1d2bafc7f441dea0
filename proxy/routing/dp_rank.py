"""Which data-parallel rank of a worker takes a request (``routing.dp_ranks``; pure).

A worker started with ``--dp-size N`` (SGLang's in-process DP, and DP attention for DeepSeek-style
models) is one URL in front of N schedulers, each with its own radix cache, and its own
controller spreads requests over them without looking at prefixes (round robin, or by load): a
shared prefix the proxy kept on that worker is recomputed on up to N ranks. SGLang takes the rank
from the request instead when it names one (``data_parallel_rank``, the spelling smg's dp-aware
mode sends and every SGLang release since accepts on ``/generate`` and the OpenAI endpoints; newer
ones also read ``routed_dp_rank``).

Rule: the request's affinity key is the hash of its prompt's leading ``KEY_TOKENS`` (its last full
block within them; the whole prompt when shorter), so requests sharing a system prompt share a key;
the ranks are ordered by rendezvous hashing of that key (each rank's score ``xxh3(key, seed=rank)``).
A key the proxy has not placed on this worker before goes to the least loaded rank (outstanding
requests: running + waiting from the worker's ``/v1/loads`` per rank, or the proxy's own in flight
if more), the hash's order among equals, and ``RankBook`` remembers where; its followers go there
first. The first rank in that order whose outstanding requests are within ``max(mean x REL, mean +
ABS)`` takes it (smg's spill rule, per rank; the least loaded rank is always within it). Placing
by the hash alone drew uneven ranks: on simulated engines (2 workers of 2 ranks, one simulated
H200, token ids, 4.5 req/s, seeds 51-53) TTFT p95 1.40x the worker-level policy without ranks
(geometric mean), placing by load 0.88x; over seeds 51-61, 0.91x (0.27-2.02x, 95% interval
0.59-1.41x), p50 0.67x, reuse 64-69% against 45-52%
(``python -m loadtests.gpu.fleet --sim 4 --sim-dp 2 --routers ttft/dp_ranks=true,ttft/dp_ranks=false``).
Without per-rank loads the hash places a key. A prompt too short for a full block has no key: the
least loaded rank, else rank 0. O(N) per request.

Where the worker publishes KV events (each rank its own stream, ``proxy/workers/kv_fleet.py``) and
the prompt is token ids, the ranks holding the longest part of it come first in that order (ties
keep the hash's order): a prefix that went elsewhere once, spilled or placed before the rank count
changed, is found where it is instead of recomputed where the hash says.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import xxhash

from proxy.routing.base import RouteRequest
from proxy.routing.prefix_key import blocks_within

KEY_TOKENS = 256
REL, ABS = 1.5, 4.0
FIELD = "data_parallel_rank"
# Fields a caller sets to choose the rank itself: left alone.
CALLER_FIELDS = ("data_parallel_rank", "routed_dp_rank")


def affinity_key(route: RouteRequest) -> int | None:
    hashes = route.block_hashes
    if not hashes:
        return None
    return hashes[max(1, blocks_within(KEY_TOKENS, route.block_tokens, len(hashes))) - 1]


def choose_rank(key: int | None, ranks: int, outstanding: Sequence[int] | None = None,
                matched: Sequence[int] | None = None, placed: int | None = None) -> int:
    """The rank (0 .. ranks-1) for a request with affinity ``key``; ``outstanding`` per rank if
    known; ``matched``: the prompt's leading tokens each rank holds, from its KV events, if known;
    ``placed``: the rank this key was placed on before (``RankBook``), None for a key not placed
    (it goes to the least loaded rank; without loads, the hash's first)."""
    loads = outstanding if outstanding is not None and len(outstanding) == ranks else None
    held = matched if matched is not None and len(matched) == ranks and any(matched) else None
    if key is None and held is None:
        return min(range(ranks), key=lambda r: loads[r]) if loads is not None else 0
    order = list(range(ranks))
    if key is not None:
        order.sort(key=lambda r: xxhash.xxh3_64_intdigest(key.to_bytes(8, "little"), seed=r), reverse=True)
        if held is None and placed is None and loads is not None:
            return min(order, key=lambda r: loads[r])  # a new head: least loaded, the hash's order among equals
        if placed is not None:
            order.remove(placed)
            order.insert(0, placed)
    if held is not None:
        order.sort(key=lambda r: held[r], reverse=True)  # stable: equal holdings keep the hash's order
    if loads is None:
        return order[0]
    mean = sum(loads) / ranks
    bound = max(mean * REL, mean + ABS)
    return next(r for r in order if loads[r] <= bound)  # the least loaded rank is <= mean


class RankBook:
    """Which rank each prompt head of each worker was placed on (bounded; least recently used goes)."""

    def __init__(self, capacity: int = 65_536) -> None:
        self.capacity = capacity
        self._book: OrderedDict[tuple[str, int], int] = OrderedDict()

    def get(self, worker: str, key: int | None, ranks: int) -> int | None:
        """The rank ``key`` was placed on, if below ``ranks`` (one placed before the worker's rank
        count changed is not placed now)."""
        if key is None:
            return None
        rank = self._book.get((worker, key))
        if rank is None or rank >= ranks:
            return None
        self._book.move_to_end((worker, key))
        return rank

    def place(self, worker: str, key: int | None, ranks: int, outstanding: Sequence[int] | None = None,
              matched: Sequence[int] | None = None) -> int:
        """``choose_rank`` for ``key`` on ``worker``, given where it was placed before; a key not
        placed yet is booked where it goes."""
        placed = self.get(worker, key, ranks)
        rank = choose_rank(key, ranks, outstanding, matched, placed)
        if placed is None:
            self.put(worker, key, rank)
        return rank

    def put(self, worker: str, key: int | None, rank: int) -> None:
        if key is None:
            return
        self._book[(worker, key)] = rank
        self._book.move_to_end((worker, key))
        while len(self._book) > self.capacity:
            self._book.popitem(last=False)
