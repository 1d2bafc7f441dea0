"""radixgate.v1 over a real grpc.aio channel → real proxy App → real simulated SGLang workers."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest

from proxy._proto.radixgate.v1 import admin_pb2, admin_pb2_grpc
from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.integration.conftest import FAST, Harness, admin, eventually

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


async def start(harness: Harness, configs: list[SimConfig] | None = None, **overrides: object) -> tuple[Fleet, App]:
    fleet = await harness.fleet(configs)
    app = await harness.proxy(fleet.urls, server__grpc_port=-1, **overrides)
    assert app.grpc_port > 0
    return fleet, app


@pytest.fixture
async def channel_factory() -> AsyncIterator[list[grpc.aio.Channel]]:
    opened: list[grpc.aio.Channel] = []
    yield opened
    for ch in opened:
        await ch.close()


def open_channel(opened: list[grpc.aio.Channel], app: App) -> grpc.aio.Channel:
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    opened.append(ch)
    return ch


def text_request(text: str = "the quick brown fox jumps over the lazy dog", **sampling: object) -> pb.GenerateRequest:
    params = pb.SamplingParams(max_new_tokens=8, ignore_eos=True)
    for k, v in sampling.items():
        setattr(params, k, v)
    return pb.GenerateRequest(model=MODEL, text=text, sampling=params)


async def metrics_text(app: App) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{admin(app)}/metrics") as r:
        return await r.text()


async def settled(app: App, name: str, value: float, **labels: str) -> str:
    """/metrics once ``name{labels}`` reached ``value`` (the exchange records just after the call ends)."""

    async def reached() -> bool:
        return sample(await metrics_text(app), name, **labels) == value

    await eventually(reached, timeout_s=5, what=f"{name}{labels} == {value}")
    return await metrics_text(app)


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text, 0 when absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_generate_streams_text_deltas_then_a_final_chunk_with_tokens_worker_and_timings(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    fleet, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    chunks = [c async for c in stub.Generate(text_request(max_new_tokens=6), timeout=10)]
    *deltas, last = chunks
    assert all(not c.HasField("final") for c in deltas) and last.HasField("final")
    assert all(c.token_count > 0 for c in deltas)
    assert sum(c.token_count for c in chunks) == 6
    assert "".join(c.text for c in chunks).strip()
    final = last.final
    assert final.finish_reason == "length"
    assert final.completion_tokens == 6 and final.prompt_tokens > 0
    assert final.worker in fleet.urls and final.request_id
    t = final.timings
    assert t.HasField("ttft_s") and t.HasField("e2e_s") and 0 < t.ttft_s <= t.e2e_s
    assert t.HasField("upstream_ttfb_s") and t.HasField("admission_wait_s")


async def test_unary_returns_the_same_text_a_stream_would_in_one_message(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    _, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    req = text_request(max_new_tokens=5)
    chunks = [c async for c in stub.Generate(req, timeout=10)]
    unary = await stub.GenerateUnary(req, timeout=10)
    assert unary.text == "".join(c.text for c in chunks) and unary.text
    assert unary.final.completion_tokens == 5 and unary.final.finish_reason == "length"
    # The unary form asked the worker for one whole answer (as HTTP's non-stream does): no first token.
    assert chunks[-1].final.timings.HasField("ttft_s") and not unary.final.timings.HasField("ttft_s")
    assert unary.final.timings.e2e_s > 0


async def test_a_repeated_prompt_reports_cached_tokens_in_the_final_chunk(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    _, app = await start(harness, [SimConfig(time_scale=FAST)])
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    req = text_request(" ".join(f"word{i}" for i in range(200)), max_new_tokens=2)
    first = await stub.GenerateUnary(req, timeout=10)
    second = await stub.GenerateUnary(req, timeout=10)
    assert first.final.cached_tokens < second.final.cached_tokens
    assert second.final.cached_tokens > 0


async def test_token_ids_and_chat_prompts_are_served(harness: Harness, channel_factory: list[grpc.aio.Channel]) -> None:
    _, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    ids = await stub.GenerateUnary(pb.GenerateRequest(
        input_ids=pb.TokenIds(ids=list(range(1, 40))), sampling=pb.SamplingParams(max_new_tokens=3)), timeout=10)
    assert ids.final.prompt_tokens == 39 and ids.final.completion_tokens == 3
    chat = pb.GenerateRequest(
        model=MODEL,
        chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="say something")]),
        sampling=pb.SamplingParams(max_new_tokens=4, ignore_eos=True))
    chunks = [c async for c in stub.Generate(chat, timeout=10)]
    assert "".join(c.text for c in chunks)
    assert chunks[-1].final.completion_tokens == 4 and chunks[-1].final.finish_reason == "length"
    assert sum(c.token_count for c in chunks) == 4


@pytest.mark.parametrize(
    "bad",
    [
        pb.GenerateRequest(model=MODEL),
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(top_p=2.0)),
        pb.GenerateRequest(text="x", sampling=pb.SamplingParams(extra_json="not json")),
    ],
)
async def test_bad_arguments_give_invalid_argument_with_a_readable_message(
    harness: Harness, channel_factory: list[grpc.aio.Channel], bad: pb.GenerateRequest
) -> None:
    _, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    for call in (stub.GenerateUnary(bad, timeout=5), _drain(stub.Generate(bad, timeout=5))):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert ":" in (info.value.details() or "")
    text = await metrics_text(app)
    assert sample(text, "radixgate_errors_total", frontend="grpc", cause="bad_request") == 2


async def _drain(call: grpc.aio.UnaryStreamCall) -> list[pb.GenerateResponse]:  # type: ignore[type-arg]
    return [c async for c in call]


async def test_a_request_the_worker_refuses_maps_to_invalid_argument(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    _, app = await start(harness, [SimConfig(time_scale=FAST, max_total_tokens=64)])
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GenerateUnary(text_request(" ".join(["w"] * 100), max_new_tokens=4), timeout=10)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "KV tokens" in (info.value.details() or "")


async def test_an_unknown_model_is_not_found(harness: Harness, channel_factory: list[grpc.aio.Channel]) -> None:
    _, app = await start(harness)
    await eventually(lambda: _models_known(app), what="models scraped")
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GenerateUnary(pb.GenerateRequest(model="no-such-model", text="hi"), timeout=5)
    assert info.value.code() is grpc.StatusCode.NOT_FOUND
    assert "no-such-model" in (info.value.details() or "")


async def _models_known(app: App) -> bool:
    return bool(app.pipeline.models())


async def test_no_healthy_worker_is_unavailable(harness: Harness, channel_factory: list[grpc.aio.Channel]) -> None:
    fleet, app = await start(harness, [SimConfig(time_scale=FAST)])
    await fleet.workers[0].stop()
    await eventually(lambda: _not_ready(app), what="worker marked down")
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.GenerateUnary(text_request(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "healthy" in (info.value.details() or "")
    assert ("retry-after", "1") in tuple(info.value.trailing_metadata() or ())


async def _not_ready(app: App) -> bool:
    return not app.ready()


async def _idle(fleet: Fleet) -> bool:
    return not any(w.engine.scheduler.has_work() for w in fleet.workers)


async def test_a_cancelled_stream_aborts_the_upstream_request_and_frees_the_worker(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    # Real time: a long generation that is certainly still running when the client cancels.
    fleet, app = await start(harness, [SimConfig(time_scale=1.0)])
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    call = stub.Generate(text_request(max_new_tokens=4000), timeout=30)
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and first.token_count > 0
    assert fleet.workers[0].engine.scheduler.has_work()
    call.cancel()
    await eventually(lambda: _idle(fleet), timeout_s=5, what="worker freed")
    text = await settled(app, "radixgate_errors_total", 1, frontend="grpc", cause="client_disconnect")
    assert sample(text, "radixgate_upstream_aborts_total", worker=fleet.urls[0]) == 1


async def test_a_cancelled_unary_call_aborts_the_upstream_request_and_frees_the_worker(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    # A whole answer sends nothing back until the end: the call is cancelled mid-generation.
    fleet, app = await start(harness, [SimConfig(time_scale=1.0)])
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    call = stub.GenerateUnary(text_request(max_new_tokens=4000), timeout=30)
    await eventually(lambda: _busy(fleet), timeout_s=5, what="generation started")
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await eventually(lambda: _idle(fleet), timeout_s=5, what="worker freed")
    text = await settled(app, "radixgate_errors_total", 1, frontend="grpc", cause="client_disconnect")
    assert sample(text, "radixgate_upstream_aborts_total", worker=fleet.urls[0]) == 1


async def _busy(fleet: Fleet) -> bool:
    return not await _idle(fleet)


async def test_a_deadline_shorter_than_the_generation_is_deadline_exceeded_and_aborts_upstream(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    fleet, app = await start(harness, [SimConfig(time_scale=1.0)])
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    for call in (stub.GenerateUnary(text_request(max_new_tokens=4000), timeout=1.0),
                 _drain(stub.Generate(text_request(max_new_tokens=4000), timeout=1.0))):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: _idle(fleet), timeout_s=5, what="worker freed")
    await settled(app, "radixgate_upstream_aborts_total", 2, worker=fleet.urls[0])


async def test_metrics_count_grpc_requests_under_frontend_grpc(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    _, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    await stub.GenerateUnary(text_request(max_new_tokens=2), timeout=10)
    await _drain(stub.Generate(text_request(max_new_tokens=2), timeout=10))
    text = await settled(app, "radixgate_requests_succeeded_total", 2, frontend="grpc")
    assert sample(text, "radixgate_requests_accepted_total", frontend="grpc") == 2
    assert sample(text, "radixgate_requests_accepted_total", frontend="http") == 0
    assert 'frontend="grpc"' in text and "radixgate_ttft_seconds_bucket" in text


async def test_admin_lists_workers_and_returns_the_diagnosis_as_json(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    fleet, app = await start(harness)
    ch = open_channel(channel_factory, app)
    admin_stub = admin_pb2_grpc.AdminStub(ch)
    await eventually(lambda: _scraped(admin_stub), what="engine state scraped")
    listed = await admin_stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5)
    assert sorted(w.url for w in listed.workers) == sorted(fleet.urls)
    assert all(w.healthy and w.HasField("max_running_requests") for w in listed.workers)
    diagnosis = await admin_stub.GetDiagnosis(admin_pb2.GetDiagnosisRequest(), timeout=10)
    doc = json.loads(diagnosis.json)
    async with aiohttp.ClientSession() as s, s.get(f"{admin(app)}/diagnosis") as r:
        http_doc = await r.json()
    assert isinstance(doc, dict) and set(doc) == set(http_doc)


async def test_admin_diagnosis_over_a_window_counts_only_its_requests(
    harness: Harness, channel_factory: list[grpc.aio.Channel]
) -> None:
    _, app = await start(harness, **{"diagnose.refresh_s": 0, "diagnose.window_s": 60})
    ch = open_channel(channel_factory, app)
    admin_stub, stub = admin_pb2_grpc.AdminStub(ch), pb_grpc.GenerationStub(ch)
    for _ in range(3):
        await stub.GenerateUnary(text_request(max_new_tokens=2), timeout=10)
    await asyncio.sleep(1.5)
    started = asyncio.get_running_loop().time()
    for _ in range(2):
        await stub.GenerateUnary(text_request(max_new_tokens=2), timeout=10)
    span = asyncio.get_running_loop().time() - started + 0.5  # the last two, none of the first three
    recent = json.loads((await admin_stub.GetDiagnosis(admin_pb2.GetDiagnosisRequest(window_s=span), timeout=10)).json)
    whole = json.loads((await admin_stub.GetDiagnosis(admin_pb2.GetDiagnosisRequest(), timeout=10)).json)
    assert recent["window"]["requests"] == 2 and whole["window"]["requests"] == 5
    for bad in (0.0, -1.0, math.nan, 1e9):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await admin_stub.GetDiagnosis(admin_pb2.GetDiagnosisRequest(window_s=bad), timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "window_s" in (err.value.details() or "")


async def _scraped(stub: admin_pb2_grpc.AdminStub) -> bool:
    listed = await stub.ListWorkers(admin_pb2.ListWorkersRequest(), timeout=5)
    return bool(listed.workers) and all(w.HasField("running") for w in listed.workers)


async def test_concurrent_streams_all_complete(harness: Harness, channel_factory: list[grpc.aio.Channel]) -> None:
    _, app = await start(harness)
    stub = pb_grpc.GenerationStub(open_channel(channel_factory, app))
    results = await asyncio.gather(*(_drain(stub.Generate(text_request(f"prompt {i} " * 20, max_new_tokens=4),
                                                          timeout=20)) for i in range(16)))
    assert all(r[-1].final.completion_tokens == 4 for r in results)
