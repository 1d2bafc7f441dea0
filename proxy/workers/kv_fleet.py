"""One KV event subscriber and block table per worker, following the worker set.

``KvFleet.sync(urls)`` starts a subscriber for each new worker (its endpoints from the
``kv_events`` templates, ``{host}`` = the worker URL's host) and stops those of workers gone.
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
from proxy.workers.kv_events import EventLimits
from proxy.workers.kv_subscriber import KvSubscriber, stop
from proxy.workers.kv_trust import StreamTrust

# kv_events.endpoint: follow each worker's own --kv-events-config (/get_server_info).
AUTO = "auto"
# Requests routed and not yet prefilled, remembered for their probe (the oldest forgotten first),
# each by its prompt's first tokens (more than any engine's page: kv_index.UNKNOWN_BLOCK_SIZE).
MAX_ROUTED = 4096
PROBE_TOKENS = 256


def endpoint_for(template: str, worker_url: str) -> str:
    host = urlsplit(worker_url).hostname or "127.0.0.1"
    return template.replace("{host}", f"[{host}]" if ":" in host else host)


class WorkerKv:
    """One worker's table as routing sees it: made on first ask (a snapshot may be published
    before ``sync`` subscribes), answering None until its stream is usable."""

    def __init__(self) -> None:
        self.subscriber: KvSubscriber | None = None

    def match(self, token_ids: Sequence[int]) -> Match | None:
        sub = self.subscriber
        if sub is None or not sub.usable:
            return None
        return sub.table.match(token_ids)

    def status(self) -> dict[str, Any] | None:
        """For ``/workers``: where routing's picture of this worker's cache comes from."""
        sub = self.subscriber
        if sub is None:
            return None
        s = sub.stats
        return {"state": sub.route_state, "source": "events" if sub.usable else "approximate", "endpoint": sub.endpoint,
                "confirmation": sub.trust.status(),
                "blocks": len(sub.table), "block_size": sub.table.block_size, "batches": s.batches,
                "gaps": s.gaps, "resyncs": s.resyncs, "restarts": s.restarts, "errors": s.errors,
                "reconnects": s.reconnects, "lag_s": s.lag_s, "notes": s.notes[-3:]}


class KvFleet:
    def __init__(self, cfg: KvEventsConfig, clock: Clock, wall_clock: Callable[[], float] | None = None,
                 per_worker: Mapping[str, tuple[str, str]] | None = None,
                 reported: Callable[[str], str | None] | None = None) -> None:
        """``per_worker``: url -> (endpoint, replay endpoint) for workers named with their own
        (``workers.static[].kv_events``); the others use the ``kv_events`` templates, or with
        ``kv_events.endpoint: auto`` what ``reported(url)`` gives: the worker's own
        ``--kv-events-config`` from its ``/get_server_info``."""
        self.cfg, self.clock, self.wall_clock = cfg, clock, wall_clock
        self.per_worker = {url: ends for url, ends in (per_worker or {}).items() if ends[0]}
        self.reported = reported
        self._views: dict[str, WorkerKv] = {}
        self._routed: OrderedDict[str, tuple[KvSubscriber, Sequence[int]]] = OrderedDict()  # rid -> probe
        self._tasks: dict[str, asyncio.Task[None]] = {}
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

    def sync(self, urls: Iterable[str]) -> None:
        """Subscribe to new workers, unsubscribe from departed ones (call from the event loop)."""
        if not self.enabled:
            return
        wanted = set(urls)
        for url in [u for u in self._tasks if u not in wanted]:
            self._views.pop(url, None)
            self._tasks.pop(url).cancel()
        for url in wanted - set(self._tasks):
            ends = self.endpoints(url)
            if ends is None:
                continue
            if self._ctx is None:
                self._ctx = zmq.asyncio.Context()
            sub = KvSubscriber(
                url, ends[0], EngineBlocks(self.cfg.max_blocks_per_worker), self.clock, replay_endpoint=ends[1],
                topic=self.cfg.topic, limits=EventLimits(max_payload_bytes=self.cfg.max_payload_bytes),
                replay_timeout_s=self.cfg.replay_timeout_s, context=self._ctx, wall_clock=self.wall_clock,
                trust=StreamTrust(grace_s=self.cfg.confirm_grace_s))
            self._views.setdefault(url, WorkerKv()).subscriber = sub
            self._tasks[url] = asyncio.get_running_loop().create_task(sub.run(), name=f"kv-events {url}")

    # -- RouteListener: the prompts each engine prefilled, as probes of its stream (kv_trust.py) --

    def routed(self, worker: str, route: RouteRequest, matched_blocks: int, rid: str) -> None:
        view = self._views.get(worker)
        if view is None or view.subscriber is None or not route.prompt_ids or route.cache_scoped:
            return
        # the head is all a probe reads (its leading block): a bounded copy, not the whole prompt
        self._routed[rid] = (view.subscriber, tuple(route.prompt_ids[:PROBE_TOKENS]))
        if len(self._routed) > MAX_ROUTED:  # answers that never stream never say "prefilled"
            self._routed.popitem(last=False)

    def prefilled(self, worker: str, rid: str) -> None:
        got = self._routed.pop(rid, None)
        if got is not None:
            got[0].prefilled(got[1])

    def finished(self, worker: str, rid: str) -> None:
        # ended without a first token (not streamed, or failed): nothing to probe with
        self._routed.pop(rid, None)

    def view(self, url: str) -> WorkerKv | None:
        if self.endpoints(url) is None:
            return None
        return self._views.setdefault(url, WorkerKv())

    def subscribers(self) -> list[KvSubscriber]:
        return [v.subscriber for v in self._views.values() if v.subscriber is not None]

    def status(self, url: str) -> dict[str, Any] | None:
        view = self._views.get(url)
        return view.status() if view is not None else None

    def state(self, url: str) -> str | None:
        """Its stream's state as routing sees it (``KvSubscriber.route_state``); None without one."""
        view = self._views.get(url)
        sub = view.subscriber if view is not None else None
        return sub.route_state if sub is not None else None

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._views.clear()
        for task in tasks:
            await stop(task)
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
