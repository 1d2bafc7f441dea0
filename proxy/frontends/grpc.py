"""The gRPC frontend (grpc.aio on the proxy's own event loop): radixgate.v1, health, reflection.

Services on ``server.grpc_port``:

* ``radixgate.v1.Generation`` — ``Generate`` (server-streaming) and ``GenerateUnary``. Each call is
  parsed once (``grpc_messages.to_generate_request``) and then runs through the same ``Pipeline``
  as HTTP: admission, routing, timing, metrics (``frontend="grpc"``), request log.
* ``radixgate.v1.Admin`` — ``ListWorkers`` and ``GetDiagnosis`` (JSON text, as GET /diagnosis).
* ``grpc.health.v1.Health`` — ``""`` and ``radixgate.v1.Generation`` are SERVING while the proxy is
  ready (at least one healthy worker, not draining) and NOT_SERVING otherwise; ``Watch`` streams
  each change. Readiness is re-evaluated whenever the worker registry publishes snapshots, so a
  change reaches watchers without polling.
* ``grpc.reflection.v1.ServerReflection`` and ``v1alpha`` — list all of the above (``grpc_reflection_v1.py``).

Messages: one ``GenerateResponse`` per run of upstream events that arrived together (the relayed
``Exchange.chunks()``, read by ``grpc_deltas.RunReader``, which skips re-parsing what SGLang's
cumulative chunks repeat): one token each while the client keeps up, several when it falls behind,
never a wait to batch. gRPC's per-message cost is several times aiohttp's (tens of µs of server CPU
and thread hand-offs per message), so this is what keeps a slow reader from falling further behind.
The last run travels with ``final``.

Each call runs its exchange in a task of its own: the handler returns (and gRPC sends OK) as soon
as the last message is written, while the exchange closes (metrics, log, policy feedback) behind
it — the order HTTP has, where ``write_eof`` comes before the exchange closes.

Deadlines and cancellation: the call's remaining time becomes ``GenerateRequest.timeout_s``, which
the pipeline applies as the upstream timeout. When the caller cancels (or its deadline passes),
grpc.aio cancels the handler, the handler cancels the exchange's task, and the unwinding exchange
closes the upstream stream and sends ``/abort_request`` to the worker.

Errors: a ``RadixgateError`` ends the call with its own ``grpc_code`` (the table in errors.py) and
its message. An error the worker reports (an HTTP status or an error event mid-stream) maps through
``errors.from_upstream_status``. A failed call is ended only after the exchange has closed, so the
pipeline records the request's real outcome, not a cancellation.

Stop: ``begin_drain`` turns health NOT_SERVING at once (new Generate calls are refused by admission
as UNAVAILABLE); ``stop(grace_s)`` waits up to ``grace_s`` for running generation calls, then
closes the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health as health_sync
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proxy._proto.radixgate.v1 import admin_pb2, admin_pb2_grpc, generate_pb2, generate_pb2_grpc
from proxy.clock import wait_until
from proxy.errors import BadRequest, RadixgateError, from_upstream_status
from proxy.frontends import grpc_reflection_v1
from proxy.frontends.grpc_deltas import RunRead, RunReader
from proxy.frontends.grpc_messages import final_message, to_generate_request, tokens_added, worker_state
from proxy.frontends.tls import ServingTls
from proxy.pipeline import Exchange, Finished
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import WorkerSnapshot
from proxy.security import GrpcGuard
from proxy.sse import ErrorEvent, TextDelta
from proxy.tracecontext import from_headers

if TYPE_CHECKING:
    from proxy.config import Config
    from proxy.pipeline import Pipeline

log = logging.getLogger("radixgate.grpc")

FRONTEND = "grpc"
GENERATION_SERVICE = generate_pb2.DESCRIPTOR.services_by_name["Generation"].full_name
ADMIN_SERVICE = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
# Health names that follow readiness: "" is what Kubernetes' grpc probe asks by default.
READINESS_SERVICES = ("", GENERATION_SERVICE)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

GenerateContext = grpc.aio.ServicerContext[generate_pb2.GenerateRequest, generate_pb2.GenerateResponse]
UnaryContext = grpc.aio.ServicerContext[generate_pb2.GenerateRequest, generate_pb2.GenerateUnaryResponse]


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclasses.dataclass(slots=True)
class _Outcome:
    """What a generation call ends with: the unary text and final, or the error to end the call with."""

    error: RadixgateError | None = None
    text_parts: list[str] = dataclasses.field(default_factory=list)
    final: generate_pb2.Final | None = None


class GrpcFrontend:
    """Built by ``App.start`` when ``server.grpc_port`` is set; ``start`` returns the bound port.

    Takes what it uses: the pipeline (exchanges, rejects, the clock), the worker snapshots (admin
    ListWorkers), readiness, the guard (API keys, rate limit) and, when there is one, the current
    diagnosis. ``App`` tells it of each published snapshot set (``on_publish``): readiness may have
    changed."""

    def __init__(self, config: Config, pipeline: Pipeline, *, snapshots: Callable[[], Sequence[WorkerSnapshot]],
                 ready: Callable[[], bool], guard: GrpcGuard,
                 diagnosis: Callable[[float | None], Awaitable[dict[str, Any]]] | None = None,
                 tls: ServingTls | None = None) -> None:
        self._config, self._pipeline, self._ready, self._guard = config, pipeline, ready, guard
        self._tls = tls
        self._snapshots, self._diagnosis = snapshots, diagnosis
        self._server: grpc.aio.Server | None = None
        self._health: Any = None  # grpc_health's aio HealthServicer (untyped upstream)
        self._readiness_changed = asyncio.Event()
        self._follower: asyncio.Task[None] | None = None
        self._draining: asyncio.Task[None] | None = None
        self._active = 0
        self._calls: set[asyncio.Task[None]] = set()  # running exchanges (strong references)
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> int:
        cfg = self._config
        limit = cfg.limits.max_body_bytes
        # API key, per-client rate limit and unparseable messages → INVALID_ARGUMENT (proxy/security.py).
        server = grpc.aio.server(interceptors=[self._guard], options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.so_reuseport", 0),
        ])
        # The generated adders carry no annotations (grpcio-tools writes no .pyi for services).
        generate_pb2_grpc.add_GenerationServicer_to_server(_Generation(self), server)  # type: ignore[no-untyped-call]
        admin_pb2_grpc.add_AdminServicer_to_server(_Admin(self._snapshots, self._diagnosis), server)  # type: ignore[no-untyped-call]
        self._health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        grpc_reflection_v1.enable(server, (GENERATION_SERVICE, ADMIN_SERVICE, health_sync.SERVICE_NAME))
        address = _address(cfg.server.host, max(0, cfg.server.grpc_port))
        credentials = self._tls.grpc_credentials() if self._tls is not None else None
        port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        await self._health.set(ADMIN_SERVICE, SERVING)
        await self._publish_readiness(None)
        self._follower = asyncio.get_running_loop().create_task(self._follow_readiness(), name="grpc-health")
        await server.start()
        self._server = server
        return port

    def begin_drain(self) -> None:
        """Health goes NOT_SERVING for good; running calls continue."""
        if self._follower is not None:
            self._follower.cancel()
        if self._health is not None:
            self._draining = asyncio.get_running_loop().create_task(self._health.enter_graceful_shutdown())

    async def stop(self, grace_s: float) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None
        if self._draining is not None:
            await self._draining
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if grace_s > 0:
            await wait_until(self._pipeline.clock, self._idle, grace_s)
        if self._server is not None:
            # Health Watch streams never end on their own: whatever is left now is cancelled.
            await self._server.stop(0)
            self._server = None

    # -- readiness → health --------------------------------------------------------------------
    def on_publish(self, snapshots: Sequence[WorkerSnapshot]) -> None:
        self._readiness_changed.set()

    async def _follow_readiness(self) -> None:
        last: bool | None = self._ready()
        while True:
            await self._readiness_changed.wait()
            self._readiness_changed.clear()
            last = await self._publish_readiness(last)

    async def _publish_readiness(self, last: bool | None) -> bool:
        ready = self._ready()
        if ready != last:
            for service in READINESS_SERVICES:
                await self._health.set(service, SERVING if ready else NOT_SERVING)
            log.info("grpc health: %s", "SERVING" if ready else "NOT_SERVING")
        return ready

    # -- one generation call ---------------------------------------------------------------------
    async def run(self, msg: generate_pb2.GenerateRequest, context: Any, *, stream: bool) -> _Outcome:
        """Parse, run through the pipeline, write chunks when ``stream``; never raises a RadixgateError."""
        pipeline = self._pipeline
        received = pipeline.clock.now()
        remaining = context.time_remaining()
        try:
            req = to_generate_request(msg, timeout_s=remaining, stream=stream,
                                      max_prompt_chars=self._config.limits.max_prompt_chars)
        except BadRequest as e:
            dialect = Dialect.CHAT if msg.WhichOneof("prompt") == "chat" else Dialect.SGLANG
            pipeline.reject(FRONTEND, dialect.value, e, received)
            return _Outcome(error=e)
        req.trace = from_headers(_metadata_reader(context))
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[_Outcome] = loop.create_future()
        task = loop.create_task(self._exchange(req, received, context, stream, answered))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        try:
            return await answered
        except asyncio.CancelledError:
            task.cancel()  # the caller left: unwinding the exchange aborts the upstream request
            raise

    async def _exchange(self, req: GenerateRequest, received: float, context: Any, stream: bool,
                        answered: asyncio.Future[_Outcome]) -> None:
        """Run one exchange; answer the call as soon as its last message is out, then let the exchange
        close (metrics, log, policy feedback) after the caller already has its status, as HTTP does."""
        self._active += 1
        self._idle.clear()
        out: _Outcome
        try:
            async with self._pipeline.exchange(req, received=received) as ex:
                out = await self._consume(ex, context, stream=stream)
                if out.error is None and not answered.done():
                    answered.set_result(out)
                    await asyncio.sleep(0)  # let the handler return (and send OK) before the bookkeeping
        except RadixgateError as e:
            out = _Outcome(error=e)
        except asyncio.CancelledError:
            answered.cancel()
            raise
        except Exception as e:  # a bug, or a write racing the call's end: answer, never hang the call
            log.warning("grpc call ended by %r", e)
            out = _Outcome(error=RadixgateError(f"internal error: {type(e).__name__}"))
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()
        if not answered.done():
            answered.set_result(out)

    async def _consume(self, ex: Exchange, context: Any, *, stream: bool) -> _Outcome:
        """One message per run of events that arrived together; the last one carries ``final``.

        A stream's runs are read from the relayed bytes (``RunReader``: no json.loads of what a
        cumulative chunk repeats); a whole answer (an error status, a non-stream body) goes through
        ``Exchange.event_runs``."""
        if not ex.streaming:
            return await self._consume_events(ex, context, stream=stream)
        out = _Outcome()
        reader = RunReader(ex.req.dialect)
        last = RunRead("", 0, None)
        # Read to the end even after an error, so the exchange closes as finished, not abandoned.
        async for data in ex.chunks():
            if out.error is not None:
                continue
            try:
                run = reader.read(data)
            except ValueError as e:  # an event the relay passed on but no decoder can read: the worker's fault
                out.error = ex.broken_event(e)
                break
            if run.error is not None:
                out.error = self._worker_error(ex, run.error)
            elif ex.last_chunk:
                last = run  # sent with ``final``, which needs the stream closed (meta, timing)
            elif not stream:
                out.text_parts.append(run.text)
            elif run.text or run.tokens:
                await context.write(generate_pb2.GenerateResponse(text=run.text, token_count=run.tokens))
        if out.error is not None:
            return out
        assert ex.worker is not None
        final = self._final(Finished(ex.meta, ex.worker, ex.rid, ex.timing))
        if not stream:
            out.text_parts.append(last.text)
            out.final = final
        else:
            await context.write(generate_pb2.GenerateResponse(text=last.text, token_count=last.tokens, final=final))
        return out

    async def _consume_events(self, ex: Exchange, context: Any, *, stream: bool) -> _Outcome:
        out = _Outcome()
        emitted = 0
        async for run in ex.event_runs():
            if out.error is not None:
                continue
            parts: list[str] = []
            count = 0
            final: generate_pb2.Final | None = None
            for event in run:
                if isinstance(event, TextDelta):
                    added = tokens_added(event, emitted)
                    emitted += added
                    count += added
                    parts.append(event.text)
                elif isinstance(event, ErrorEvent):
                    out.error = self._worker_error(ex, event)
                    break
                else:
                    final = self._final(event)
            if out.error is not None:
                continue
            text = "".join(parts)
            if not stream:
                out.text_parts.append(text)
                out.final = final or out.final
            elif text or count or final is not None:
                await context.write(generate_pb2.GenerateResponse(text=text, token_count=count, final=final))
        return out

    @staticmethod
    def _worker_error(ex: Exchange, event: ErrorEvent) -> RadixgateError:
        status = event.code or (ex.status if ex.status >= 400 else None)
        return ex.error or from_upstream_status(status, f"worker error: {event.message}")

    def _final(self, done: Finished) -> generate_pb2.Final:
        m = done.meta
        # The exchange marks `done` only when it closes; the caller wants e2e up to this message.
        timing = dataclasses.replace(done.timing, done=self._pipeline.clock.now(),
                                     token_gaps=list(done.timing.token_gaps), worker_queue_time=m.queue_time)
        return final_message(
            finish_reason=m.finish_reason or "", prompt_tokens=m.prompt_tokens, cached_tokens=m.cached_tokens,
            completion_tokens=m.completion_tokens, worker=done.worker, request_id=done.rid,
            stages=timing.stages())


def _metadata_reader(context: Any) -> Callable[[str], str | None]:
    """``get(name)`` over the call's metadata: a repeated key's values joined with commas."""
    metadata = context.invocation_metadata() or ()

    def get(name: str) -> str | None:
        values = [v for k, v in metadata if k == name and isinstance(v, str)]
        return ",".join(values) if values else None
    return get


async def _fail(context: Any, err: RadixgateError) -> None:
    """End the call with the error's code and message; ``retry-after`` (seconds) when it has one."""
    trailer = (("retry-after", str(max(1, math.ceil(err.retry_after)))),) if err.retry_after else ()
    await context.abort(err.grpc_code, err.message, trailer)


