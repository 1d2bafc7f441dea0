"""The diagnosis inside a running proxy: fed by the pipeline and the worker registry, served on the
admin port (GET /diagnosis), exported as /metrics gauges, and refreshed off the event loop. The
service takes the narrow things it uses and wires nothing itself: ``App`` (the composition root)
passes its ``observe`` to the pipeline's constructor as an observer, subscribes ``windows.observe``
to the registry's published snapshots, and hands ``handle`` and ``current`` to the admin port, the
metrics registry and the gRPC admin service. The live available-reuse counter shares the
diagnosis's cache model (``reuse.py``).

* every finished request that reached a worker → ``DiagnosisWindows.record`` (pipeline observer),
  and to ``share`` (behind replicas with ``diagnose.fleet_view``: the peer links tell the others);
* every finished request a peer replica told us of → ``record_peer`` (the same window);
* every published worker-snapshot set → ``DiagnosisWindows.observe`` (thinned to one sample per
  scrape interval);
* every ``diagnose.refresh_s`` a background task copies the windows on the loop and computes the
  diagnosis in a thread (the cache replay is O(Σ prompt blocks): ~55 ms for 1,000 requests of 2k
  tokens, ``loadtests/bench_diagnosis.py``), so /metrics and /diagnosis read a result at most
  ``2 x refresh_s`` old and never compute on the event loop. ``refresh_s`` 0 turns the task off:
  each read then computes inline.
* ``GET /diagnosis?window_s=N``: the same over the requests received in the last N seconds only
  (N up to ``diagnose.window_s``), computed for that call in a thread, one such call at a time: what
  happened since a change (a flush, a benchmark's phase) without the window's older traffic. A bad
  N is a 400 naming the bound.
* the NVML sampler runs when ``diagnose.nvml_interval_s`` > 0 and reports "unavailable" otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from proxy.diagnose.report import to_json
from proxy.diagnose.service import Diagnoser, Diagnosis
from proxy.diagnose.tail import BY, MAX_N, slowest
from proxy.diagnose.window import DiagnosisWindows, RequestRecord
from proxy.errors import BadRequest, to_body
from proxy.telemetry.gpu import NvmlSampler, load_nvml

if TYPE_CHECKING:
    from proxy.clock import Clock
    from proxy.config import DiagnoseConfig
    from proxy.records import CompletedRequest

log = logging.getLogger(__name__)


class DiagnosisService:
    def __init__(self, cfg: DiagnoseConfig, clock: Clock, *, snapshot_interval_s: float) -> None:
        self._refresh_s = cfg.refresh_s
        self._clock = clock
        self._max_span_s = cfg.window_s if cfg.window_s > 0 else math.inf
        self._on_demand = asyncio.Lock()  # a ?window_s= diagnosis at a time: each replays its span
        self.windows = DiagnosisWindows(
            clock,
            max_requests=cfg.window_requests,
            max_age_s=cfg.window_s,
            snapshot_interval_s=snapshot_interval_s,
        )
        self.sampler: NvmlSampler | None = None
        if cfg.nvml_interval_s > 0:
            self.sampler = NvmlSampler(load_nvml(), clock, indices=cfg.gpu_indices,
                                       interval_s=cfg.nvml_interval_s, max_age_s=cfg.window_s)
        self.diagnoser = Diagnoser.from_config(cfg, self.windows, clock, self.sampler)
        self._task: asyncio.Task[None] | None = None
        # Where each of our records goes besides our window (App: the peer links), if anywhere.
        self.share: Callable[[RequestRecord], None] | None = None

    def observe(self, done: CompletedRequest) -> None:
        if done.worker is None:
            return  # refused before routing: it never reached the fleet
        record = RequestRecord.of(done.timing, worker=done.worker, outcome=done.outcome, route=done.route,
                                  policy=done.policy, decision=done.decision, cause=done.cause, rid=done.rid,
                                  dp_rank=done.dp_rank,
                                  trace_id=done.trace.trace_id if done.trace is not None else None)
        self.windows.record(record)
        if self.share is not None:
            self.share(record)

    def record_peer(self, record: RequestRecord) -> None:
        """A request a peer replica routed (``RequestRecord.peer`` names it), already on our clock."""
        self.windows.record(record)

    def current(self) -> Diagnosis:
        return self.diagnoser.current()

    async def handle(self, request: web.Request) -> web.Response:
        raw = request.query.get("window_s")
        try:
            doc = await self.document(None if raw is None else _seconds(raw))
        except BadRequest as e:
            body = to_body(e, dialect="openai")
            return web.json_response(body.payload, status=body.status)
        return web.json_response(doc)

    async def handle_tail(self, request: web.Request) -> web.Response:
        """``GET /diagnosis/tail?n=10&by=ttft|e2e&window_s=N``: the slowest recent requests, each cut
        into the parts of its time (``tail.py``)."""
        q = request.query
        try:
            n = _count(q.get("n", "10"), "n", MAX_N)
            by = q.get("by", "ttft")
            if by not in BY:
                raise BadRequest(f"by: one of {', '.join(BY)}, got {by[:32]!r}")
            window_s = None if "window_s" not in q else self._span(_seconds(q["window_s"]))
        except BadRequest as e:
            body = to_body(e, dialect="openai")
            return web.json_response(body.payload, status=body.status)
        now = self._clock.now()
        records = [r for r in self.windows.requests.items() if window_s is None or r.timing.received >= now - window_s]
        return web.json_response(slowest(records, n=n, by=by, now=now))

    def _span(self, window_s: float) -> float:
        if not 0 < window_s <= self._max_span_s:
            bound = "diagnose.window_s" if math.isfinite(self._max_span_s) else "any"
            raise BadRequest(f"window_s: seconds in (0, {self._max_span_s:g}] ({bound}), got {window_s!r}")
        return window_s

    async def document(self, window_s: float | None) -> dict[str, Any]:
        """The diagnosis as JSON: the current one, or over the last ``window_s`` seconds only (a
        ``BadRequest`` naming the bound when it is not in (0, diagnose.window_s])."""
        if window_s is None:
            return to_json(self.current())
        self._span(window_s)
        async with self._on_demand:
            inputs = self.diagnoser.inputs(since=self._clock.now() - window_s)
            return to_json(await asyncio.to_thread(self.diagnoser.compute, inputs))

    async def start(self) -> None:
        if self.sampler is not None:
            await self.sampler.start()
        if self._refresh_s > 0:
            self._task = asyncio.create_task(self._refresh(), name="diagnosis-refresh")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.sampler is not None:
            await self.sampler.stop()

    async def _refresh(self) -> None:
        while True:
            try:
                inputs = self.diagnoser.inputs()
                self.diagnoser.store(await asyncio.to_thread(self.diagnoser.compute, inputs))
            except Exception:  # a bad window must not kill the loop; the next round retries
                log.exception("diagnosis refresh failed")
            await asyncio.sleep(self._refresh_s)


def _count(raw: str, name: str, most: int) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if not 1 <= value <= most:
        raise BadRequest(f"{name}: an integer in [1, {most}], got {raw[:32]!r}")
    return value


def _seconds(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise BadRequest(f"window_s: seconds, got {raw[:32]!r}") from None
