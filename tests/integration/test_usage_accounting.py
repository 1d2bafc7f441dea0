"""Token counters equal the usage the workers reported, whatever the dialect and stream mode.

An OpenAI stream without ``stream_options.include_usage`` (the openai SDK's default) is the case
that used to count nothing: the proxy now asks the worker for usage on every OpenAI stream, counts
it, and drops the usage chunk from what a caller who did not ask for it receives.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import grpc
from prometheus_client.parser import text_string_to_metric_families

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually

MODEL = SimConfig().served_model_name


async def _samples(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with client.get(url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def _usage_chunks(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("choices") == [] or e.get("usage")]


async def _post(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bytes]:
    """(the stream's JSON events, or [the body]) and the raw bytes the client received."""
    async with client.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
    if not body.get("stream"):
        return [json.loads(raw)], raw
    events = [json.loads(line[6:]) for line in raw.decode().split("\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    assert raw.endswith(b"data: [DONE]\n\n")
    return events, raw


async def _counters_match(client: aiohttp.ClientSession, worker: str, app_admin: str) -> None:
    async def equal() -> bool:
        w, p = await _samples(client, worker), await _samples(client, app_admin)
        return (w.get("sglang:num_requests_total", 0) > 0
                and p.get("radixgate_prompt_tokens_total") == w.get("sglang:prompt_tokens_total")
                and p.get("radixgate_cached_tokens_total", 0.0) == w.get("sglang:cached_tokens_total", 0.0)
                and p.get("radixgate_completion_tokens_total") == w.get("sglang:generation_tokens_total")
                # routing's hit-rate counters: every request here has a cache report
                and p.get("radixgate_routing_prompt_tokens_total") == w.get("sglang:prompt_tokens_total")
                and p.get("radixgate_routing_reported_cached_tokens_total", 0.0)
                == w.get("sglang:cached_tokens_total", 0.0))

    try:
        await eventually(equal, timeout_s=5.0, what="the proxy's token counters equal the worker's")
    except AssertionError:
        w, p = await _samples(client, worker), await _samples(client, app_admin)
        raise AssertionError(
            f"worker: prompt {w.get('sglang:prompt_tokens_total')} cached {w.get('sglang:cached_tokens_total')} "
            f"completion {w.get('sglang:generation_tokens_total')}; proxy: prompt "
            f"{p.get('radixgate_prompt_tokens_total')} cached {p.get('radixgate_cached_tokens_total')} "
            f"completion {p.get('radixgate_completion_tokens_total')}") from None


async def test_an_openai_stream_without_include_usage_is_counted_and_shows_no_usage_chunk(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    app = await harness.proxy(fleet.urls)
    shared = "You are a careful assistant. " * 20  # a shared prefix: the second request hits the cache
    for i in range(2):
        events, _ = await _post(client, base(app) + "/v1/chat/completions", {
            "model": MODEL, "stream": True, "max_tokens": 5,
            "messages": [{"role": "system", "content": shared}, {"role": "user", "content": f"question {i}"}]})
        assert events and _usage_chunks(events) == [], "the caller did not ask for usage"
        assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in events)
        events, _ = await _post(client, base(app) + "/v1/completions", {
            "model": MODEL, "stream": True, "max_tokens": 4, "prompt": shared + f"item {i}"})
        assert events and _usage_chunks(events) == []
        # Asked not to include usage, explicitly: still counted, still not shown.
        events, _ = await _post(client, base(app) + "/v1/completions", {
            "model": MODEL, "stream": True, "max_tokens": 3, "prompt": shared + f"other {i}",
            "stream_options": {"include_usage": False}})
        assert _usage_chunks(events) == []
    await _counters_match(client, fleet.urls[0], admin(app))
    p = await _samples(client, admin(app))
    assert p["radixgate_prompt_tokens_total"] > 0 and p["radixgate_cached_tokens_total"] > 0
    # Routing's tokens-per-byte learning saw every text prompt's reported count.
    async with client.get(admin(app) + "/workers") as r:
        learned = (await r.json())["prompt_bytes_per_token"]["models"]
    assert learned[MODEL]["reports"] == 6


async def test_token_counters_equal_the_workers_usage_in_every_dialect_and_mode(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    app = await harness.proxy(fleet.urls)
    prefix = "A shared system prompt that the cache keeps. " * 10
    reported: list[dict[str, Any]] = []  # usage as the client saw it, where it asked
    for stream in (False, True):
        for usage in (False, True) if stream else (False,):
            options = {"stream_options": {"include_usage": True}} if usage else {}
            events, _ = await _post(client, base(app) + "/v1/chat/completions", {
                "model": MODEL, "stream": stream, "max_tokens": 4, **options,
                "messages": [{"role": "user", "content": prefix + f"chat {stream} {usage}"}]})
            found = _usage_chunks(events) if stream else events
            assert len(found) == (1 if usage or not stream else 0)
            reported += [e["usage"] for e in found]
            events, _ = await _post(client, base(app) + "/v1/completions", {
                "model": MODEL, "stream": stream, "max_tokens": 4, "prompt": prefix + f"text {stream} {usage}",
                **options})
            found = _usage_chunks(events) if stream else events
            assert len(found) == (1 if usage or not stream else 0)
            reported += [e["usage"] for e in found]
        events, _ = await _post(client, base(app) + "/generate", {
            "text": prefix + f"native {stream}", "stream": stream, "sampling_params": {"max_new_tokens": 4}})
        assert events[-1]["meta_info"]["prompt_tokens"] > 0
    # A caller who asked for usage gets the worker's own chunk, once, with its counts.
    assert all(u["prompt_tokens"] > 0 and u["completion_tokens"] == 4 for u in reported)
    assert len(reported) == 4
    await _counters_match(client, fleet.urls[0], admin(app))


async def test_token_counters_equal_the_workers_usage_over_grpc_too(harness: Harness,
                                                                   client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    app = await harness.proxy(fleet.urls, server__grpc_port=-1)
    prefix = "A shared system prompt that the cache keeps. " * 10
    sampling = pb.SamplingParams(max_new_tokens=4)
    chat = pb.ChatMessages(messages=[pb.ChatMessage(role="user", content=prefix + "chat")])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        for request in (pb.GenerateRequest(text=prefix + "text", sampling=sampling),
                        pb.GenerateRequest(model=MODEL, chat=chat, sampling=sampling)):
            reply = await stub.GenerateUnary(request, timeout=10)
            assert reply.final.completion_tokens == 4
            finals = [m.final for m in [m async for m in stub.Generate(request, timeout=10)] if m.HasField("final")]
            assert len(finals) == 1 and finals[0].prompt_tokens > 0
    await _counters_match(client, fleet.urls[0], admin(app))
