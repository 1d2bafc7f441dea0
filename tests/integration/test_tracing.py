"""Each request's stages as OpenTelemetry spans (proxy/telemetry/tracing.py), exported over OTLP/HTTP
to a collector standing in on 127.0.0.1, the worker (a recording one) handed radixgate's span as its
parent."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import ConfigError, load
from tests.fixtures.broken_worker import BrokenWorker
from tests.integration.conftest import Harness, base

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
QUIET = {"health.interval_s": 0, "scrape.interval_s": 0}
STAGES = {"radixgate.admission", "radixgate.routing", "worker.prefill", "worker.decode"}


class Collector:
    """OTLP/HTTP's trace endpoint: every span it was sent, by name."""

    def __init__(self) -> None:
        self.spans: list[Any] = []

    async def handle(self, request: web.Request) -> web.Response:
        msg = trace_service_pb2.ExportTraceServiceRequest()
        msg.ParseFromString(await request.read())
        for resource in msg.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}["service.name"]
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append((service, span))
        return web.Response(body=trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


@contextlib.asynccontextmanager
async def collector() -> AsyncIterator[tuple[Collector, str]]:
    c = Collector()
    app = web.Application()
    app.router.add_post("/v1/traces", c.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield c, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    finally:
        await runner.cleanup()


async def flushed(app: App) -> None:
    assert app.tracer is not None
    assert await asyncio.get_running_loop().run_in_executor(None, app.tracer.flush)


def attrs(span: Any) -> dict[str, Any]:
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out


async def test_a_request_is_one_server_span_with_its_stages_and_the_worker_continues_it(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    async with BrokenWorker.running() as w, collector() as (c, endpoint):
        app = await harness.proxy([w.url], **QUIET, telemetry__otlp_traces_endpoint=endpoint,
                                  telemetry__service_name="gateway-a")
        body = {"text": "Name three rivers.", "stream": True, "sampling_params": {"max_new_tokens": 3}}
        async with client.post(f"{base(app)}/generate", json=body,
                               headers={"traceparent": f"00-{TRACE}-{CALLER_SPAN}-01", "tracestate": "k=v"}) as r:
            assert r.status == 200
            await r.read()
        await flushed(app)
        (root,) = [s for _, s in c.spans if s.name == "radixgate.request"]
        assert {svc for svc, _ in c.spans} == {"gateway-a"}
        assert root.trace_id.hex() == TRACE and root.parent_span_id.hex() == CALLER_SPAN
        assert root.kind == root.SPAN_KIND_SERVER
        a = attrs(root)
        assert a["radixgate.worker"] == w.url and a["http.response.status_code"] == 200
        assert a["radixgate.outcome"] == "ok" and a["radixgate.policy"] == "round_robin"
        assert a["gen_ai.usage.output_tokens"] >= 1
        children = {s.name: s for _, s in c.spans if s.parent_span_id == root.span_id}
        assert set(children) == STAGES
        for s in children.values():
            assert s.trace_id == root.trace_id
            assert root.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano <= root.end_time_unix_nano
        assert children["worker.prefill"].end_time_unix_nano <= children["worker.decode"].start_time_unix_nano
        # The worker was handed radixgate's span, not the caller's, with the caller's tracestate.
        (seen,) = [h for path, h in w.heads if path == "/generate"]
        assert seen["traceparent"] == f"00-{TRACE}-{root.span_id.hex()}-01" and seen["tracestate"] == "k=v"


async def test_sampling_follows_the_caller_else_the_ratio(harness: Harness, client: aiohttp.ClientSession) -> None:
    async with BrokenWorker.running() as w, collector() as (c, endpoint):
        app = await harness.proxy([w.url], **QUIET, telemetry__otlp_traces_endpoint=endpoint)
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        unsampled = f"00-{TRACE}-{CALLER_SPAN}-00"
        async with client.post(f"{base(app)}/generate", json=body, headers={"traceparent": unsampled}) as r:
            assert r.status == 200
        async with client.post(f"{base(app)}/generate", json=body) as r:  # no caller: ratio 1.0 starts a trace
            assert r.status == 200
        await flushed(app)
        roots = [s for _, s in c.spans if s.name == "radixgate.request"]
        assert len(roots) == 1 and roots[0].trace_id.hex() != TRACE and not roots[0].parent_span_id
        first, second = [h for path, h in w.heads if path == "/generate"]
        assert first["traceparent"] == unsampled  # not sampled: passed on as it came
        assert second["traceparent"] == f"00-{roots[0].trace_id.hex()}-{roots[0].span_id.hex()}-01"
        # A non-stream answer: no decode span; its worker span ends with the answer.
        names = {s.name for _, s in c.spans if s.parent_span_id == roots[0].span_id}
        assert names == STAGES - {"worker.decode"}

    async with BrokenWorker.running() as w, collector() as (c, endpoint):
        app = await harness.proxy([w.url], **QUIET, telemetry__otlp_traces_endpoint=endpoint,
                                  telemetry__trace_sample_ratio=0.0)
        async with client.post(f"{base(app)}/generate", json=body) as r:
            assert r.status == 200
        await flushed(app)
        assert c.spans == [] and "traceparent" not in w.heads[-1][1]


async def test_a_failed_request_is_an_error_span(harness: Harness, client: aiohttp.ClientSession) -> None:
    from tests.fixtures.broken_worker import http

    async with BrokenWorker.running() as w, collector() as (c, endpoint):
        w.on("/generate", http(500, b'{"error": "boom"}'))
        app = await harness.proxy([w.url], **QUIET, **{"upstream.max_retries": 0},
                                  telemetry__otlp_traces_endpoint=endpoint)
        async with client.post(f"{base(app)}/generate", json={"text": "hi"}) as r:
            assert r.status == 502
        await flushed(app)
        (root,) = [s for _, s in c.spans if s.name == "radixgate.request"]
        assert root.status.code == root.status.STATUS_CODE_ERROR
        assert attrs(root)["radixgate.cause"] == "upstream_error" and attrs(root)["http.response.status_code"] == 502


def test_bad_tracing_settings_are_config_errors_naming_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"telemetry\.otlp_traces_endpoint"):
        load(env={}, overrides={"telemetry.otlp_traces_endpoint": "otel:4318"})
    with pytest.raises(ConfigError, match=r"telemetry\.trace_sample_ratio"):
        load(env={}, overrides={"telemetry.trace_sample_ratio": 1.5})
    # Without the otel extra installed (its module hidden here), start-up names the field and the extra.
    monkeypatch.setitem(sys.modules, "proxy.telemetry.tracing", None)
    cfg = load(env={}, overrides={"telemetry.otlp_traces_endpoint": "http://127.0.0.1:4318/v1/traces"})
    with pytest.raises(ConfigError, match=r"telemetry\.otlp_traces_endpoint: needs the otel extra"):
        App(cfg, registry=CollectorRegistry())
