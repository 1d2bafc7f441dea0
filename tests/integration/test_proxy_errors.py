"""Each error has a defined status and a body in the caller's dialect (against real simulated workers)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, base

PROMPT = "Summarise the following document. " * 10


def is_sglang_error(body: dict[str, object], status: int) -> bool:
    err = body["error"]
    return isinstance(err, dict) and err["code"] == status and bool(err["message"]) and "param" not in err


def is_openai_error(body: dict[str, object], status: int) -> bool:
    err = body["error"]
    return isinstance(err, dict) and err["code"] == status and "type" in err and "param" in err


async def test_malformed_json_is_400_in_the_sglang_dialect(harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls)
    async with client.post(base(app) + "/generate", data=b'{"text": "unterminated',
                           headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        assert is_sglang_error(await r.json(), 400)


async def test_missing_prompt_is_400_in_the_openai_dialect(harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls)
    async with client.post(base(app) + "/v1/completions", json={"model": "x", "max_tokens": 3}) as r:
        assert r.status == 400
        body = await r.json()
    assert is_openai_error(body, 400) and "prompt" in body["error"]["message"]


async def test_body_over_the_limit_is_413(harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_body_bytes": 2000})
    async with client.post(base(app) + "/generate", json={"text": "x" * 5000}) as r:
        assert r.status == 413
        assert is_sglang_error(await r.json(), 413)


async def test_unknown_model_is_404(harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls)
    chat = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
    async with client.post(base(app) + "/v1/chat/completions", json=chat) as r:
        assert r.status == 404
        assert is_openai_error(await r.json(), 404)


async def test_no_healthy_worker_is_503_with_retry_after(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_fail_health=True)])
    app = await harness.proxy(fleet.urls, **{"health.fail_threshold": 1})
    async with client.post(base(app) + "/generate", json={"text": PROMPT}) as r:
        assert r.status == 503
        assert int(r.headers["Retry-After"]) >= 1
        assert is_sglang_error(await r.json(), 503)


async def test_worker_dying_mid_stream_ends_with_an_error_event_and_done(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_die_after_tokens=4)])
    app = await harness.proxy(fleet.urls)
    body = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 50}}
    async with client.post(base(app) + "/generate", json=body) as r:
        assert r.status == 200
        raw = await r.text()  # a clean close: reading to the end raises nothing
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][len("data: "):])["error"]
    assert error["code"] == 502 and error["message"]
    tokens = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert 1 <= len(tokens) <= 4 and all("output_ids" in t for t in tokens)


async def test_upstream_timeout_is_504(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, fault_hang_before_first_token=True)])
    app = await harness.proxy(fleet.urls, **{"upstream.first_byte_timeout_s": 0.3, "health.interval_s": 0})
    body = {"model": "", "prompt": PROMPT, "stream": True, "max_tokens": 4}
    async with client.post(base(app) + "/v1/completions", json=body) as r:
        assert r.status == 504
        assert is_openai_error(await r.json(), 504)


async def test_admission_full_is_429_with_retry_after(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0)])
    app = await harness.proxy(fleet.urls, **{"admission.per_worker_limit": 1, "admission.queue_size": 0})
    long = {"text": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": 2000}}
    async with client.post(base(app) + "/generate", json=long) as holder:
        assert holder.status == 200
        await holder.content.readuntil(b"\n\n")  # the slot is now held
        async with client.post(base(app) + "/generate", json={"text": PROMPT}) as r:
            assert r.status == 429
            assert int(r.headers["Retry-After"]) >= 1
            assert is_sglang_error(await r.json(), 429)
        holder.close()


async def test_queued_request_waits_for_a_slot_instead_of_failing(harness: Harness,
                                                                  client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, **{"admission.per_worker_limit": 1, "admission.queue_size": 64})
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8}}

    async def one() -> int:
        async with client.post(base(app) + "/generate", json=body) as r:
            await r.read()
            return r.status

    assert await asyncio.gather(*(one() for _ in range(12))) == [200] * 12


async def test_an_unknown_endpoint_or_method_is_an_openai_error_not_aiohttps_text(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls)
    async with client.post(base(app) + "/v1/no_such_endpoint", json={"model": "x", "input": "hi"}) as r:
        assert r.status == 404 and r.content_type == "application/json"
        body = await r.json()
    assert is_openai_error(body, 404) and "/v1/no_such_endpoint" in body["error"]["message"]
    async with client.get(base(app) + "/generate") as r:
        assert r.status == 405 and r.headers["Allow"] == "POST, PUT"
        assert is_openai_error(await r.json(), 405)
    async with client.get(base(app) + "/v1/models") as r:  # the routes that exist are untouched
        assert r.status == 200
