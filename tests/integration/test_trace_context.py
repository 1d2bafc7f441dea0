"""The caller's W3C trace context reaches the worker (proxy/tracecontext.py), over HTTP and gRPC;
a malformed one, and every other header the caller sent, does not. A recording worker on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator

import aiohttp
import grpc
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.telemetry.logging import REQUEST_LOGGER
from tests.fixtures.broken_worker import BrokenWorker
from tests.integration.conftest import Harness, base

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
BODY = {"text": "Name three rivers.", "sampling_params": {"max_new_tokens": 3}}
QUIET = {"health.interval_s": 0, "scrape.interval_s": 0}


@contextlib.asynccontextmanager
async def worker() -> AsyncIterator[BrokenWorker]:
    async with BrokenWorker.running() as w:
        yield w


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@contextlib.contextmanager
def request_log() -> Iterator[Lines]:
    log, handler = logging.getLogger(REQUEST_LOGGER), Lines()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def generation_heads(w: BrokenWorker) -> list[dict[str, str]]:
    return [h for path, h in w.heads if path in ("/generate", "/v1/chat/completions")]


async def test_a_valid_trace_context_is_forwarded_and_nothing_else_of_the_callers(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    async with worker() as w:
        app = await harness.proxy([w.url], **QUIET)
        headers = {"traceparent": PARENT, "tracestate": STATE, "x-custom": "secret", "cookie": "a=b",
                   "baggage": "user=alice"}
        with request_log() as log:
            async with client.post(f"{base(app)}/generate", json=BODY, headers=headers) as r:
                assert r.status == 200
            chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
            async with client.post(f"{base(app)}/v1/chat/completions", json=chat,
                                   headers={"traceparent": PARENT}) as r:
                assert r.status == 200
            async with client.post(f"{base(app)}/generate", json=BODY) as r:
                assert r.status == 200
        # The log line names the trace, to find the engine's spans from a request's line.
        assert [line["trace_id"] for line in log.lines] == [PARENT.split("-")[1]] * 2 + [None]
        first, second, third = generation_heads(w)
        assert "traceparent" not in third
        assert first["traceparent"] == PARENT and first["tracestate"] == STATE
        assert not {"x-custom", "cookie", "baggage"} & set(first)
        assert second["traceparent"] == PARENT and "tracestate" not in second


@pytest.mark.parametrize("parent", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper-case hex
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  # version 00 is 55 characters
    "garbage",
])
async def test_a_malformed_traceparent_is_dropped_with_its_tracestate(
    harness: Harness, client: aiohttp.ClientSession, parent: str
) -> None:
    async with worker() as w:
        app = await harness.proxy([w.url], **QUIET)
        async with client.post(f"{base(app)}/generate", json=BODY,
                               headers={"traceparent": parent, "tracestate": STATE}) as r:
            assert r.status == 200  # a bad trace header is the caller's tracing problem, not a bad request
        (seen,) = generation_heads(w)
        assert "traceparent" not in seen and "tracestate" not in seen


async def test_an_oversized_tracestate_is_dropped_alone(harness: Harness, client: aiohttp.ClientSession) -> None:
    async with worker() as w:
        app = await harness.proxy([w.url], **QUIET)
        async with client.post(f"{base(app)}/generate", json=BODY,
                               headers={"traceparent": PARENT, "tracestate": "k=" + "v" * 600}) as r:
            assert r.status == 200
        (seen,) = generation_heads(w)
        assert seen["traceparent"] == PARENT and "tracestate" not in seen


async def test_grpc_metadata_carries_the_trace_context_to_the_worker(harness: Harness) -> None:
    async with worker() as w:
        app = await harness.proxy([w.url], server__grpc_port=-1, **QUIET)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GenerationStub(channel)
            req = pb.GenerateRequest(text="Name three rivers.", sampling=pb.SamplingParams(max_new_tokens=3))
            await stub.GenerateUnary(req, timeout=10, metadata=(("traceparent", PARENT), ("tracestate", STATE),
                                                                 ("x-custom", "secret")))
        (seen,) = generation_heads(w)
        assert seen["traceparent"] == PARENT and seen["tracestate"] == STATE and "x-custom" not in seen
