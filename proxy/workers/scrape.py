"""Engine state of each worker: pure parsers plus the loop that polls and publishes it.

Sources, best first (sglang-protocol.md §1.5, §2):
* ``GET /v1/loads`` — per-DP-rank JSON load snapshots (running, waiting, waiting uncached tokens,
  token usage, cache hit rate, max_running_requests);
* ``GET /metrics`` — Prometheus text with ``sglang:`` names (needs ``--enable-metrics``);
* ``GET /get_load`` — older releases: ``[{dp_rank, num_reqs, num_waiting_reqs, num_tokens}]``;
* ``GET /get_server_info`` — the static shape: max_running_requests, page size, KV pool size,
  startup time (read at first contact, after any failure, and every ``SERVER_INFO_EVERY`` polls).

Every engine metric name lives in ``ENGINE_METRICS`` (one table) with how series across DP/TP ranks
combine. ``generation_change`` is the pure rule for "the worker restarted or flushed its cache":
a new ``startup_time``, a cumulative counter that went backwards, or the evictable KV pool emptying
while nothing runs. A worker whose last good scrape is older than ``scrape.stale_after_s`` is
published ``stale`` — routing treats that as saturated, never idle. A worker that answers every
load endpoint with 404 / 405 / 501 (SGLang without ``--enable-metrics``, an engine that reports
only token counts) is not stale: it reports no load, and is published with its static shape alone
(engine gauges None) as a good scrape; the endpoints are tried again every ``SERVER_INFO_EVERY``
polls.

A worker's answers are not trusted: every number must be finite (``1e999``, ``+Inf``, ``NaN`` are
refused) and every count non-negative and below 2**53, a page size in [1, 2**20]; an answer that
breaks a rule — or is not JSON, or nests too deeply, or is over ``upstream.max_scrape_bytes`` —
is a failed scrape of that worker (``ValueError``): counted, logged at debug, and the worker's
snapshot goes stale. Nothing a worker sends can end the loop that scrapes the whole fleet: ``poll``
turns any other exception into the same failed scrape (logged as the bug it would be).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy import safejson

log = logging.getLogger("radixgate.scrape")

SERVER_INFO_EVERY = 10
# Answers meaning "this worker has no such endpoint" (not a failure of the worker).
NOT_SERVED = frozenset({404, 405, 501})


class NotServed(ValueError):
    """The worker does not serve this endpoint."""


# sglang metric name → (EngineState field, how series from several ranks combine).
ENGINE_METRICS: dict[str, tuple[str, str]] = {
    "sglang:num_running_reqs": ("running", "sum"),
    "sglang:num_queue_reqs": ("queued", "sum"),
    "sglang:num_used_tokens": ("used_tokens", "sum"),
    "sglang:token_usage": ("token_usage", "mean"),
    "sglang:cache_hit_rate": ("cache_hit_rate", "mean"),
    "sglang:max_total_num_tokens": ("max_total_tokens", "sum"),
    "sglang:page_size": ("page_size", "max"),
    "sglang:kv_evictable_tokens": ("evictable_tokens", "sum"),
    "sglang:max_running_requests": ("max_running_requests", "sum"),
    "sglang:prompt_tokens_total": ("prompt_tokens_total", "sum"),
}


@dataclass(frozen=True, slots=True)
class EngineState:
    """One scrape of one worker; ``None`` = the source did not report it."""

    running: int | None = None
    queued: int | None = None
    waiting_uncached_tokens: int | None = None
    used_tokens: int | None = None
    evictable_tokens: int | None = None
    token_usage: float | None = None
    cache_hit_rate: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    page_size: int | None = None
    startup_time: float | None = None
    prompt_tokens_total: float | None = None
    model: str | None = None
    # The worker's --kv-events-config (SGLang reports its server args in /get_server_info).
    kv_events_config: str | None = None
    # Its data-parallel ranks (--dp-size, from /get_server_info), and each rank's outstanding
    # requests (running + waiting, from /v1/loads), indexed by rank: routing.dp_ranks reads them.
    dp_size: int | None = None
    dp_outstanding: tuple[int, ...] | None = None

    def merged(self, other: EngineState) -> EngineState:
        """``self`` with every field ``other`` reports (not None) taken from ``other``."""
        changes = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)
                   if getattr(other, f.name) is not None}
        return dataclasses.replace(self, **changes)


_INT_FIELDS = frozenset({"running", "queued", "waiting_uncached_tokens", "used_tokens", "evictable_tokens",
                         "max_running_requests", "max_total_tokens", "page_size"})


def _combine(values: list[float], how: str) -> float:
    if how == "sum":
        return sum(values)
    if how == "max":
        return max(values)
    return sum(values) / len(values)


MAX_COUNT = 2**53
MAX_PAGE_SIZE = 1 << 20
MAX_DP = 1024  # data-parallel ranks of one worker believed


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name}: {value!r} is not a finite number")
    return value


def _typed(field_name: str, value: float) -> int | float:
    _finite(field_name, value)
    if field_name not in _INT_FIELDS:
        return float(value)
    if not 0 <= value < MAX_COUNT:
        raise ValueError(f"{field_name}: {value!r} is not a count")
    if field_name == "page_size" and not 1 <= value <= MAX_PAGE_SIZE:
        raise ValueError(f"page_size: {value!r} is outside [1, {MAX_PAGE_SIZE}]")
    return int(value)


def parse_prometheus(text: str) -> EngineState:
    """Engine state from SGLang's Prometheus exposition (``sglang:`` names, any label sets)."""
    series: dict[str, list[float]] = {}
    page_from_info: list[float] = []
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in ENGINE_METRICS:
                    series.setdefault(sample.name, []).append(_finite(sample.name, float(sample.value)))
                elif sample.name == "sglang:cache_config_info" and "page_size" in sample.labels:
                    try:
                        page_from_info.append(float(sample.labels["page_size"]))
                    except ValueError:
                        pass
    except ValueError:
        raise
    except Exception as e:  # the exposition parser's other complaints about garbage (IndexError, ...)
        raise ValueError(f"/metrics: not Prometheus text ({type(e).__name__}: {str(e)[:100]})") from None
    fields: dict[str, Any] = {}
    for name, values in series.items():
        field_name, how = ENGINE_METRICS[name]
        fields[field_name] = _typed(field_name, _combine(values, how))
    if "page_size" not in fields and page_from_info:
        fields["page_size"] = _typed("page_size", max(page_from_info))
    return EngineState(**fields)


