"""Per-worker inputs of the ``ttft`` policy (``ttft_cost.py``), pure bookkeeping: the ``Estimate``
record, the saturation test, and the prefill a worker's scraped state cannot show yet (our requests
in flight there, and the ones our peers told us of)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import NamedTuple, TypeVar

from proxy.routing.base import RouteRequest, WorkerSnapshot, summed_in_flight
from proxy.routing.prefix_key import prefix_tokens
from proxy.routing.ttft_model import Features
from proxy.routing.ttft_params import TtftParams

_V = TypeVar("_V")
# Peers' streamed requests still prefilling, remembered per worker: each keeps its block hashes
# (~5 KB for a 32k-token prompt), and one whose first-token notice is lost (a peer gone) stays
# until this bound pushes it out (or a hold on it times out).
PEER_PENDING_PER_WORKER = 1024
# With ``own_exact``, a peer's streamed request told of is ahead on its worker until the peer
# reports its first token; one never reported (it failed first, or the peer is gone) is dropped
# after this many scrapes (20 s at 0.5 s: past the GPU fleet's TTFT p99 beyond its knee, ~15 s).
PEER_WORK_SCRAPES = 40


class Estimate(NamedTuple):
    """One worker's TTFT estimate for one request (exposed for tests and explanations)."""

    url: str
    ttft_s: float
    score: float
    matched_blocks: int
    features: Features
    saturated: bool
    matched_tokens: int | None = None  # exact, from the worker's KV events
    # The approximate index's own match (what its bookkeeping refers to); = matched_blocks
    # unless the worker's events gave another.
    index_blocks: int | None = None

    @property
    def uncached(self) -> int:
        return int(self.features.uncached)

    @property
    def pending(self) -> int:
        return int(self.features.unseen + self.features.queued)


class InFlight(NamedTuple):
    request: RouteRequest
    features: Features
    # Last touches of the confirmed blocks it matched, before this request touched them.
    touches: tuple[int, ...]
    # The worker's scrape signature when we sent it (unseen by the engine while it is current).
    signature: tuple[object, ...]
    # Its first token came back: its prompt is prefilled, and the model has learned from it.
    prefilled: bool = False


def signature(worker: WorkerSnapshot) -> tuple[object, ...]:
    """The scraped part of a snapshot: a change means a new scrape reached us."""
    return (worker.running, worker.queued, worker.waiting_uncached_tokens, worker.token_usage, worker.cache_hit_rate)


def saturated(worker: WorkerSnapshot, p: TtftParams) -> bool:
    """Stale, KV usage at the limit, our own in-flight cap reached, or every running slot taken
    with a queue behind it."""
    if worker.stale:
        return True
    if worker.token_usage is not None and worker.token_usage >= p.token_usage_limit:
        return True
    if p.max_in_flight and worker.in_flight >= p.max_in_flight:
        return True
    return bool(
        worker.max_running_requests
        and worker.running is not None
        and worker.running >= worker.max_running_requests
        and (worker.queued or 0) > 0
    )