class _Generation(generate_pb2_grpc.GenerationServicer):
    def __init__(self, frontend: GrpcFrontend) -> None:
        self._frontend = frontend

    async def Generate(self, request: generate_pb2.GenerateRequest, context: GenerateContext) -> None:
        out = await self._frontend.run(request, context, stream=True)
        if out.error is not None:
            await _fail(context, out.error)

    async def GenerateUnary(
        self, request: generate_pb2.GenerateRequest, context: UnaryContext
    ) -> generate_pb2.GenerateUnaryResponse:
        out = await self._frontend.run(request, context, stream=False)
        if out.error is not None:
            await _fail(context, out.error)
        return generate_pb2.GenerateUnaryResponse(text="".join(out.text_parts), final=out.final)


class _Admin(admin_pb2_grpc.AdminServicer):
    def __init__(self, snapshots: Callable[[], Sequence[WorkerSnapshot]],
                 diagnosis: Callable[[float | None], Awaitable[dict[str, Any]]] | None) -> None:
        self._snapshots, self._diagnosis = snapshots, diagnosis

    async def ListWorkers(
        self, request: admin_pb2.ListWorkersRequest, context: Any
    ) -> admin_pb2.ListWorkersResponse:
        return admin_pb2.ListWorkersResponse(workers=[worker_state(s) for s in self._snapshots()])

    async def GetDiagnosis(
        self, request: admin_pb2.GetDiagnosisRequest, context: Any
    ) -> admin_pb2.GetDiagnosisResponse:
        if self._diagnosis is None:
            doc: dict[str, Any] = {"available": False, "reason": "the diagnosis is not enabled in this build"}
        else:
            try:
                doc = await self._diagnosis(request.window_s if request.HasField("window_s") else None)
            except BadRequest as e:
                await _fail(context, e)
        return admin_pb2.GetDiagnosisResponse(json=json.dumps(doc))