def _num(d: Mapping[str, Any], key: str) -> float | None:
    """``d[key]`` as a finite float; None when absent or not a number; ``ValueError`` when not finite."""
    v = d.get(key)
    if not isinstance(v, int | float) or isinstance(v, bool):
        return None
    try:
        return _finite(key, float(v))
    except OverflowError:  # an integer beyond float range
        raise ValueError(f"{key}: {v!r} is not a finite number") from None


def parse_loads(doc: Any) -> EngineState:
    """Engine state from ``/v1/loads`` JSON: ranks summed, ratios averaged."""
    loads = doc.get("loads") if isinstance(doc, Mapping) else None
    if not isinstance(loads, list) or not loads:
        raise ValueError("/v1/loads: no 'loads' list")
    ranks = [r for r in loads if isinstance(r, Mapping)]

    def total(key: str, field_name: str) -> int | None:
        vals = [v for r in ranks if (v := _num(r, key)) is not None]
        return int(_typed(field_name, sum(vals))) if vals else None

    def mean(key: str) -> float | None:
        vals = [v for r in ranks if (v := _num(r, key)) is not None]
        return _finite(key, sum(vals) / len(vals)) if vals else None

    return EngineState(
        dp_outstanding=_per_rank(ranks),
        running=total("num_running_reqs", "running"),
        queued=total("num_waiting_reqs", "queued"),
        waiting_uncached_tokens=total("num_waiting_uncached_tokens", "waiting_uncached_tokens"),
        used_tokens=total("num_used_tokens", "used_tokens"),
        token_usage=mean("token_usage"),
        cache_hit_rate=mean("cache_hit_rate"),
        max_running_requests=total("max_running_requests", "max_running_requests"),
        max_total_tokens=total("max_total_num_tokens", "max_total_tokens"),
    )


