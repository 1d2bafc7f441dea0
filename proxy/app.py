"""Composition root: build every part from one ``Config``, start them in order, drain on stop.

    app = App(cfg)                     # builds; a bad policy name / param fails here
    await app.start()                  # workers known, one probe + scrape round, ports bound
    app.http_port, app.admin_port      # real ports (config port 0 → picked by the OS)
    await app.stop()                   # drain: refuse new work, let in-flight finish, close

Start order: worker set from the source → one health probe round and one scrape round (so the
first request is routed on real state) → background loops (membership, probes, scrapes) → admin
port → public port → gRPC port. Stop order is the reverse, after draining for
``server.drain_grace_s``.

This is the one wiring point: every part receives the narrow things it uses in its constructor
(the pipeline its observers, route listeners and upstream authorization; the gRPC frontend the
pipeline, the worker snapshots, readiness, its guard and the diagnosis; peer sync the holds it
releases), and only this module subscribes parts to the worker registry's events. No part takes
``App``.

Extension points: ``add_admin_route`` (before ``start``) for admin endpoints such as
``/diagnosis``; observers of every finished request are passed to ``Pipeline(observers=...)``
here; the gRPC frontend is ``proxy.frontends.grpc.GrpcFrontend`` with ``async start() -> port``
and ``async stop(grace_s)``, started when ``server.grpc_port`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.admission import Admission
from proxy.clock import Clock, MonotonicClock
from proxy.config import Config, ConfigError, RoutingConfig
from proxy.diagnose.reuse import AvailableReuse, fleet_kv_tokens
from proxy.diagnose.window import RequestRecord
from proxy.diagnose.wiring import DiagnosisService
from proxy.errors import ShuttingDown
from proxy.frontends.http import build_admin_app, build_public_app
from proxy.frontends.tls import ServingTls
from proxy.frontends.workers_api import WorkersApi, is_loopback
from proxy.limits import (
    ConnectionGate,
    GatedListener,
    RateLimiter,
    handler_options,
    plan_file_descriptors,
    serve_gated,
)
from proxy.peers import PATH as PEER_PATH
from proxy.peers import PeerSync
from proxy.pipeline import Pipeline
from proxy.pipeline.holds import Holds
from proxy.rotation import Rotation, Watched
from proxy.routing.base import ExplainsModel, WorkerSnapshot
from proxy.routing.dp_rank import RankBook, affinity_key
from proxy.routing.registry import build_policy
from proxy.routing.tokenizer import PromptTokenizer, TokenizerUnavailable
from proxy.security import (
    GrpcGuard,
    guard_http_app,
    http_authorized,
    load_admin_key,
    load_api_keys,
    upstream_authorization,
)
from proxy.telemetry.logging import RequestLogger
from proxy.telemetry.metrics import Metrics, attach_diagnosis
from proxy.workers.health import HealthChecker
from proxy.workers.kv_fleet import KvFleet
from proxy.workers.membership import Membership
from proxy.workers.registry import StaticSource, WorkerRegistry, WorkerSource, normalise_url
from proxy.workers.scrape import Scraper
from proxy.workers.upstream import UpstreamPool

if TYPE_CHECKING:
    from proxy.telemetry.tracing import RequestTracer

log = logging.getLogger("radixgate")

# How long start() waits for a dynamic source's first worker set before serving without workers.
FIRST_MEMBERSHIP_TIMEOUT_S = 10.0
# After stop()'s own drain, what aiohttp still gives a handler (twice: to finish, then once
# cancelled). The drain already waited the grace period; anything left now is cut.
CLOSE_AFTER_DRAIN_S = 0.5


class _Frontend(Protocol):
    async def start(self) -> int: ...

    def on_publish(self, snapshots: Sequence[WorkerSnapshot]) -> None: ...

    def begin_drain(self) -> None: ...

    async def stop(self, grace_s: float) -> None: ...


def source_for(config: Config) -> WorkerSource:
    """``workers.static`` for ``discovery.kind: static``, else the DNS / Kubernetes source."""
    from proxy.workers.discovery import build_discovery_source

    dynamic = build_discovery_source(config)
    if dynamic is not None:
        return dynamic
    return StaticSource(w.url for w in config.workers.static)


class App:
    def __init__(self, config: Config, *, clock: Clock | None = None,
                 registry: CollectorRegistry | None = None, rng: random.Random | None = None,
                 source: WorkerSource | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or MonotonicClock()
        self.rng = rng or random.Random()
        self.metrics = Metrics(registry if registry is not None else CollectorRegistry())
        self.policy = build_policy(config.routing, rng=self.rng)
        self.source = source if source is not None else source_for(config)
        # The source's workers as changed on the admin port (POST /workers, DELETE /workers/{url}).
        self.membership = Membership(max_workers=config.workers.max_workers)
        self.upstream = UpstreamPool(config.upstream)
        self.admission = Admission(config.admission, self.clock)
        # Each worker's KV cache events (kv_events.endpoint; off by default): snapshots carry them.
        self.kv = KvFleet(config.kv_events, self.clock, wall_clock=time.time, per_worker={
            normalise_url(w.url): (w.kv_events, w.kv_events_replay) for w in config.workers.static},
            reported=lambda url: (e.kv_events_config if (e := self.workers.engine(url)) is not None else None),
            ranks=lambda url: (e.dp_size if (e := self.workers.engine(url)) is not None else None),
            best_rank=config.routing.dp_ranks)
        self.workers = WorkerRegistry(
            health=config.health, scrape=config.scrape, clock=self.clock,
            static_models={w.url: w.model for w in config.workers.static if w.model}, kv=self.kv)
        self.scraper = Scraper(
            interval_s=config.scrape.interval_s, timeout_s=config.scrape.timeout_s, fetch=self.upstream.get,
            publish=self.workers.report_scrape,
            on_failure=self._on_scrape_failure)
        self.health = HealthChecker(config.health, probe=self.upstream.probe, report=self._on_probe,
                                    urls=self.workers.urls)
        # API keys and the per-client rate limit guard both public ports (proxy/security.py).
        self.api_keys = load_api_keys(config.security, os.environ)
        self.tls = ServingTls(config.tls)  # the serving ports' certificate (loaded here: a bad file fails the start)
        upstream_key = os.environ.get(config.security.upstream_api_key_env, "").strip() or None
        # Requests held for a prefill in progress: released by our own first tokens and by peers'.
        holds = Holds(self.clock)
        self.peers = PeerSync(config.routing, self.policy, self.metrics, key=_peer_key(config.routing, os.environ),
                              prefill_ended=holds.release, clock=self.clock)
        # routing.dp_ranks: where each prompt head went among a worker's ranks, ours and the peers'
        rank_book = RankBook()
        self.peers.on_rank = lambda worker, route, rank: rank_book.put(worker, affinity_key(route), rank)
        # GET /diagnosis, diagnosis gauges, NVML sampler: fed by every finished request and snapshot.
        self.diagnosis = DiagnosisService(config.diagnose, self.clock, snapshot_interval_s=config.scrape.interval_s)
        self.diagnosis.diagnoser.dp_ranks = config.routing.dp_ranks
        if self.peers.enabled:
            if config.diagnose.fleet_view:  # every replica's window holds the fleet's requests
                self.peers.on_record = self._peer_record
                self.diagnosis.share = self.peers.share
            # what it misses: the requests of peers that tell it none
            self.diagnosis.diagnoser.peer_requests = self.peers.decisions_since
        # radixgate_routing_available_cached_tokens_total: the diagnosis's fleet-wide cache model, live.
        reuse = AvailableReuse(lambda: fleet_kv_tokens(self.workers.snapshots()), self.metrics.count_available)
        self.pipeline = Pipeline(
            config=config, clock=self.clock, registry=self.workers, admission=self.admission,
            policy=self.policy, upstream=self.upstream, metrics=self.metrics,
            request_log=RequestLogger(enabled=config.telemetry.log_requests,
                                      log_prompts=config.telemetry.log_prompts),
            observers=[self.diagnosis.observe, reuse.observe],
            # a proxy that names no peers takes no routing state from outside
            # the KV events check their streams against the prompts the engines prefilled
            route_listeners=[*([self.peers] if self.peers.enabled else []), *([self.kv] if self.kv.enabled else [])],
            upstream_authorization=functools.partial(
                upstream_authorization, upstream_key=upstream_key, own_keys_checked=bool(self.api_keys)),
            holds=holds, tokenizer=_tokenizer(config.routing), rank_book=rank_book)
        # Each request's stages as spans over OTLP (telemetry.otlp_traces_endpoint; the otel extra).
        self.tracer = _tracer(config, self.clock, self.rng)
        if self.tracer is not None:
            self.pipeline.trace_begin = self.tracer.begin
            self.pipeline.observers.append(self.tracer.record)
        self._wire()
        self.public_app = build_public_app(config, self.pipeline, self.upstream, self.ready,
                                           authorized=http_authorized(self.api_keys))
        lim = config.limits
        self.rate_limiter = (RateLimiter(lim.rate_limit_rps, lim.rate_limit_burst, lim.rate_limit_clients)
                             if lim.rate_limit_rps > 0 else None)
        self.connections = ConnectionGate(_fit_file_descriptors(config))
        guard_http_app(self.public_app, keys=self.api_keys, limiter=self.rate_limiter, clock=self.clock,
                       reject=self.pipeline.reject)
        self.admin_app = build_admin_app(self.pipeline, self.upstream, self.membership)
        if self.peers.enabled:
            self.add_admin_route("GET", PEER_PATH, self.peers.handle)
        self.workers.on_publish.append(self.diagnosis.windows.observe)
        self.add_admin_route("GET", "/diagnosis", self.diagnosis.handle)
        self.add_admin_route("GET", "/diagnosis/tail", self.diagnosis.handle_tail)
        WorkersApi(self.membership, self.workers, self.metrics, key=load_admin_key(config.security, os.environ),
                   loopback=is_loopback(config.server.admin_host)).add_routes(self.admin_app)
        attach_diagnosis(self.metrics.registry, self.diagnosis.current)
        # The keys file and the certificate, re-read when they change and on SIGHUP (cli.serve).
        keys_file = [config.security.api_keys_file] if config.security.api_keys_file else []
        self.rotation = Rotation(
            [Watched("api_keys", keys_file, lambda: self.api_keys.replace(load_api_keys(config.security, os.environ))),
             Watched("tls", self.tls.files, self.tls.reload)],
            interval_s=config.security.reload_interval_s, clock=self.clock, metrics=self.metrics)
        self.http_port = 0
        self.admin_port = 0
        self.grpc_port = 0
        self.draining = False
        self._runners: list[web.AppRunner] = []
        self._listeners: list[GatedListener] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._grpc: _Frontend | None = None

    def _wire(self) -> None:
        w, m = self.workers, self.metrics
        w.in_flight = self.admission.core.outstanding
        w.on_publish.append(self.admission.update_workers)
        w.on_change.append(self.policy.on_worker_change)
        w.on_join.append(lambda url: self.scraper.set_workers(frozenset(w.urls())))
        w.on_join.append(self.health.probe_soon)  # a new worker takes requests once a probe passed
        w.on_leave.append(lambda url: self.scraper.set_workers(frozenset(w.urls())))
        w.on_leave.append(self.upstream.forget)
        w.on_join.append(m.know_worker)
        w.on_leave.append(m.forget_worker)
        if self.kv.enabled:
            w.on_join.append(lambda url: self.kv.sync(w.urls()))
            w.on_leave.append(lambda url: self.kv.sync(w.urls()))
            # With endpoint "auto" a worker's endpoints come with its first /get_server_info.
            w.on_publish.append(lambda snaps: self.kv.sync(w.urls()))
            m.attach_kv_events(self.kv.subscribers)
        if self.peers.enabled:
            m.attach_peer_load(self.peers.peer_in_flight)
        if isinstance(self.policy, ExplainsModel):
            m.attach_routing_model(self.policy.model_terms)
        w.on_generation.append(lambda url, reason: m.inc(m.worker_restarts, url, worker=url))
        m.attach_state(_State(self.workers, self.admission))
        estimate = self.pipeline.token_estimate
        m.attach_prompt_bytes_per_token(lambda: {k: v.bytes_per_token for k, v in estimate.snapshot().items()})

    def _peer_record(self, record: RequestRecord) -> None:
        """A peer's finished request: into our diagnosis if it names a worker of ours (peers name
        workers by the same URLs; another's would read as a worker we do not have)."""
        if record.worker in self.workers:
            self.diagnosis.record_peer(record)
        else:
            self.metrics.inc(self.metrics.peer_received, "unknown_worker")

    def _on_scrape_failure(self, url: str) -> None:
        if url in self.workers:  # as for probes: a scrape that ends after its worker left
            self.metrics.inc(self.metrics.scrape_failures, url, worker=url)

    def _on_probe(self, url: str, ok: bool) -> None:
        if not ok and url in self.workers:  # a probe that ends after its worker left counts nowhere
            self.metrics.inc(self.metrics.health_probe_failures, url, worker=url)
        self.workers.report_probe(url, ok)

    def add_admin_route(self, method: str, path: str,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> None:
        """Add an admin endpoint (e.g. GET /diagnosis); call before ``start()``."""
        self.admin_app.router.add_route(method, path, handler)

    def ready(self) -> bool:
        return not self.draining and any(s.healthy for s in self.workers.published())

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        # Follow the source in its own task and only *wait* for the first set here: cancelling a
        # pending anext() would close the source's generator, ending discovery for good.
        first_set = asyncio.Event()
        self._spawn(self._follow(first_set))
        try:
            await asyncio.wait_for(first_set.wait(), FIRST_MEMBERSHIP_TIMEOUT_S)
        except TimeoutError:
            log.warning("no worker set from the source yet; serving without workers")
        first_round: list[Coroutine[Any, Any, None]] = []
        if cfg.health.interval_s > 0:
            first_round.append(self.health.probe_all())
        if cfg.scrape.interval_s > 0:
            first_round.append(self.scraper.poll_all())
        await asyncio.gather(*first_round)
        self._spawn(self.health.run())
        self._spawn(self.scraper.run())
        self._spawn(self.rotation.run())
        await self.diagnosis.start()
        self.admin_port = await self._serve(self.admin_app, cfg.server.admin_host, cfg.server.admin_port, tls=False)
        await self.peers.start(self.admin_port)
        self.http_port = await self._serve(self.public_app, cfg.server.host, cfg.server.port, tls=True,
                                           gate=self.connections)
        if cfg.server.grpc_port:
            from proxy.frontends.grpc import GrpcFrontend

            # API key, per-client rate limit and unparseable messages → INVALID_ARGUMENT (proxy/security.py).
            guard = GrpcGuard(keys=self.api_keys, limiter=self.rate_limiter, clock=self.clock,
                              reject=self.pipeline.reject)
            grpc = self._grpc = GrpcFrontend(cfg, self.pipeline, snapshots=self.workers.snapshots, ready=self.ready,
                                             guard=guard, diagnosis=self.diagnosis.document, tls=self.tls)
            self.workers.on_publish.append(grpc.on_publish)  # readiness may have changed
            self.grpc_port = await grpc.start()
        log.info("radixgate serving http=%s admin=%s grpc=%s policy=%s workers=%s", self.http_port,
                 self.admin_port, self.grpc_port or "-", self.policy.name, self.workers.urls())

    async def _follow(self, first_set: asyncio.Event) -> None:
        async for urls in self.source.watch():
            self.workers.set_members(self.membership.from_source(urls))
            first_set.set()

    async def _serve(self, app: web.Application, host: str, port: int, *, tls: bool,
                     gate: ConnectionGate | None = None) -> int:
        ssl_context = self.tls.context if tls else None
        options: dict[str, Any] = {"access_log": None}
        if gate is not None:  # the public port: limits.* apply to its connections
            options.update(handler_options(self.config.limits))
        runner = web.AppRunner(app, handler_cancellation=True,
                               shutdown_timeout=CLOSE_AFTER_DRAIN_S, **options)
        await runner.setup()
        self._runners.append(runner)
        if gate is not None:
            listener = await serve_gated(runner, host, port, gate=gate, options=options, ssl_context=ssl_context,
                                         tls_handshake_timeout_s=self.config.limits.tls_handshake_timeout_s)
            self._listeners.append(listener)
            return listener.port
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
        await site.start()
        return int(runner.addresses[0][1])

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    async def stop(self, grace_s: float | None = None) -> None:
        """Drain: refuse new requests, give in-flight ones ``grace_s`` to finish, then close."""
        grace = self.config.server.drain_grace_s if grace_s is None else grace_s
        self.draining = True
        if self._grpc is not None:
            self._grpc.begin_drain()  # gRPC health NOT_SERVING now, not after the drain
        self.admission.begin_shutdown()
        drain_started = self.clock.now()
        if not await self.pipeline.drained(grace):
            log.warning("drain: %d requests still running after %.1f s", self.pipeline.active, grace)
            # Streams end with an explicit error event, never a bare cut; give them a moment to send it.
            if self.pipeline.cut_streams(ShuttingDown("radixgate is shutting down: the drain grace period ended")):
                await self.pipeline.drained(1.0)
        if self._grpc is not None:
            # What is left of the grace lets drained calls send their last message and status.
            with contextlib.suppress(ValueError):
                self.workers.on_publish.remove(self._grpc.on_publish)
            await self._grpc.stop(max(0.0, grace - (self.clock.now() - drain_started)))
        await self.peers.stop()  # its WebSockets would hold the admin server's shutdown
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._runners.clear()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.diagnosis.stop()
        await self.kv.close()
        await self.upstream.close()
        if self.tracer is not None:  # the last spans out (the export thread blocks: off the loop)
            await asyncio.get_running_loop().run_in_executor(None, self.tracer.shutdown)


def _tracer(config: Config, clock: Clock, rng: random.Random) -> RequestTracer | None:
    if not config.telemetry.otlp_traces_endpoint:
        return None
    try:
        from proxy.telemetry.tracing import RequestTracer  # the otel extra: imported only when asked for
    except ImportError:
        raise ConfigError("telemetry.otlp_traces_endpoint: needs the otel extra (pip install 'radixgate[otel]')") from None
    return RequestTracer(config.telemetry, clock=clock, rng=rng)


def _tokenizer(routing: RoutingConfig) -> PromptTokenizer | None:
    if not routing.tokenizer:
        return None
    try:
        return PromptTokenizer(routing.tokenizer)
    except TokenizerUnavailable as e:
        raise ConfigError(str(e)) from None


def _peer_key(routing: RoutingConfig, environ: Mapping[str, str]) -> str | None:
    """The replicas' shared key from ``routing.peer_key_env``; a named but empty variable is an error."""
    if not routing.peer_key_env:
        return None
    key = environ.get(routing.peer_key_env, "").strip()
    if not key:
        raise ConfigError(f"routing.peer_key_env: environment variable {routing.peer_key_env!r} is unset or empty")
    return key


class _State:
    """What the scrape-time metric collector reads (``metrics.StateProvider``)."""

    def __init__(self, workers: WorkerRegistry, admission: Admission) -> None:
        self._workers, self._admission = workers, admission

    def worker_snapshots(self) -> Sequence[WorkerSnapshot]:
        return self._workers.snapshots()

    def worker_ejected(self, url: str) -> bool:
        return self._workers.ejected(url)

    def worker_snapshot_age(self, url: str) -> float | None:
        return self._workers.snapshot_age(url)

    def admission_queue_depth(self) -> int:
        return self._admission.core.snapshot().queue_depth

    def admission_limits(self) -> dict[str, int]:
        return self._admission.limits()


def _fit_file_descriptors(config: Config) -> int:
    """Raise the soft RLIMIT_NOFILE for the connections the config allows; the gate's limit that
    fits (``limits.plan_file_descriptors``)."""
    import resource

    configured = config.limits.max_connections
    # Discovered fleets are not known yet: assume 8 workers' pools.
    workers = len(config.workers.static) if config.discovery.kind == "static" else 8
    upstream = config.upstream.max_connections_per_worker * max(1, workers)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    plan = plan_file_descriptors(configured, upstream, soft,
                                 -1 if hard == resource.RLIM_INFINITY else hard)
    if plan.soft > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (plan.soft, hard))
        except (OSError, ValueError) as e:
            log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, plan.soft, e)
            plan = plan_file_descriptors(configured, upstream, soft, soft)
    if plan.max_connections != configured:
        log.warning("limits.max_connections %d lowered to %d: RLIMIT_NOFILE hard limit %s leaves room for no "
                    "more beside %d pooled worker connections", configured, plan.max_connections, hard, upstream)
    return plan.max_connections
