"""The exchange's state machine on a scripted transport (``pipeline/transport.py``) and a manual
clock: retries, holds, a client leaving mid-stream and deadlines, with no socket and no real wait.

Everything but the transport is the product's own (config, registry, admission, policy, metrics);
the integration tests run the same paths against real workers on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.admission import Admission
from proxy.clock import ManualClock
from proxy.config import Config, load
from proxy.errors import NoHealthyWorker, ShuttingDown
from proxy.frontends.http import parse_request
from proxy.pipeline import CompletedRequest, Exchange, Phase, Pipeline
from proxy.request import Dialect
from proxy.routing.base import Decision, IgnoresFeedback, RouteRequest, WorkerSnapshot
from proxy.routing.registry import build_policy
from proxy.telemetry.metrics import Metrics
from proxy.workers.http1 import UpstreamClosed
from proxy.workers.registry import WorkerRegistry

WORKERS = ("http://a:1", "http://b:1")


class ScriptedAnswer:
    """An answer whose body arrives as the test pushes it (``push``; ``end`` closes it)."""

    def __init__(self, status: int = 200, content_type: str = "text/event-stream", body: bytes = b"") -> None:
        self.status, self.content_type, self.body = status, content_type, body
        self.headers: Mapping[str, str] = {}
        self._pieces: asyncio.Queue[bytes] = asyncio.Queue()
        self._exc: BaseException | None = None
        self.closed = self.released = False

    def push(self, data: bytes) -> None:
        self._pieces.put_nowait(data)

    def end(self) -> None:
        self._pieces.put_nowait(b"")

    async def read(self) -> bytes:
        return self.body

    async def readany(self) -> bytes:
        if self._exc is None:
            data = await self._pieces.get()
            if self._exc is None:
                return data
        raise self._exc

    def fail(self, exc: BaseException) -> None:
        if self._exc is None:
            self._exc = exc
            self._pieces.put_nowait(b"")  # wake a waiting read

    def close(self) -> None:
        self.closed = True
        self.fail(UpstreamClosed("closed by the proxy"))

    def release(self) -> None:
        self.released = True


Step = Callable[[str], Awaitable[ScriptedAnswer]]


class ScriptedTransport:
    """Each ``post`` runs the next step of the script with the worker's URL."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.posts: list[str] = []
        self.aborts: list[tuple[str, str]] = []

    async def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> ScriptedAnswer:
        self.posts.append(url)
        return await self.steps.pop(0)(url)

    async def probe(self, url: str, path: str, timeout_s: float) -> int:
        return 200

    def abort(self, url: str, rid: str) -> None:
        self.aborts.append((url, rid))


def refuse(url: str) -> Awaitable[ScriptedAnswer]:
    async def step() -> ScriptedAnswer:
        raise ConnectionRefusedError(f"{url} refused")
    return step()


def answer(reply: ScriptedAnswer) -> Step:
    async def step(url: str) -> ScriptedAnswer:
        return reply
    return step


def never(url: str) -> Awaitable[ScriptedAnswer]:
    return asyncio.get_running_loop().create_future()  # the worker never sends its head


def json_answer(text: str = "hi") -> ScriptedAnswer:
    doc = {"text": text, "meta_info": {"prompt_tokens": 3, "completion_tokens": 1, "cached_tokens": 0,
                                       "finish_reason": {"type": "stop"}}}
    return ScriptedAnswer(content_type="application/json", body=json.dumps(doc).encode())


def event(text: str) -> bytes:
    return b"data: " + json.dumps({"text": text, "meta_info": {"prompt_tokens": 3, "completion_tokens": 1}}).encode() \
        + b"\n\n"


class HoldOnce(IgnoresFeedback):
    """Holds the first request for prefill "k", then routes to the first worker."""

    name = "hold_once"

    def __init__(self) -> None:
        self.held = 0
        self.peer_prefilled: list[Hashable] = []

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        if not request.held:
            self.held += 1
            return Decision(workers[0].url, "hold", after="k")
        return Decision(workers[0].url, "first")

    def on_peer_prefilled(self, worker: str, key: Hashable) -> None:
        self.peer_prefilled.append(key)

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        pass


def build(transport: ScriptedTransport, clock: ManualClock, *, policy: Any = None,
          **overrides: Any) -> tuple[Pipeline, list[CompletedRequest]]:
    cfg: Config = load(env={}, overrides={"health.interval_s": 0, "scrape.interval_s": 0,
                                          "routing.policy": "round_robin", **overrides})
    registry = WorkerRegistry(health=cfg.health, scrape=cfg.scrape, clock=clock)
    registry.set_members(WORKERS)
    admission = Admission(cfg.admission, clock)
    admission.update_workers(registry.snapshots())
    registry.in_flight = admission.core.outstanding
    done: list[CompletedRequest] = []
    pipeline = Pipeline(config=cfg, clock=clock, registry=registry, admission=admission,
                        policy=policy or build_policy(cfg.routing, rng=random.Random(0)), upstream=transport,
                        metrics=Metrics(CollectorRegistry()), observers=[done.append])
    return pipeline, done


def request(pipeline: Pipeline, *, stream: bool) -> Exchange:
    body = json.dumps({"text": "hello", "stream": stream}).encode()
    return pipeline.exchange(parse_request(Dialect.SGLANG, body, {}, pipeline.config))


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_refused_connection_retries_on_the_other_worker() -> None:
    transport = ScriptedTransport(refuse, answer(json_answer("from the second")))
    pipeline, done = build(transport, ManualClock())
    async with request(pipeline, stream=False) as ex:
        assert ex.phase is Phase.ANSWERED and ex.status == 200 and b"from the second" in ex.body
    assert transport.posts[0] != transport.posts[1] and ex.worker == transport.posts[1]
    assert [(d.outcome, d.retries) for d in done] == [("ok", 1)]
    assert pipeline.metrics.registry.get_sample_value(
        "radixgate_upstream_failures_total", {"worker": transport.posts[0], "cause": "connect_error"}) == 1


