"""One KV event subscriber and block table per worker (per data-parallel rank of a worker that
has several), following the worker set.

``KvFleet.sync(urls)`` starts the subscribers of each new worker (its endpoints from the
``kv_events`` templates, ``{host}`` = the worker URL's host; rank r's at the ports plus r) and
stops those of workers gone.
``view(url)`` is what routing reads (``proxy.routing.base.KvView``): the exact match of a token-id
prompt while that worker's stream is usable, else None, and routing falls back to its
approximate index (``/workers`` and ``radixgate_kv_events_state`` say which).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import zmq.asyncio

from proxy.clock import Clock
from proxy.config import KvEventsConfig
from proxy.routing.base import RouteRequest
from proxy.routing.kv_index import EngineBlocks, Match
from proxy.workers.kv_events import EventLimits, offset_endpoint
from proxy.workers.kv_subscriber import KvSubscriber, stop
from proxy.workers.kv_trust import AnyOf, StreamTrust

# kv_events.endpoint: follow each worker's own --kv-events-config (/get_server_info).
AUTO = "auto"
# Requests routed and not yet prefilled, remembered for their probe (the oldest forgotten first),
# each by its prompt's first tokens (more than any engine's page: kv_index.UNKNOWN_BLOCK_SIZE).
MAX_ROUTED = 4096
PROBE_TOKENS = 256


def endpoint_for(template: str, worker_url: str) -> str:
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    return template.replace("{host}", f"[{host}]" if ":" in host else host)


# From worst to best: a worker's state is that of its worst rank's stream.
_WORST_FIRST = ("failed", "connecting", "unconfirmed", "resynced", "live")


class WorkerKv:
    """One worker's tables as routing sees them, one per data-parallel rank (a single one unless
    the engine runs ``--dp-size`` > 1): made on first ask (a snapshot may be published before
    ``sync`` subscribes), answering None until every rank's stream is usable.

    A rank-less prompt's match on a worker of several ranks: with ``best_rank``
    (``routing.dp_ranks``: the request goes to the rank holding most of it,
    ``proxy/routing/dp_rank.py``) the longest rank's, else the shortest (its controller picks the
    rank, and a promise of a hit it may not get costs more than a recompute it may avoid)."""

    def __init__(self, best_rank: bool = False) -> None:
        self.subscribers: list[KvSubscriber] = []
        self.best_rank = best_rank

    def match(self, token_ids: Sequence[int]) -> Match | None:
        matches = self._matches(token_ids)
        if matches is None:
            return None
        if len(matches) == 1:
            return matches[0]
        pick = max if self.best_rank else min
        return pick(matches, key=lambda m: m.tokens)

    def rank_matches(self, token_ids: Sequence[int]) -> list[int] | None:
        """Leading tokens of the prompt each rank holds, in rank order (None: not every rank known)."""
        matches = self._matches(token_ids)
        return None if matches is None else [m.tokens for m in matches]

    @property
    def usable(self) -> bool:
        """Whether routing reads these tables: every rank's stream usable."""
        return bool(self.subscribers) and all(sub.usable for sub in self.subscribers)

    def _matches(self, token_ids: Sequence[int]) -> list[Match] | None:
        return [sub.table.match(token_ids) for sub in self.subscribers] if self.usable else None

    def route_state(self) -> str | None:
        states = {sub.route_state for sub in self.subscribers}
        return next((st for st in _WORST_FIRST if st in states), None)

    def status(self) -> dict[str, Any] | None:
        """For ``/workers``: where routing's picture of this worker's cache comes from."""
        subs = self.subscribers
        if not subs:
            return None
        first = subs[0]
        lags = [sub.stats.lag_s for sub in subs if sub.stats.lag_s is not None]
        doc: dict[str, Any] = {
            "state": self.route_state(), "source": "events" if self.usable else "approximate",
            "endpoint": first.endpoint, "confirmation": first.trust.status(),
            "blocks": sum(len(sub.table) for sub in subs), "block_size": first.table.block_size,
            **{name: sum(getattr(sub.stats, name) for sub in subs)
               for name in ("batches", "gaps", "resyncs", "restarts", "errors", "reconnects")},
            "lag_s": max(lags) if lags else None,
            "notes": [note for sub in subs for note in sub.stats.notes[-3:]]}
        if len(subs) > 1:
            doc["ranks"] = [{"rank": sub.rank, "state": sub.route_state, "endpoint": sub.endpoint,
                             "blocks": len(sub.table), "batches": sub.stats.batches, "gaps": sub.stats.gaps,
                             "lag_s": sub.stats.lag_s} for sub in subs]
        return doc