def _per_rank(ranks: list[Mapping[str, Any]]) -> tuple[int, ...] | None:
    """Running + waiting per DP rank, when the ranks are 0 .. n-1 once each (n >= 2, at most MAX_DP)."""
    if not 2 <= len(ranks) <= MAX_DP:
        return None
    out: dict[int, int] = {}
    for r in ranks:
        rank, running, waiting = r.get("dp_rank"), _num(r, "num_running_reqs"), _num(r, "num_waiting_reqs")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank in out or running is None:
            return None
        out[rank] = int(min(MAX_COUNT, max(0.0, running + (waiting or 0.0))))
    if sorted(out) != list(range(len(out))):
        return None
    return tuple(out[i] for i in range(len(out)))


def parse_get_load(doc: Any) -> EngineState:
    """Engine state from the older ``/get_load`` array."""
    if not isinstance(doc, list) or not doc:
        raise ValueError("/get_load: expected a non-empty list")
    ranks = [r for r in doc if isinstance(r, Mapping)]
    running = [v for r in ranks if (v := _num(r, "num_reqs")) is not None]
    waiting = [v for r in ranks if (v := _num(r, "num_waiting_reqs")) is not None]
    tokens = [v for r in ranks if (v := _num(r, "num_tokens")) is not None]
    return EngineState(
        running=int(_typed("running", sum(running))) if running else None,
        queued=int(_typed("queued", sum(waiting))) if waiting else None,
        used_tokens=int(_typed("used_tokens", sum(tokens))) if tokens else None,
    )


def parse_server_info(doc: Any) -> EngineState:
    """The static shape from ``/get_server_info`` (server args + scheduler_info + internal_states)."""
    if not isinstance(doc, Mapping):
        raise ValueError("/get_server_info: expected an object")
    raw_sched = doc.get("scheduler_info")
    sched: Mapping[str, Any] = raw_sched if isinstance(raw_sched, Mapping) else {}
    states = [s for s in doc.get("internal_states") or [] if isinstance(s, Mapping)]
    max_running = _num(doc, "max_running_requests")
    per_dp = [v for s in states if (v := _num(s, "effective_max_running_requests_per_dp")) is not None]
    if per_dp:  # what the scheduler actually enforces, summed over DP ranks
        max_running = sum(per_dp)
    dp = doc.get("dp_size")
    dp_size = dp if isinstance(dp, int) and not isinstance(dp, bool) and 1 <= dp <= MAX_DP else None
    max_total = _num(sched, "max_total_num_tokens") or _num(doc, "max_total_num_tokens")
    # scheduler_info is one DP rank's; the worker's pool is its ranks' together, as /v1/loads sums
    # them and max_running_requests above: each rank's own capacity where listed, else rank 0's
    # times the ranks
    pools = [v for s in states if isinstance(m := s.get("memory_usage"), Mapping)
             and (v := _num(m, "token_capacity")) is not None]
    if dp_size is not None and dp_size > 1:
        if len(pools) == dp_size:
            max_total = sum(pools)
        elif max_total:
            max_total *= dp_size
    page = _num(doc, "page_size")
    startup = _num(doc, "startup_time") or _num(sched, "startup_time")
    model = doc.get("served_model_name") or doc.get("model_path")
    kv = doc.get("kv_events_config")
    return EngineState(
        dp_size=dp_size,
        kv_events_config=kv[:4096] if isinstance(kv, str) and kv else None,
        max_running_requests=int(_typed("max_running_requests", max_running)) if max_running else None,
        max_total_tokens=int(_typed("max_total_tokens", max_total)) if max_total else None,
        page_size=int(_typed("page_size", page)) if page else None,
        startup_time=startup,
        model=str(model)[:256] if model else None,
    )


def parse_models(doc: Any) -> tuple[str, ...]:
    """Model ids from an OpenAI ``/v1/models`` list."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, list):
        return ()
    return tuple(str(m["id"])[:256] for m in data if isinstance(m, Mapping) and m.get("id"))


def generation_change(prev: EngineState | None, cur: EngineState) -> str | None:
    """Why the worker's cache must be assumed empty now (``restart`` / ``flush``), or None."""
    if prev is None:
        return None
    if prev.startup_time is not None and cur.startup_time is not None and cur.startup_time != prev.startup_time:
        return "restart"
    if (prev.prompt_tokens_total is not None and cur.prompt_tokens_total is not None
            and cur.prompt_tokens_total < prev.prompt_tokens_total):
        return "restart"
    if (prev.evictable_tokens and cur.evictable_tokens == 0 and not cur.running and not cur.queued):
        return "flush"
    return None


