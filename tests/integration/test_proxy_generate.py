"""The public API through a real proxy in front of real simulated SGLang workers."""

from __future__ import annotations

import json

import aiohttp

from proxy.sim.config import DEFAULT_MODEL_NAME, SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually, status_of

PROMPT = "You are a careful assistant. " * 20


def sse_payloads(raw: str) -> list[str]:
    return [line[len("data: "):] for line in raw.split("\n\n") if line.startswith("data: ")]


async def test_non_stream_generate_is_relayed_with_a_rid_we_set(harness: Harness,
                                                                client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 5}}
    async with client.post(base(app) + "/generate", json=body) as r:
        assert r.status == 200
        out = await r.json()
    assert len(out["output_ids"]) == 5
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 5 and meta["prompt_tokens"] > 0
    assert len(meta["id"]) == 32  # no rid given: the proxy set one (uuid4 hex)


async def test_a_client_rid_reaches_the_worker_unchanged(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    body = {"text": PROMPT, "rid": "client-rid-1", "sampling_params": {"max_new_tokens": 2}}
    async with client.post(base(app) + "/generate", json=body) as r:
        assert (await r.json())["meta_info"]["id"] == "client-rid-1"


async def test_stream_generate_relays_every_event_then_done(harness: Harness,
                                                            client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 6}}
    async with client.post(base(app) + "/generate", json=body) as r:
        assert r.status == 200 and r.content_type == "text/event-stream"
        raw = await r.text()
    payloads = sse_payloads(raw)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4, 5, 6]  # cumulative, as SGLang sends
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


async def test_openai_completions_and_chat_stream_and_non_stream(harness: Harness,
                                                                 client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_cache_report=True)])
    app = await harness.proxy(fleet.urls)
    url = base(app)
    async with client.post(url + "/v1/completions",
                           json={"model": DEFAULT_MODEL_NAME, "prompt": PROMPT, "max_tokens": 4}) as r:
        body = await r.json()
        assert r.status == 200 and body["usage"]["completion_tokens"] == 4
    chat = {"model": DEFAULT_MODEL_NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}}
    async with client.post(url + "/v1/chat/completions", json=chat) as r:
        payloads = sse_payloads(await r.text())
    assert payloads[-1] == "[DONE]"
    usage = json.loads(payloads[-2])["usage"]
    assert usage["completion_tokens"] == 4
    text = "".join((json.loads(p)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                   for p in payloads[:-1])
    assert text


async def test_models_is_the_union_of_the_workers_models(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, served_model_name="model-a"),
                                 SimConfig(time_scale=FAST, served_model_name="model-b")])
    app = await harness.proxy(fleet.urls)
    async with client.get(base(app) + "/v1/models") as r:
        ids = sorted(m["id"] for m in (await r.json())["data"])
    assert ids == ["model-a", "model-b"]
    # And a request for one model only goes to the worker serving it.
    for _ in range(4):
        async with client.post(base(app) + "/v1/completions",
                               json={"model": "model-b", "prompt": "hi", "max_tokens": 1}) as r:
            assert r.status == 200 and (await r.json())["model"] == "model-b"


async def test_health_ready_and_workers_endpoints(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, max_running_requests=8)])
    app = await harness.proxy(fleet.urls)
    async with client.get(base(app) + "/health") as r:
        assert r.status == 200
    async with client.get(base(app) + "/ready") as r:
        assert r.status == 200
    async with client.get(admin(app) + "/workers") as r:
        info = await r.json()
    (w,) = info["workers"]
    assert w["url"] == fleet.urls[0] and w["healthy"] and w["in_flight"] == 0
    assert w["engine"]["max_running_requests"] == 8 and w["admission_limit"] == 8
    assert w["models"] == [DEFAULT_MODEL_NAME]
    await fleet.workers[0].stop()

    async def not_ready() -> bool:
        return await status_of(client, base(app) + "/ready") == 503

    await eventually(not_ready, what="/ready answering 503 once the only worker is down")
    assert await status_of(client, base(app) + "/health") == 200  # the proxy itself is still up
