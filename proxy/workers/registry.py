"""The set of workers and everything known about each, published as immutable snapshots.

Membership comes from a ``WorkerSource`` (``watch()`` yields the full URL set first and on every
change; ``StaticSource`` here, DNS / Kubernetes in ``discovery*.py``). Health results, request
results and scrapes are reported in; after each report the registry republishes a tuple of frozen
``WorkerSnapshot``s. Routing reads them (plus our live in-flight counts) per request. With active
probes on, a worker is healthy only once a probe has passed: a new or slow-starting worker gets no
request before that (the app runs one probe round before serving, so a fleet that is up at start
is routed to at once).

Listeners: ``on_publish`` after every republish (admission limits follow scraped
``max_running_requests``); ``on_change`` when membership, health or a worker's generation changed
(policies drop state); ``on_join`` / ``on_leave`` per worker (scraper targets, connection pools,
metric label sets). A worker's generation bumps when the scraper sees a restart or cache flush, or
when it comes back after being down (its cache is presumably gone).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proxy.clock import Clock
from proxy.config import HealthConfig, ScrapeConfig
from proxy.routing.base import WorkerSnapshot
from proxy.workers.health import Change, HealthTracker
from proxy.workers.scrape import EngineState, generation_change

if TYPE_CHECKING:
    from proxy.workers.kv_fleet import KvFleet

log = logging.getLogger("radixgate.workers")


class WorkerSource(Protocol):
    def watch(self) -> AsyncIterator[frozenset[str]]:
        """Yield the full set of worker URLs now and after every change."""
        ...


def normalise_url(url: str) -> str:
    return url.rstrip("/")


class StaticSource:
    """A fixed list of workers (``workers.static`` plus ``--worker`` flags)."""

    def __init__(self, urls: Iterable[str]) -> None:
        self.urls = frozenset(normalise_url(u) for u in urls)

    async def watch(self) -> AsyncIterator[frozenset[str]]:
        yield self.urls


@dataclass(slots=True)
class _Worker:
    url: str
    tracker: HealthTracker
    joined_at: float
    static_model: str = ""
    engine: EngineState | None = None
    scraped_at: float | None = None
    generation: int = 0
    models: tuple[str, ...] = ()
    probed_ok: bool = False  # a probe has passed since the worker joined


class WorkerRegistry:
    def __init__(self, *, health: HealthConfig, scrape: ScrapeConfig, clock: Clock,
                 static_models: Mapping[str, str] | None = None, kv: KvFleet | None = None) -> None:
        self._health_cfg = health
        self._scrape_cfg = scrape
        self._clock = clock
        self._static_models = {normalise_url(u): m for u, m in (static_models or {}).items()}
        # The workers' KV event streams, where configured: each snapshot carries its worker's view.
        self._kv = kv
        self._workers: dict[str, _Worker] = {}
        self._published: tuple[WorkerSnapshot, ...] = ()
        # (index, in-flight) → snapshot: per-request copies are reused until the next publish.
        self._variants: dict[tuple[int, int], WorkerSnapshot] = {}
        self.in_flight: Callable[[str], int] = lambda url: 0
        self.on_publish: list[Callable[[Sequence[WorkerSnapshot]], None]] = []
        self.on_change: list[Callable[[Sequence[WorkerSnapshot]], None]] = []
        self.on_join: list[Callable[[str], None]] = []
        self.on_leave: list[Callable[[str], None]] = []
        self.on_health: list[Callable[[str, Change], None]] = []
        self.on_generation: list[Callable[[str, str], None]] = []

    # -- membership ------------------------------------------------------------------------------
    async def follow(self, source: WorkerSource) -> None:
        async for urls in source.watch():
            self.set_members(urls)

    def set_members(self, urls: Iterable[str]) -> None:
        wanted = {normalise_url(u) for u in urls}
        gone = [u for u in self._workers if u not in wanted]
        new = [u for u in sorted(wanted) if u not in self._workers]
        now = self._clock.now()
        for url in gone:
            del self._workers[url]
        for url in new:
            self._workers[url] = _Worker(url, HealthTracker(self._health_cfg), now,
                                         self._static_models.get(url, ""))
        for url in gone:
            for cb in self.on_leave:
                cb(url)
        for url in new:
            for cb in self.on_join:
                cb(url)
        if gone or new:
            log.info("workers: +%s -%s", new, gone)
            self._publish(changed=True)

    def pin_model(self, url: str, model: str) -> None:
        """The model a worker that joins at ``url`` serves ("" = learned from its /v1/models)."""
        url = normalise_url(url)
        if model:
            self._static_models[url] = model
        else:
            self._static_models.pop(url, None)

    def urls(self) -> list[str]:
        return list(self._workers)

    def __contains__(self, url: str) -> bool:
        return url in self._workers

    # -- reports ---------------------------------------------------------------------------------
    def report_probe(self, url: str, ok: bool) -> None:
        w = self._workers.get(url)
        if w is None:
            return
        change = w.tracker.on_probe(ok, self._clock.now())
        if change is Change.UP:
            self._bump(w, "recovered")  # it was down: assume its cache did not survive
        if ok and not w.probed_ok:
            w.probed_ok = True  # its first passing probe: it may take requests from now on
            if change is None:
                log.info("worker %s: first probe passed", url)
                self._publish(changed=True)
                return
        self._after(w, change)

    def report_request(self, url: str, ok: bool) -> Change | None:
        w = self._workers.get(url)
        if w is None:
            return None
        change = w.tracker.on_request(ok, self._clock.now(), may_eject=ok or self._ejection_room())
        self._after(w, change)
        return change

    def _ejection_room(self) -> bool:
        """Whether one more passive ejection stays within ``health.max_ejected_fraction`` (at least one)."""
        ejected = sum(1 for w in self._workers.values() if w.tracker.ejected)
        return ejected < max(1, int(len(self._workers) * self._health_cfg.max_ejected_fraction))

    def report_scrape(self, url: str, state: EngineState | None, models: tuple[str, ...] | None) -> None:
        w = self._workers.get(url)
        if w is None:
            return
        changed = False
        if state is not None:
            reason = generation_change(w.engine, state)
            if reason is not None:
                self._bump(w, reason)
                changed = True
            w.engine = state
            w.scraped_at = self._clock.now()
            found = models or ((state.model,) if state.model else ())
            if found and found != w.models:
                w.models = found
                changed = True
        self._publish(changed=changed)

    def flushed(self, urls: Iterable[str]) -> None:
        """These workers' caches were emptied through us (``/flush_cache``): a new generation each,
        so what routing believes they hold is forgotten now, not when a scrape shows it (a worker
        without ``--enable-metrics`` never does; on the GPU fleet a proxy kept routing, and
        estimating reuse, on the prefixes of caches flushed between phases). One publish for all,
        so the diagnosis's snapshots see the fleet flushed at once (``cache_replay.cache_resets``)."""
        bumped = [w for url in urls if (w := self._workers.get(url)) is not None]
        for w in bumped:
            self._bump(w, "flush")
        if bumped:
            self._publish(changed=True)

    def _bump(self, w: _Worker, reason: str) -> None:
        w.generation += 1
        log.info("worker %s: %s (generation %d)", w.url, reason, w.generation)
        for cb in self.on_generation:
            cb(w.url, reason)

    def _after(self, w: _Worker, change: Change | None) -> None:
        if change is None:
            return
        log.warning("worker %s: %s", w.url, change.value)
        for cb in self.on_health:
            cb(w.url, change)
        self._publish(changed=True)

    # -- snapshots -------------------------------------------------------------------------------
    def _publish(self, *, changed: bool) -> None:
        now = self._clock.now()
        scraping = self._scrape_cfg.interval_s > 0
        stale_after = self._scrape_cfg.stale_after_s
        snaps = []
        for w in self._workers.values():
            e = w.engine or EngineState()
            seen = w.scraped_at if w.scraped_at is not None else w.joined_at
            snaps.append(WorkerSnapshot(
                url=w.url,
                healthy=self._routable(w, now),
                running=e.running, queued=e.queued, waiting_uncached_tokens=e.waiting_uncached_tokens,
                token_usage=e.token_usage, cache_hit_rate=e.cache_hit_rate,
                max_running_requests=e.max_running_requests, max_total_tokens=e.max_total_tokens,
                page_size=e.page_size or 1,
                stale=scraping and now - seen > stale_after,
                generation=w.generation,
                models=(w.static_model,) if w.static_model else w.models,
                kv=self._kv.view(w.url) if self._kv is not None else None,
                kv_state=self._kv.state(w.url) if self._kv is not None else None,
                dp_size=e.dp_size or 1,
            ))
        self._published = tuple(snaps)
        self._variants = {}
        for cb in self.on_publish:
            cb(self._published)
        if changed:
            for cb in self.on_change:
                cb(self._published)

    def _routable(self, w: _Worker, now: float) -> bool:
        return w.tracker.available(now) and (w.probed_ok or not w.tracker.probes_on)

    def refresh(self) -> None:
        """Re-evaluate time-dependent state (staleness, ejection cooldown) and republish."""
        now = self._clock.now()
        self._publish(changed=any(s.healthy != self._routable(self._workers[s.url], now)
                                  for s in self._published if s.url in self._workers))

    def snapshots(self) -> list[WorkerSnapshot]:
        """The published snapshots with live in-flight counts (one call per routing decision)."""
        if self._health_cfg.interval_s <= 0 and any(w.tracker.ejected for w in self._workers.values()):
            self.refresh()  # probes off: only time re-admits, and ejections are rare
        in_flight, variants = self.in_flight, self._variants
        out = []
        for i, s in enumerate(self._published):
            n = in_flight(s.url)
            if n != s.in_flight:
                v = variants.get((i, n))
                if v is None:
                    v = variants[(i, n)] = dataclasses.replace(s, in_flight=n)
                s = v
            out.append(s)
        return out

    def published(self) -> tuple[WorkerSnapshot, ...]:
        return self._published

    def ejected(self, url: str) -> bool:
        w = self._workers.get(url)
        return bool(w and w.tracker.ejected)

    def snapshot_age(self, url: str) -> float | None:
        w = self._workers.get(url)
        if w is None or w.scraped_at is None:
            return None
        return self._clock.now() - w.scraped_at

    def engine(self, url: str) -> EngineState | None:
        """What the last scrapes of ``url`` reported (None: unknown worker or nothing yet)."""
        w = self._workers.get(url)
        return w.engine if w is not None else None

    def describe(self) -> list[dict[str, Any]]:
        """``/workers``: each worker's health, scraped engine state and in-flight count."""
        out = []
        for s in self.snapshots():
            w = self._workers[s.url]
            out.append({
                "url": s.url,
                "healthy": s.healthy,
                "probe_up": w.tracker.up,
                "ejected": w.tracker.ejected,
                "in_flight": s.in_flight,
                "stale": s.stale,
                "generation": s.generation,
                "models": list(s.models),
                "snapshot_age_s": self.snapshot_age(s.url),
                "occupancy": s.occupancy,
                "engine": dataclasses.asdict(w.engine) if w.engine else None,
                "kv_events": self._kv.status(s.url) if self._kv is not None else None,
            })
        return out
