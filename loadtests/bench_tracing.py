"""What a request's spans cost the proxy's event loop (``telemetry.otlp_traces_endpoint``).

    .venv/bin/python -m loadtests.bench_tracing [--reps 20000]

Prints p50 / p99 of ``RequestTracer.begin`` (the sampling decision and radixgate's span id, at the
request's start) and ``RequestTracer.record`` (its five spans built and queued, at its end), with
the SDK's batch processor in front of an exporter that drops what it is given, so only what runs
on the event loop is timed (the export runs in the SDK's own thread). Untraced, neither runs. One
process on whatever machine runs it (the figure quoted in docs/reliability.md says which).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from proxy.clock import MonotonicClock
from proxy.config import TelemetryConfig
from proxy.records import CompletedRequest
from proxy.routing.base import Decision
from proxy.telemetry.tracing import RequestTracer
from proxy.timing import RequestTiming
from proxy.tracecontext import TraceContext


class Dropped(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def finished(trace: TraceContext | None, now: float) -> CompletedRequest:
    timing = RequestTiming(received=now, admitted=now + 1e-4, dispatched=now + 3e-4, upstream_headers=now + 0.01,
                           first_byte=now + 0.05, first_token=now + 0.05, last_token=now + 0.9, done=now + 0.9,
                           token_gaps=[0.01] * 64, prompt_tokens=3000, cached_tokens=2900, completion_tokens=64)
    return CompletedRequest(
        rid="r", frontend="http", dialect="chat", stream=True, worker="http://10.0.0.1:30000", status=200,
        outcome="ok", cause=None, retries=0, policy="ttft", decision=Decision("http://10.0.0.1:30000", "match"),
        route=None, admission="admitted", admission_wait=1e-4, timing=timing, finish_reason="stop", trace=trace)


def pcts(xs: list[float]) -> str:
    xs = sorted(x * 1e6 for x in xs)
    return f"p50 {statistics.median(xs):7.1f} us   p99 {xs[min(len(xs) - 1, int(0.99 * len(xs)))]:7.1f} us"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20_000)
    args = p.parse_args()
    clock = MonotonicClock()
    exporter = Dropped()
    tracer = RequestTracer(TelemetryConfig(otlp_traces_endpoint="http://127.0.0.1:1/v1/traces"), clock=clock,
                           rng=random.Random(1), exporter=exporter)
    caller = TraceContext("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    begins, records = [], []
    for i in range(args.reps):
        t0 = time.perf_counter()
        ctx = tracer.begin(caller if i % 2 else None)
        t1 = time.perf_counter()
        tracer.record(finished(ctx, clock.now()))
        t2 = time.perf_counter()
        begins.append(t1 - t0)
        records.append(t2 - t1)
        if i % 1000 == 999:
            tracer.flush()  # keep the bounded queue from dropping: every span is built and exported
    tracer.shutdown()
    print(f"requests {args.reps}, spans exported {exporter.spans} (5 a request)")
    print(f"begin  (sampling + span id)   {pcts(begins)}")
    print(f"record (5 spans built, queued) {pcts(records)}")


if __name__ == "__main__":
    main()