class KvFleet:
    def __init__(self, cfg: KvEventsConfig, clock: Clock, wall_clock: Callable[[], float] | None = None,
                 per_worker: Mapping[str, tuple[str, str]] | None = None,
                 reported: Callable[[str], str | None] | None = None,
                 ranks: Callable[[str], int | None] | None = None, best_rank: bool = False) -> None:
        """``per_worker``: url -> (endpoint, replay endpoint) for workers named with their own
        (``workers.static[].kv_events``); the others use the ``kv_events`` templates, or with
        ``kv_events.endpoint: auto`` what ``reported(url)`` gives: the worker's own
        ``--kv-events-config`` from its ``/get_server_info``. ``ranks(url)``: the worker's
        data-parallel ranks as scraped (``dp_size``; None or 1: one), each publishing at its
        offset (``kv_events.offset_endpoint``); ``best_rank``: see ``WorkerKv``."""
        self.cfg, self.clock, self.wall_clock = cfg, clock, wall_clock
        self.per_worker = {url: ends for url, ends in (per_worker or {}).items() if ends[0]}
        self.reported = reported
        self.ranks = ranks
        self.best_rank = best_rank
        self._views: dict[str, WorkerKv] = {}
        self._routed: OrderedDict[str, tuple[KvSubscriber, Sequence[int], bool]] = OrderedDict()  # rid -> probe, rank named
        self._tasks: dict[str, list[asyncio.Task[None]]] = {}  # one per rank
        self._ctx: zmq.asyncio.Context | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.endpoint or self.per_worker)

    def endpoints(self, url: str) -> tuple[str, str | None] | None:
        if url in self.per_worker:
            endpoint, replay = self.per_worker[url]
            return endpoint, replay or None
        if not self.cfg.endpoint:
            return None
        if self.cfg.endpoint == AUTO:
            return self._from_worker(url)
        return (endpoint_for(self.cfg.endpoint, url),
                endpoint_for(self.cfg.replay_endpoint, url) if self.cfg.replay_endpoint else None)

    def _from_worker(self, url: str) -> tuple[str, str | None] | None:
        """The worker's own ``--kv-events-config`` (it binds ``tcp://*:PORT``; we connect to its host)."""
        raw = self.reported(url) if self.reported is not None else None
        if not raw:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(doc, dict) or doc.get("publisher", "zmq") != "zmq":
            return None
        endpoint, replay = doc.get("endpoint"), doc.get("replay_endpoint")
        if not isinstance(endpoint, str) or not endpoint.startswith(("tcp://", "ipc://")):
            return None
        host = urlsplit(url).hostname or "127.0.0.1"

        def here(e: str) -> str:
            return e.replace("*", f"[{host}]" if ":" in host else host)
        return here(endpoint), here(replay) if isinstance(replay, str) and replay.startswith("tcp://") else None

    def rank_endpoints(self, url: str) -> list[tuple[str, str | None]] | None:
        """Each data-parallel rank's (endpoint, replay endpoint); None where there are none, or
        where some rank's cannot be told (its streams would show part of its cache as all of it)."""
        ends = self.endpoints(url)
        if ends is None:
            return None
        n = (self.ranks(url) if self.ranks is not None else None) or 1
        out: list[tuple[str, str | None]] = []
        for r in range(n):
            endpoint = offset_endpoint(ends[0], r)
            if endpoint is None:
                return None
            out.append((endpoint, offset_endpoint(ends[1], r) if ends[1] else None))
        return out

    def sync(self, urls: Iterable[str]) -> None:
        """Subscribe to new workers, unsubscribe from departed ones, and subscribe anew to one whose
        rank count changed (known from its first scrape on; call from the event loop)."""
        if not self.enabled:
            return
        wanted = set(urls)
        for url in list(self._tasks):
            ranks = self.rank_endpoints(url) if url in wanted else None
            view = self._views.get(url)
            if url not in wanted or (ranks is not None and (view is None or len(view.subscribers) != len(ranks))):
                self._views.pop(url, None)
                for task in self._tasks.pop(url):
                    task.cancel()
        for url in wanted - set(self._tasks):
            ranks = self.rank_endpoints(url)
            if ranks is None:
                continue
            if self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            tables = [EngineBlocks(self.cfg.max_blocks_per_worker) for _ in ranks]
            # one check of the stream per worker, over its ranks' tables together (kv_trust.AnyOf)
            trust = StreamTrust(grace_s=self.cfg.confirm_grace_s)
            view = self._views.setdefault(url, WorkerKv(self.best_rank))
            view.subscribers = [
                KvSubscriber(
                    url, endpoint, table, self.clock, replay_endpoint=replay, topic=self.cfg.topic,
                    limits=EventLimits(max_payload_bytes=self.cfg.max_payload_bytes),
                    replay_timeout_s=self.cfg.replay_timeout_s, context=self._ctx, wall_clock=self.wall_clock,
                    trust=trust, rank=r, trust_table=AnyOf(tables) if len(tables) > 1 else table)
                for r, ((endpoint, replay), table) in enumerate(zip(ranks, tables, strict=True))]
            loop = asyncio.get_running_loop()
            self._tasks[url] = [loop.create_task(sub.run(), name=f"kv-events {url} rank {sub.rank}")
                                for sub in view.subscribers]

    # -- RouteListener: the prompts each engine prefilled, as probes of its stream (kv_trust.py) --

    def routed(self, worker: str, route: RouteRequest, matched_blocks: int, rid: str,
               dp_rank: int | None = None) -> None:
        view = self._views.get(worker)
        if view is None or not view.subscribers or not route.prompt_ids or route.cache_scoped:
            return
        # the head is all a probe reads (its leading block): a bounded copy, not the whole prompt;
        # the named rank's subscriber takes it, to probe its own table; else any rank's (they
        # share the worker's check, over all their tables)
        rank = dp_rank if dp_rank is not None and 0 <= dp_rank < len(view.subscribers) else None
        self._routed[rid] = (view.subscribers[rank or 0], tuple(route.prompt_ids[:PROBE_TOKENS]), rank is not None)
        if len(self._routed) > MAX_ROUTED:  # answers that never stream never say "prefilled"
            self._routed.popitem(last=False)

    def prefilled(self, worker: str, rid: str) -> None:
        got = self._routed.pop(rid, None)
        if got is not None:
            sub, head, named = got
            sub.prefilled(head, named)

    def finished(self, worker: str, rid: str) -> None:
        # ended without a first token (not streamed, or failed): nothing to probe with
        self._routed.pop(rid, None)

    def view(self, url: str) -> WorkerKv | None:
        if self.endpoints(url) is None:
            return None
        return self._views.setdefault(url, WorkerKv(self.best_rank))

    def subscribers(self) -> list[KvSubscriber]:
        return [sub for v in self._views.values() for sub in v.subscribers]

    def status(self, url: str) -> dict[str, Any] | None:
        view = self._views.get(url)
        return view.status() if view is not None else None

    def state(self, url: str) -> str | None:
        """Its stream's state as routing sees it (``KvSubscriber.route_state``); None without one."""
        view = self._views.get(url)
        return view.route_state() if view is not None else None

    async def close(self) -> None:
        tasks = [task for per_rank in self._tasks.values() for task in per_rank]
        self._tasks.clear()
        self._views.clear()
        for task in tasks:
            await stop(task)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
