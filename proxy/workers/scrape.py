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
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

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


def _typed(field_name: str, value: float) -> int | float:
    return int(value) if field_name in _INT_FIELDS else float(value)


def parse_prometheus(text: str) -> EngineState:
    """Engine state from SGLang's Prometheus exposition (``sglang:`` names, any label sets)."""
    series: dict[str, list[float]] = {}
    page_from_info: list[float] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ENGINE_METRICS:
                series.setdefault(sample.name, []).append(sample.value)
            elif sample.name == "sglang:cache_config_info" and "page_size" in sample.labels:
                try:
                    page_from_info.append(float(sample.labels["page_size"]))
                except ValueError:
                    pass
    fields: dict[str, Any] = {}
    for name, values in series.items():
        field_name, how = ENGINE_METRICS[name]
        fields[field_name] = _typed(field_name, _combine(values, how))
    if "page_size" not in fields and page_from_info:
        fields["page_size"] = int(max(page_from_info))
    return EngineState(**fields)


def _num(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def parse_loads(doc: Any) -> EngineState:
    """Engine state from ``/v1/loads`` JSON: ranks summed, ratios averaged."""
    loads = doc.get("loads") if isinstance(doc, Mapping) else None
    if not isinstance(loads, list) or not loads:
        raise ValueError("/v1/loads: no 'loads' list")
    ranks = [r for r in loads if isinstance(r, Mapping)]

    def total(key: str) -> int | None:
        vals = [v for r in ranks if (v := _num(r, key)) is not None]
        return int(sum(vals)) if vals else None

    def mean(key: str) -> float | None:
        vals = [v for r in ranks if (v := _num(r, key)) is not None]
        return sum(vals) / len(vals) if vals else None

    return EngineState(
        running=total("num_running_reqs"),
        queued=total("num_waiting_reqs"),
        waiting_uncached_tokens=total("num_waiting_uncached_tokens"),
        used_tokens=total("num_used_tokens"),
        token_usage=mean("token_usage"),
        cache_hit_rate=mean("cache_hit_rate"),
        max_running_requests=total("max_running_requests"),
        max_total_tokens=total("max_total_num_tokens"),
    )


def parse_get_load(doc: Any) -> EngineState:
    """Engine state from the older ``/get_load`` array."""
    if not isinstance(doc, list) or not doc:
        raise ValueError("/get_load: expected a non-empty list")
    ranks = [r for r in doc if isinstance(r, Mapping)]
    running = [v for r in ranks if (v := _num(r, "num_reqs")) is not None]
    waiting = [v for r in ranks if (v := _num(r, "num_waiting_reqs")) is not None]
    tokens = [v for r in ranks if (v := _num(r, "num_tokens")) is not None]
    return EngineState(
        running=int(sum(running)) if running else None,
        queued=int(sum(waiting)) if waiting else None,
        used_tokens=int(sum(tokens)) if tokens else None,
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
    max_total = _num(sched, "max_total_num_tokens") or _num(doc, "max_total_num_tokens")
    page = _num(doc, "page_size")
    startup = _num(doc, "startup_time") or _num(sched, "startup_time")
    model = doc.get("served_model_name") or doc.get("model_path")
    return EngineState(
        max_running_requests=int(max_running) if max_running else None,
        max_total_tokens=int(max_total) if max_total else None,
        page_size=int(page) if page else None,
        startup_time=startup,
        model=str(model) if model else None,
    )


def parse_models(doc: Any) -> tuple[str, ...]:
    """Model ids from an OpenAI ``/v1/models`` list."""
    data = doc.get("data") if isinstance(doc, Mapping) else None
    if not isinstance(data, list):
        return ()
    return tuple(str(m["id"]) for m in data if isinstance(m, Mapping) and m.get("id"))


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
        except (OSError, ValueError, TimeoutError) as e:
            log.debug("scrape %s failed: %s", url, e)
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
            except (OSError, ValueError, TimeoutError) as e:
                log.debug("server info %s failed: %s", url, e)
        if target.models is None:
            try:
                target.models = await self._get(url, "/v1/models", parse_models)
            except (OSError, ValueError, TimeoutError) as e:
                log.debug("models %s failed: %s", url, e)
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
                return parse(json.loads(text))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: {e}") from e
        return await self._get_text(url, path, load)