# -- the loop ------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Target:
    mode: str = ""  # "loads" | "metrics" | "get_load" once one worked; "none": none is served
    polls: int = 0
    need_info: bool = True
    info: EngineState = dataclasses.field(default_factory=EngineState)
    models: tuple[str, ...] | None = None


class Scraper:
    """Polls every worker each ``interval_s`` and hands ``(url, state | None, models)`` to ``publish``.

    ``fetch(url, path, timeout) -> (status, text)`` is injected (the upstream pool's GET).
    """

    def __init__(self, *, interval_s: float, timeout_s: float,
                 fetch: Callable[[str, str, float], Any],
                 publish: Callable[[str, EngineState | None, tuple[str, ...] | None], None],
                 on_failure: Callable[[str], None] | None = None) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._fetch = fetch
        self._publish = publish
        self._on_failure = on_failure
        self._targets: dict[str, _Target] = {}

    def set_workers(self, urls: frozenset[str]) -> None:
        self._targets = {u: self._targets.get(u) or _Target() for u in urls}

    async def run(self) -> None:
        if self.interval_s <= 0:
            return
        while True:
            await self.poll_all()
            await asyncio.sleep(self.interval_s)

    async def poll_all(self) -> None:
        await asyncio.gather(*(self.poll(url) for url in list(self._targets)))

    async def poll(self, url: str) -> None:
        target = self._targets.get(url)
        if target is None:
            return
        try:
            state = await self._poll_load(url, target)
        except Exception as e:  # any answer a worker gives fails its own scrape, never the fleet's loop
            if isinstance(e, OSError | ValueError | TimeoutError):
                log.debug("scrape %s failed: %s", url, e)
            else:
                log.warning("scrape %s failed unexpectedly: %r", url, e)
            target.need_info = True
            target.mode = ""
            if self._on_failure is not None:
                self._on_failure(url)
            self._publish(url, None, None)
            return
        target.polls += 1
        # The static shape and the model list are best effort: a worker without them still routes.
        if target.need_info or target.polls % SERVER_INFO_EVERY == 0:
            try:
                target.info = await self._get(url, "/get_server_info", parse_server_info)
                target.need_info = False
            except Exception as e:  # best effort (a bad page_size must not stop start-up)
                log.debug("server info %s failed: %r", url, e)
        if target.models is None:
            try:
                target.models = await self._get(url, "/v1/models", parse_models)
            except Exception as e:
                log.debug("models %s failed: %r", url, e)
        if url in self._targets:
            self._publish(url, target.info.merged(state), target.models)

    async def _poll_load(self, url: str, target: _Target) -> EngineState:
        if target.mode == "none" and target.polls % SERVER_INFO_EVERY:
            return EngineState()
        order = [target.mode] if target.mode not in ("", "none") else ["loads", "metrics", "get_load"]
        last: Exception | None = None
        served = False
        for mode in order:
            path, parser = {"loads": ("/v1/loads", parse_loads),
                            "metrics": ("/metrics", None),
                            "get_load": ("/get_load", parse_get_load)}[mode]
            state: EngineState
            try:
                if parser is None:
                    state = await self._get_text(url, path, parse_prometheus)
                else:
                    state = await self._get(url, path, parser)
            except ValueError as e:
                last = e
                served = served or not isinstance(e, NotServed)
                continue
            target.mode = mode
            return state
        if not served:
            target.mode = "none"
            return EngineState()
        raise ValueError(f"no load endpoint answered: {last}")

    async def _get_text(self, url: str, path: str, parse: Callable[[str], Any]) -> Any:
        status, text = await self._fetch(url, path, self.timeout_s)
        if status in NOT_SERVED:
            raise NotServed(f"{path}: HTTP {status}")
        if status != 200:
            raise ValueError(f"{path}: HTTP {status}")
        return parse(text)

    async def _get(self, url: str, path: str, parse: Callable[[Any], Any]) -> Any:
        def load(text: str) -> Any:
            try:
                doc = safejson.loads(text)
            except ValueError as e:
                raise ValueError(f"{path}: {e}") from None
            return parse(doc)
        return await self._get_text(url, path, load)
