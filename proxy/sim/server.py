"""SimWorker: one simulated SGLang worker served over HTTP with aiohttp (AppRunner + TCPSite).

Endpoints follow SGLang 0.5.23 (shared/reference/sglang-protocol.md §1): /generate (POST, PUT),
/v1/completions, /v1/chat/completions, /v1/responses (POST; GET and cancel by id), /v1/messages
(POST, Anthropic's Messages API, and /v1/messages/count_tokens), /v1/embeddings, /v1/rerank,
/v1/score, /v1/classify, /tokenize and /detokenize (also under /v1), /v1/models,
/health, /health_generate, /ready, /get_server_info, /get_model_info, /v1/loads, /get_load,
/flush_cache, /abort_request and, with enable_metrics, /metrics. Every reply carries ``x-simworker-id``. A client that disconnects has its
request aborted (aiohttp handler cancellation), which frees its batch slot and KV.

Faults: slow start (health 503 and generate 503 while "starting"), failing health, an error rate
(500 before any work), hanging before the first token, and dying after N generated tokens (every
open connection is dropped and the listener closes; the CLI process exits).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from proxy.clock import Clock, MonotonicClock
from proxy.sim.config import SimConfig, base_url, fault_updates
from proxy.sim.engine import Engine
from proxy.sim.gpu_realtime import RealTimeGpu
from proxy.sim.kv_publish import KvEventsSettings, KvPublisher, publishers
from proxy.sim.metrics import SimMetrics
from proxy.sim.protocol import BadRequest, openai_error, parse_generate, parse_openai
from proxy.sim.scheduler import InvalidRequest, QueueFull, SimRequest
from proxy.sim.tokenizer import Encoder

SHUTDOWN_GRACE_S = 0.5  # open handlers get this long to finish once the engine has aborted their requests


class SimWorker:
    def __init__(self, config: SimConfig, clock: Clock | None = None,
                 on_die: Callable[[], None] | None = None, rng: random.Random | None = None,
                 gpu: RealTimeGpu | None = None) -> None:
        config.validate()
        self.config = dataclasses.replace(config)
        self.clock = clock or MonotonicClock()
        # One engine per data-parallel rank (SimConfig.dp_size); ``engine`` is rank 0 (the only one
        # at dp_size 1): what /metrics reports and what single-engine tools read.
        self.ranks = [Engine(self.config, self.clock, gpu) for _ in range(self.config.dp_size)]
        self.engine = self.ranks[0]
        self._next_rank = 0
        self.encoder = Encoder(self.config.tokenizer)
        # Finished requests' true prompt and cached tokens (GET /bench/stats), whatever is reported.
        self.finished_prompt_tokens = 0
        self.finished_cached_tokens = 0
        self.finished_requests = 0
        self.metrics = SimMetrics(self.engine, config.served_model_name) if config.enable_metrics else None
        for rank in self.ranks:
            rank.on_tokens = self._check_die
        self.rng = rng or random.Random(config.seed)  # draws the error-rate fault
        self.on_die = on_die
        self.port = config.port
        self.started_at = 0.0
        self.wall_offset = time.time() - self.clock.now()
        self.dead = False
        self.kv_publishers: list[KvPublisher] = []  # one per rank
        self.kv_publisher: KvPublisher | None = None  # rank 0's: where /get_server_info says events are
        self._runner: web.AppRunner | None = None
        self._active: set[asyncio.Transport] = set()
        self._background: set[asyncio.Task[Any]] = set()

    @web.middleware
    async def _require_api_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        # SGLang's --api-key guards the serving API; probes and metrics stay open.
        if request.path.startswith(("/generate", "/v1/")) and \
                request.headers.get("Authorization") != f"Bearer {self.config.api_key}":
            return web.json_response({"error": {"message": "Unauthorized"}}, status=401)
        result: web.StreamResponse = await handler(request)
        return result

    @property
    def worker_id(self) -> str:
        return self.config.worker_id or f"simworker-{self.port}"

    @property
    def url(self) -> str:
        return base_url(self.config.host, self.port)

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        middlewares = [self._require_api_key] if self.config.api_key else []
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=middlewares)
        app.on_response_prepare.append(self._stamp_header)
        # The handler modules depend on this one (the worker they serve, its error bodies), so the
        # worker loads them when it starts rather than at import: imports run one way only.
        from proxy.sim import (
            admin,
            classify,
            embeddings,
            messages,
            rerank,
            responses,
            score,
            streaming,
            tokenize,
        )

        streaming.add_routes(app, self)
        embeddings.add_routes(app, self)
        responses.add_routes(app, self)
        messages.add_routes(app, self)
        tokenize.add_routes(app, self)
        rerank.add_routes(app, self)
        score.add_routes(app, self)
        classify.add_routes(app, self)
        admin.add_routes(app, self)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self.started_at = self.clock.now()
        if self.config.kv_events_config:
            # each rank's cache on its own stream, as SGLang's DP ranks publish
            self.kv_publishers = publishers(KvEventsSettings.parse(self.config.kv_events_config), len(self.ranks))
            self.kv_publisher = self.kv_publishers[0]
            for rank, publisher in zip(self.ranks, self.kv_publishers, strict=True):
                publisher.start()
                rank.kv_publisher = publisher
        for rank in self.ranks:
            rank.start()

    async def stop(self) -> None:
        for rank in self.ranks:
            await rank.stop()
        for publisher in self.kv_publishers:
            await publisher.close()
        self.kv_publishers, self.kv_publisher = [], None
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for task in list(self._background):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def set_faults(self, **knobs: Any) -> None:
        for name, value in fault_updates(**knobs).items():
            setattr(self.config, name, value)

    async def _stamp_header(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-simworker-id"] = self.worker_id

    # -- faults ----------------------------------------------------------------------------------
    def starting(self) -> bool:
        return self.clock.now() < self.started_at + self.config.fault_slow_start / self.config.time_scale

    def _check_die(self, total_tokens: int) -> None:
        limit = self.config.fault_die_after_tokens
        if limit is not None and total_tokens >= limit and not self.dead:
            self.dead = True
            for transport in list(self._active):
                transport.abort()
            self.spawn(self._die())

    async def _die(self) -> None:
        for rank in self.ranks:
            await rank.stop()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self.on_die is not None:
            self.on_die()

    def spawn(self, work: Coroutine[Any, Any, None], name: str | None = None) -> asyncio.Task[None]:
        """Run ``work`` as a task the worker keeps a reference to (the loop holds tasks weakly) and
        cancels on ``stop``: the die fault's shutdown, background /v1/responses generations."""
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def bench_stats(self) -> dict[str, int]:
        active = sum(r.scheduler.num_running + len(r.scheduler.waiting) for r in self.ranks)
        return {"prompt_tokens": self.finished_prompt_tokens, "cached_tokens": self.finished_cached_tokens,
                "requests": self.finished_requests, "active": active}

    def gate(self) -> tuple[str, int] | None:
        """The fault checks every generate request passes before it reaches the engine."""
        if self.starting():
            return "The server is starting.", 503
        rate = self.config.fault_error_rate
        if rate > 0 and self.rng.random() < rate:
            return "Simulated internal error (fault_error_rate).", 500
        return None

    async def hang_if_faulted(self) -> None:
        if self.config.fault_hang_before_first_token:
            await asyncio.Event().wait()  # until the client gives up (handler cancellation)

    # -- shared request path ---------------------------------------------------------------------
    def submit(self, req: SimRequest) -> tuple[str, int] | None:
        """Queue a request on its rank; returns (message, HTTP status) when the engine refuses it."""
        rank = req.dp_rank
        if rank is None:  # SGLang's controller: round robin, blind to prefixes
            rank, self._next_rank = self._next_rank, (self._next_rank + 1) % len(self.ranks)
        elif rank >= len(self.ranks):
            return f"data_parallel_rank {rank} is out of range (dp_size {len(self.ranks)})", 400
        try:
            self.ranks[rank].submit(req)
        except QueueFull as e:
            self._count_abort()
            return str(e), 503
        except (InvalidRequest, ValueError) as e:
            return str(e), 400
        return None

    def _count_abort(self) -> None:
        if self.metrics is not None:
            self.metrics.aborted.labels(**self.metrics.tok).inc()

    def track(self, request: web.Request) -> None:
        if request.transport is not None:
            self._active.add(request.transport)

    def untrack(self, request: web.Request, *reqs: SimRequest | None) -> None:
        """The handler is done: its requests still running are aborted (the client disconnected)."""
        if request.transport is not None:
            self._active.discard(request.transport)
        for req in reqs:
            if req is not None and not req.finished and self.abort(req.rid, "The client disconnected.", 499):
                self._count_abort()

    def abort(self, rid: str, message: str = "Aborted by request.", status: int | None = None) -> bool:
        """Abort ``rid`` on whichever rank holds it."""
        return any(rank.abort(rid, message, status) for rank in self.ranks)


def error_response(message: str, status: int, openai: bool = False) -> web.Response:
    body = openai_error(message, status) if openai else {"error": {"message": message}}
    return web.json_response(body, status=status)


async def read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError as e:
        raise BadRequest(f"invalid JSON body: {e}") from e


__all__ = ["SimWorker", "error_response", "parse_generate", "parse_openai", "read_json"]
