"""Each request's stages as OpenTelemetry spans, exported over OTLP/HTTP (``telemetry.otlp_traces_endpoint``).

The Prometheus histograms say where the p95 goes; a trace says where one slow request's time went.
One span per finished request, ``radixgate.request`` (kind SERVER: received → done), with a child
per stage the request reached, from the same marks as the stage histograms:

* ``radixgate.admission`` — received → admitted (the proxy's admission queue);
* ``radixgate.routing`` — admitted → dispatched (prefix key, policy, a prefix hold, retries);
* ``worker.prefill`` — dispatched → first token (the worker's queue and prefill, and the network),
  or → done for an answer that is not streamed;
* ``worker.decode`` — first token → last token.

Attributes: the request's rid, frontend, dialect, policy and decision branch, matched blocks, worker,
status, outcome and cause, and the token counts the worker reported (``gen_ai.usage.input_tokens``,
``output_tokens``, ``radixgate.cached_tokens``). Nothing of the prompt.

Trace context (``proxy/tracecontext.py``): a request whose caller sent one joins the caller's trace
and follows its sampling decision; one without starts a trace, sampled at
``telemetry.trace_sample_ratio``. The decision and radixgate's span id are made when the request
enters the pipeline (``begin``), so the worker is handed radixgate's span as its parent and an
engine that traces (SGLang ``--enable-trace``) nests its spans under it. Spans are built when the
request ends (``record``: the times are its marks) and leave through the SDK's batch processor, a
thread with a bounded queue (2,048 spans; beyond, spans are dropped, never the request). On the
event loop a traced request costs ~9 µs at its start and ~63 µs at its end (p50, p99 24 / 295 µs;
``python -m loadtests.bench_tracing``, this project's 2-core sandbox), against the ~0.2 ms the proxy
spends on a request untraced (docs/proxy-overhead.md): ``trace_sample_ratio`` bounds it. Needs the
``otel`` extra (``pip install 'radixgate[otel]'``).
"""

from __future__ import annotations

import random
import time
from typing import Any

from opentelemetry import trace as api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from proxy.clock import Clock
from proxy.config import TelemetryConfig
from proxy.records import CompletedRequest
from proxy.tracecontext import TraceContext

ROOT = "radixgate.request"
SAMPLED = api.TraceFlags(api.TraceFlags.SAMPLED)
OK, ERROR = api.Status(api.StatusCode.UNSET), api.StatusCode.ERROR


class RequestTracer:
    def __init__(self, cfg: TelemetryConfig, *, clock: Clock, rng: random.Random,
                 exporter: SpanExporter | None = None) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter(endpoint=cfg.otlp_traces_endpoint)
        self.ratio = cfg.trace_sample_ratio
        self._rng = rng
        # Marks are on the injected clock; spans want wall time. One offset, taken once.
        self._wall_offset = time.time() - clock.now()
        self._resource = Resource.create({"service.name": cfg.service_name})
        self._scope = InstrumentationScope("radixgate")
        # The spans are finished records (the request has ended): they go straight to the batch
        # processor, without the SDK's tracer (its context and sampling machinery cost ~10x more here).
        self._processor = BatchSpanProcessor(exporter, max_queue_size=2048)

    def begin(self, caller: TraceContext | None) -> TraceContext | None:
        """The context the worker is handed: radixgate's span when this request is sampled, else the
        caller's as it came (None without one)."""
        sampled = caller.sampled if caller is not None else self._rng.random() < self.ratio
        if not sampled:
            return caller
        span = f"{self._rng.getrandbits(64) or 1:016x}"
        if caller is None:
            return TraceContext(f"{self._rng.getrandbits(128) or 1:032x}", span, 1, own=True)
        return caller.child(span, sampled=True)

    def record(self, done: CompletedRequest) -> None:
        """The request's spans (a pipeline observer)."""
        ctx = done.trace
        if ctx is None or not ctx.own or not ctx.sampled:
            return
        t = done.timing
        trace_id = int(ctx.trace_id, 16)
        state = api.TraceState.from_header([ctx.state]) if ctx.state else None
        root = api.SpanContext(trace_id, int(ctx.span_id, 16), is_remote=False, trace_flags=SAMPLED, trace_state=state)
        parent = (api.SpanContext(trace_id, int(ctx.parent_id, 16), is_remote=True, trace_flags=SAMPLED,
                                  trace_state=state) if ctx.parent_id is not None else None)
        end = t.done if t.done is not None else t.received
        status = api.Status(ERROR, done.cause or "error") if done.outcome == "error" else OK
        emit = self._processor.on_end
        emit(self._span(ROOT, root, parent, t.received, end, _attributes(done), api.SpanKind.SERVER, status))
        stages = (("radixgate.admission", t.received, t.admitted),
                  ("radixgate.routing", t.admitted, t.dispatched),
                  ("worker.prefill", t.dispatched, t.first_token if t.first_token is not None else t.done),
                  ("worker.decode", t.first_token, t.last_token))
        for name, start, stop in stages:
            if start is None or stop is None:
                continue
            attributes = ({"radixgate.worker_queue_s": t.worker_queue_time}
                          if name == "worker.prefill" and t.worker_queue_time is not None else None)
            span = api.SpanContext(trace_id, self._rng.getrandbits(64) or 1, is_remote=False, trace_flags=SAMPLED,
                                   trace_state=state)
            emit(self._span(name, span, root, start, max(start, stop), attributes, api.SpanKind.INTERNAL, OK))

    def _span(self, name: str, context: api.SpanContext, parent: api.SpanContext | None, start: float,
              stop: float, attributes: dict[str, Any] | None, kind: api.SpanKind, status: api.Status) -> ReadableSpan:
        return ReadableSpan(name, context=context, parent=parent, resource=self._resource, attributes=attributes,
                            kind=kind, status=status, start_time=self._ns(start), end_time=self._ns(stop),
                            instrumentation_scope=self._scope)

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is queued (blocks: call it off the event loop)."""
        return bool(self._processor.force_flush(int(timeout_s * 1000)))

    def shutdown(self) -> None:
        """Flush and stop the export thread (blocks: call it off the event loop)."""
        self._processor.shutdown()  # type: ignore[no-untyped-call]  # (the SDK leaves it unannotated)

    def _ns(self, mark: float) -> int:
        return int((mark + self._wall_offset) * 1e9)


def _attributes(done: CompletedRequest) -> dict[str, Any]:
    t, decision = done.timing, done.decision
    out: dict[str, Any] = {
        "radixgate.rid": done.rid, "radixgate.frontend": done.frontend, "radixgate.dialect": done.dialect,
        "radixgate.stream": done.stream, "radixgate.policy": done.policy, "radixgate.outcome": done.outcome,
        "radixgate.retries": done.retries, "http.response.status_code": done.status,
    }
    optional = {
        "radixgate.worker": done.worker, "radixgate.cause": done.cause, "radixgate.admission": done.admission,
        "radixgate.branch": decision.branch if decision is not None else None,
        "radixgate.matched_blocks": decision.matched_blocks if decision is not None else None,
        "radixgate.prefix_hold_s": t.prefix_hold or None,
        "gen_ai.usage.input_tokens": t.prompt_tokens, "gen_ai.usage.output_tokens": t.completion_tokens,
        "radixgate.cached_tokens": t.cached_tokens, "gen_ai.response.finish_reasons": (
            [done.finish_reason] if done.finish_reason else None),
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out