async def test_every_worker_refusing_is_a_503_after_the_retries() -> None:
    transport = ScriptedTransport(refuse, refuse)
    pipeline, done = build(transport, ManualClock())
    with pytest.raises(NoHealthyWorker):
        async with request(pipeline, stream=False):
            pass
    assert len(transport.posts) == 2 and done[0].status == 503 and done[0].cause == "no_healthy_worker"


async def test_a_held_request_is_routed_once_its_prefill_is_released() -> None:
    policy = HoldOnce()
    transport = ScriptedTransport(answer(json_answer()))
    pipeline, done = build(transport, ManualClock(), policy=policy, **{"routing.hold_max_s": 5.0})
    ex = request(pipeline, stream=False)
    task = asyncio.ensure_future(ex.__aenter__())
    await turns()
    assert ex.phase is Phase.HOLDING and transport.posts == []
    pipeline.prefilled("k")
    await task
    await ex.__aexit__(None, None, None)
    assert transport.posts == [WORKERS[0]] and policy.peer_prefilled == []
    assert done[0].outcome == "ok"


async def test_a_hold_ends_when_the_manual_clock_passes_hold_max_s() -> None:
    clock = ManualClock()
    policy = HoldOnce()
    transport = ScriptedTransport(answer(json_answer()))
    pipeline, done = build(transport, clock, policy=policy, **{"routing.hold_max_s": 2.0})
    ex = request(pipeline, stream=False)
    task = asyncio.ensure_future(ex.__aenter__())
    await turns()
    clock.advance(1.9)
    await turns()
    assert ex.phase is Phase.HOLDING  # no real time passes: only the clock moves the hold on
    clock.advance(0.1)
    await task
    await ex.__aexit__(None, None, None)
    assert policy.peer_prefilled == ["k"]  # a hold that timed out stops everyone holding for it
    assert done[0].timing.prefix_hold == pytest.approx(2.0)


async def test_a_silent_worker_is_left_for_another_at_the_first_byte_timeout_on_the_clock() -> None:
    clock = ManualClock()
    stream = ScriptedAnswer()
    stream.push(event("hi"))
    stream.push(b"data: [DONE]\n\n")
    transport = ScriptedTransport(never, answer(stream))
    pipeline, done = build(transport, clock, **{"upstream.first_byte_timeout_s": 3.0})
    ex = request(pipeline, stream=True)
    task = asyncio.ensure_future(ex.__aenter__())
    await turns()
    assert ex.phase is Phase.ATTEMPTING and len(transport.posts) == 1
    clock.advance(3.0)
    await task
    assert ex.phase is Phase.RELAYING and ex.retries == 1
    assert transport.aborts == [(transport.posts[0], ex.rid)]  # the silent one may be generating
    chunks = [c async for c in ex.chunks()]
    await ex.__aexit__(None, None, None)
    assert chunks[-1].endswith(b"data: [DONE]\n\n") and done[0].outcome == "ok"


async def test_a_stream_ends_with_an_error_event_at_its_deadline_on_the_clock() -> None:
    clock = ManualClock()
    stream = ScriptedAnswer()
    stream.push(event("first"))
    transport = ScriptedTransport(answer(stream))
    pipeline, done = build(transport, clock, **{"upstream.total_timeout_s": 10.0})
    async with request(pipeline, stream=True) as ex:
        chunks = ex.chunks()
        assert b"first" in await anext(chunks)
        waiting = asyncio.ensure_future(anext(chunks))
        await turns()
        assert not waiting.done()
        clock.advance(10.0)
        last = await waiting
    assert b"deadline" in last and ex.error is not None
    assert (done[0].outcome, done[0].cause) == ("error", "upstream_timeout")


async def test_a_client_leaving_mid_stream_closes_the_answer_and_aborts_the_generation() -> None:
    stream = ScriptedAnswer()
    stream.push(event("one"))
    transport = ScriptedTransport(answer(stream))
    pipeline, done = build(transport, ManualClock())
    async with request(pipeline, stream=True) as ex:
        async for _ in ex.chunks():
            break  # the client went away after its first chunk
    assert stream.closed and stream.released
    assert transport.aborts == [(ex.worker, ex.rid)]
    assert (done[0].outcome, done[0].cause, done[0].status) == ("cancelled", "client_disconnect", 499)
    assert pipeline.active == 0 and pipeline.admission.core.snapshot().outstanding == {}


async def test_the_drain_cuts_a_relaying_stream_with_its_own_error_not_the_workers() -> None:
    stream = ScriptedAnswer()
    stream.push(event("one"))
    transport = ScriptedTransport(answer(stream))
    pipeline, done = build(transport, ManualClock())
    async with request(pipeline, stream=True) as ex:
        chunks = ex.chunks()
        await anext(chunks)
        assert pipeline.cut_streams(ShuttingDown("radixgate is shutting down")) == 1
        last = await anext(chunks)
        assert b"shutting down" in last and ex.last_chunk
    assert (done[0].outcome, done[0].cause) == ("error", "shutting_down")
    failures = pipeline.metrics.registry.get_sample_value(
        "radixgate_upstream_failures_total", {"worker": ex.worker or "", "cause": "stream_broken"})
    assert failures is None  # the proxy ended it: not the worker's failure
    assert pipeline.cut_streams(ShuttingDown("again")) == 0