class PendingWork:
    """Our requests in flight per worker (in dispatch order) and our peers' reported work."""

    def __init__(self, max_tracked_per_worker: int, own_exact: bool = True, count_blocks: bool = False) -> None:
        self._max_tracked = max_tracked_per_worker
        # Keep the distinct blocks in flight per worker (``distinct_in_flight``): ~35 us to add and
        # drop a 32k-token request (128 blocks, this sandbox), paid only where ``kv_wait_counts``
        # is "blocks" (1 us without).
        self._count_blocks = count_blocks
        # True: a scrape's queue stands only for others' requests (``ahead``); ours are counted
        # from our own books, which know the moment each gets its first token.
        self._own_exact = own_exact
        # url -> (scrape signature, the other senders' queue, queued tokens and batch in it): the
        # latest scrape less ours it could count, taken when it first reached a decision.
        self._foreign: dict[str, tuple[tuple[object, ...], int, int, int]] = {}
        # url -> (the latest scrape signature a decision read, how many it has read): the clock
        # a peer's request without a notice expires by (``_peer_books``).
        self._scrapes: dict[str, tuple[tuple[object, ...], int]] = {}
        # The mean uncached size of our requests: a scraped queue length times this, where the
        # engine reports no queued tokens.
        self.mean_uncached = 1024.0
        # url -> {id(request): InFlight}, in dispatch order.
        self.in_flight: dict[str, dict[int, InFlight]] = {}
        # url -> {peer's key: (when first counted: the scrape signature, or with own_exact the
        # scrape number; None before; uncached tokens)}
        self.peer_work: dict[str, dict[Hashable, tuple[tuple[object, ...] | int | None, int]]] = {}
        # url -> {peer's key: its streamed request, until the peer reports its first token}
        self.peer_pending: dict[str, dict[Hashable, RouteRequest]] = {}
        # peer -> {url: its requests in flight there}, as it last said; and their sum per url
        self.peer_load: dict[str, dict[str, int]] = {}
        self._peer_in_flight: dict[str, int] = {}
        # url -> prompt tokens of our requests in flight there (the KV-wait term's books).
        self._prompts: dict[str, int] = {}
        # The same counted as an engine that shares a prefix stores it (``kv_wait_counts: blocks``):
        # url -> {block hash: [our requests in flight holding it, its tokens]}, and the distinct
        # tokens they and the requests' tails past their last full block come to.
        self._blocks: dict[str, dict[int, list[int]]] = {}
        self._distinct: dict[str, int] = {}

    def pending_prefill(self, worker: WorkerSnapshot) -> tuple[int, int]:
        """(unseen, queued): our tokens sent since the last scrape (and our peers'), and that
        scrape's queue."""
        unseen, queued, _ = self.ahead(worker)
        return unseen, queued

    def ahead(self, worker: WorkerSnapshot) -> tuple[int, int, int]:
        """What waits on ``worker`` ahead of a new request, in one walk: (unseen, queued) as
        ``pending_prefill``, and the requests still without a first token: ours (and our peers'
        streamed ones) before any scrape; once scraped, the others' part of its queue and ours
        (``_ahead_own_exact``), or without ``own_exact`` its queue plus ours sent since."""
        own = self.in_flight.get(worker.url, {})
        scraped = worker.running is not None or worker.queued is not None or worker.waiting_uncached_tokens is not None
        current = signature(worker)
        if scraped and self._own_exact:
            return self._ahead_own_exact(worker, own, current)
        # one bookkeeping of the peers' work per reading: the stamps in ``peer_work`` are of one kind
        peers = self._peer_books(worker.url, current)[1] if self._own_exact else self._peer_unseen(worker.url, current)
        if not scraped:
            mine = [e for e in own.values() if not e.prefilled]
            waiting = len(mine) + len(self.peer_pending.get(worker.url, {}))
            return sum(int(e.features.uncached) for e in mine) + peers, 0, waiting
        unseen, waiting = peers, worker.queued or 0
        for entry in reversed(own.values()):  # newest first; stop at the first the engine saw
            if entry.signature != current:
                break
            if not entry.prefilled:
                unseen += int(entry.features.uncached)
                waiting += 1
        if worker.waiting_uncached_tokens is not None:
            queued = worker.waiting_uncached_tokens
        else:
            queued = int((worker.queued or 0) * self.mean_uncached)
        return unseen, queued, waiting

    def _ahead_own_exact(self, worker: WorkerSnapshot, own: Mapping[int, InFlight],
                         current: tuple[object, ...]) -> tuple[int, int, int]:
        """``ahead`` with our requests, and our peers' they told us of, from our books and only
        the other senders' from the scrape (``_others``): a scrape is up to an interval old, and
        its queue still counts ours that have had their first token since (at 10 req/s and 0.5-s
        scrapes, several a worker). Ours and theirs without a first token are unseen prefill, as
        before any scrape, so with no other sender the inputs are those of a proxy that scrapes
        nothing."""
        mine = [e for e in own.values() if not e.prefilled]
        peers, peer_tokens = self._peer_books(worker.url, current)
        others, others_tokens, _ = self._others(worker, own, current, peers, peer_tokens)
        unseen = sum(int(e.features.uncached) for e in mine) + peer_tokens
        return unseen, others_tokens, others + len(mine) + peers

    def _peer_books(self, url: str, current: tuple[object, ...]) -> tuple[int, int]:
        """Our peers' requests on ``url`` still without a first token, as they told us (count,
        uncached tokens). A peer reports the first token of a streamed request only: another one
        counts until a scrape newer than the one it was first counted under (which then counts
        it, as without ``own_exact``); a streamed one whose notice never comes is dropped
        ``PEER_WORK_SCRAPES`` scrapes after."""
        table = self.peer_work.get(url)
        if not table:
            return 0, 0
        now = self._scrape_no(url, current)
        streamed = self.peer_pending.get(url, {})
        # stamps are scrape numbers here (``_peer_unseen``'s signatures are written only without
        # own_exact); the isinstance test narrows the type
        count = tokens = 0
        for key, (stamp, uncached) in list(table.items()):
            if stamp is None:
                table[key] = (now, uncached)
            elif not isinstance(stamp, int) or now - stamp > (PEER_WORK_SCRAPES if key in streamed else 0):
                del table[key]
                continue
            count, tokens = count + 1, tokens + uncached
        return count, tokens

    def _scrape_no(self, url: str, current: tuple[object, ...]) -> int:
        """How many scrapes of ``url`` have reached a decision (a new signature counts one)."""
        sig, n = self._scrapes.get(url, (None, 0))
        if sig != current:
            n += 1
            self._scrapes[url] = (current, n)
        return n

    def _others(self, worker: WorkerSnapshot, own: Mapping[int, InFlight], current: tuple[object, ...],
                peers: int, peer_tokens: int) -> tuple[int, int, int]:
        """Other senders' (queue, queued tokens, running) on ``worker`` in its latest scrape: the
        scrape less ours and our peers' (``peers`` requests of ``peer_tokens`` now in
        ``_peer_books``) it could count, taken once per scrape, when it first reaches a decision.
        Ours sent before it without a first token were queued or prefilling then; with one, in
        the batch. Errs low on the queue by ours the engine had taken into a prefill, high by ours
        whose first token came between the scrape and the decision that first reads it."""
        seen = self._foreign.get(worker.url)
        if seen is not None and seen[0] == current:
            return seen[1], seen[2], seen[3]
        waiting = prefilled = waiting_tokens = 0
        for entry in own.values():
            if entry.signature == current:
                continue
            if entry.prefilled:
                prefilled += 1
            else:
                waiting, waiting_tokens = waiting + 1, waiting_tokens + int(entry.features.uncached)
        peers_in = max(peers, self._peer_in_flight.get(worker.url, 0))  # theirs then, all told
        queue, running = worker.queued or 0, worker.running or 0
        tokens = (worker.waiting_uncached_tokens if worker.waiting_uncached_tokens is not None
                  else int(queue * self.mean_uncached))
        others = max(0, queue - waiting - peers)
        waiting_tokens += peer_tokens
        others_running = max(0, running + queue - waiting - prefilled - peers_in - others)
        self._foreign[worker.url] = (current, others, max(0, tokens - waiting_tokens), others_running)
        return others, max(0, tokens - waiting_tokens), others_running

    def _peer_unseen(self, url: str, current: tuple[object, ...]) -> int:
        """Peers' prefill sent to ``url`` that the engine has not reported: entries first seen
        under an older scrape are dropped (that scrape's queue counts them now)."""
        table = self.peer_work.get(url)
        if not table:
            return 0
        total = 0
        for key, (sig, uncached) in list(table.items()):
            if sig is None:
                table[key] = (current, uncached)
            elif sig != current:
                del table[key]
                continue
            total += uncached
        return total

    def running(self, worker: WorkerSnapshot) -> int:
        """Its decode batch: scraped, else the requests ours and our peers' have in flight there."""
        own = self.in_flight.get(worker.url, {})
        if worker.running is not None:
            if not self._own_exact:
                return worker.running
            # the other senders' batch, and every request of ours and our peers' in flight there
            current = signature(worker)
            peers, peer_tokens = self._peer_books(worker.url, current)
            others_running = self._others(worker, own, current, peers, peer_tokens)[2]
            return others_running + len(own) + max(peers, self._peer_in_flight.get(worker.url, 0))
        return len(own) + self._peer_in_flight.get(worker.url, 0)

    def outstanding(self, url: str) -> int:
        """Requests in flight on ``url``: ours, and what our peers last said they have there."""
        return len(self.in_flight.get(url, ())) + self._peer_in_flight.get(url, 0)

    def prompts_in_flight(self, url: str) -> tuple[int, int]:
        """(prompt tokens, requests) in flight on ``url``: ours, and our peers' requests there
        counted at the mean size of ours (of all our workers', where we have none there)."""
        return self._with_peers(url, self._prompts)

    def _with_peers(self, url: str, tokens_by_url: Mapping[str, int]) -> tuple[int, int]:
        """(tokens, requests) on ``url``: ours as ``tokens_by_url`` counts them, and our peers'
        requests there at our mean per request (over all our workers, where we have none there)."""
        mine = len(self.in_flight.get(url, ()))
        tokens = tokens_by_url.get(url, 0)
        peers = self._peer_in_flight.get(url, 0)
        if peers:
            if mine:
                tokens += round(peers * tokens / mine)
            else:
                count = sum(len(t) for t in self.in_flight.values())
                tokens += round(peers * sum(tokens_by_url.values()) / count) if count else 0
        return tokens, mine + peers

    def set_peer_load(self, peer: str, in_flight: Mapping[str, int]) -> None:
        """A peer's requests in flight per worker, now (replacing what it said before; empty = gone)."""
        if in_flight:
            self.peer_load[peer] = {url: n for url, n in in_flight.items() if n > 0}
        else:
            self.peer_load.pop(peer, None)
        self._peer_in_flight = summed_in_flight(self.peer_load.values())

    def add(self, url: str, entry: InFlight) -> None:
        key = id(entry.request)
        for other, table in self.in_flight.items():
            gone = table.pop(key, None)  # a retry of the same request routes it again
            if gone is not None:
                self._count(other, gone, -1)
        table = self.in_flight.setdefault(url, {})
        table[key] = entry
        self._count(url, entry, 1)
        if len(table) > self._max_tracked:
            self._count(url, table.pop(next(iter(table))), -1)

    def _count(self, url: str, entry: InFlight, sign: int) -> None:
        request = entry.request
        self._prompts[url] = self._prompts.get(url, 0) + sign * request.prompt_tokens
        if not self._count_blocks:
            return
        blocks = self._blocks.setdefault(url, {})
        distinct = self._distinct.get(url, 0) + sign * _tail(request)
        for h, tokens in zip(request.block_hashes, _block_sizes(request), strict=True):
            held = blocks.get(h)
            if sign > 0:
                if held is None:
                    blocks[h] = [1, tokens]
                    distinct += tokens
                else:
                    held[0] += 1
            elif held is not None:
                held[0] -= 1
                if held[0] <= 0:
                    del blocks[h]
                    distinct -= held[1]
        self._distinct[url] = distinct

    def distinct_in_flight(self, url: str) -> tuple[int, int]:
        """(tokens, requests) in flight on ``url`` as an engine that stores a shared prefix once
        holds them: the distinct blocks of our requests there plus their tails, and our peers'
        requests counted at our mean distinct share (``prompts_in_flight`` counts contexts whole)."""
        return self._with_peers(url, self._distinct)

    def new_tokens(self, url: str, request: RouteRequest) -> int:
        """``request``'s prompt tokens that no request of ours in flight on ``url`` holds already."""
        blocks = self._blocks.get(url, {})
        shared = sum(tokens for h, tokens in zip(request.block_hashes, _block_sizes(request), strict=True)
                     if h in blocks)
        return max(request.prompt_tokens - shared, 0)

    def get(self, url: str, request: RouteRequest) -> InFlight | None:
        entry = self.in_flight.get(url, {}).get(id(request))
        return entry if entry is not None and entry.request is request else None

    def mark_prefilled(self, url: str, entry: InFlight) -> None:
        self.in_flight[url][id(entry.request)] = entry._replace(prefilled=True)

    def pop(self, url: str, request: RouteRequest) -> InFlight | None:
        entry = self.in_flight.get(url, {}).pop(id(request), None)
        if entry is None:
            return None
        self._count(url, entry, -1)
        return entry if entry.request is request else None

    def prefilling(self, url: str, covers: Callable[[RouteRequest], bool]) -> Hashable | None:
        """The key of a streamed request sent to ``url`` still without its first token (ours,
        newest first, then a peer's) that ``covers`` accepts."""
        for entry in reversed(self.in_flight.get(url, {}).values()):
            if not entry.prefilled and covers(entry.request):
                return id(entry.request)
        for key, other in self.peer_pending.get(url, {}).items():
            if covers(other):
                return key
        return None

    def add_peer(self, url: str, key: Hashable, request: RouteRequest, uncached: int) -> None:
        """A peer's decision: its ``uncached`` tokens are prefill ahead of ours on ``url`` until the
        peer reports its first token or a newer scrape counts them; a streamed one may be held on."""
        if uncached > 0:
            _bounded_put(self.peer_work.setdefault(url, {}), key, (None, uncached), self._max_tracked)
        if request.stream:
            _bounded_put(self.peer_pending.setdefault(url, {}), key, request, PEER_PENDING_PER_WORKER)

    def peer_prefilled(self, url: str, key: Hashable) -> None:
        for table in (self.peer_work.get(url), self.peer_pending.get(url)):
            if table is not None:
                table.pop(key, None)

    def forget(self, present: Iterable[str]) -> None:
        """Drop the workers not in ``present``."""
        keep = set(present)
        for table in (self.in_flight, self.peer_work, self.peer_pending, self._prompts, self._foreign,
                      self._scrapes, self._blocks, self._distinct):
            for url in [u for u in table if u not in keep]:
                del table[url]
        for peer, load in list(self.peer_load.items()):
            self.set_peer_load(peer, {u: n for u, n in load.items() if u in keep})


def _bounded_put(table: dict[Hashable, _V], key: Hashable, value: _V, bound: int) -> None:
    """Insert, dropping the oldest entry past ``bound`` (a peer that never reports back)."""
    table[key] = value
    if len(table) > bound:
        del table[next(iter(table))]


def _block_sizes(request: RouteRequest) -> tuple[int, ...]:
    """Tokens in each block of ``request.block_hashes`` (they double in size along the prompt)."""
    return _sizes(request.block_tokens, len(request.block_hashes))


@functools.lru_cache(maxsize=256)
def _sizes(block_tokens: int, n: int) -> tuple[int, ...]:
    return tuple(prefix_tokens(i + 1, block_tokens) - prefix_tokens(i, block_tokens) for i in range(n))


def _tail(request: RouteRequest) -> int:
    """The prompt's tokens past its last full block (no block hash names them)."""
    return max(request.prompt_tokens - prefix_tokens(len(request.block_hashes), request.block_tokens), 0)
