"""The Anthropic Messages API through a real radixgate in front of simulated SGLang workers, with
Anthropic's own SDK (sync and async): created whole and streamed, the token counters equal the
workers' own, token counts answered by a worker, and errors (the proxy's and the workers') in
the shape the SDK turns into its exception classes — mid-stream too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import anthropic
import pytest

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.fixtures.broken_worker import CLOSE, BrokenWorker, chunk, sse_head
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.test_openai_sdk import MODES, _tokens_match_worker
from tests.integration.test_usage_accounting import MODEL, _samples

SYSTEM = "You answer questions about prefix caches in serving engines, in one line. " * 6
QUESTION = [{"role": "user", "content": "What does a radix tree hold?"}]


async def _start(harness: Harness) -> tuple[App, str]:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    return await harness.proxy(fleet.urls), fleet.urls[0]


async def _call(mode: str, url: str, use: Callable[[Any], Any]) -> Any:
    """``use(client)`` with a sync client (in a thread) or an async one (awaited)."""
    if mode == "sync":
        def run() -> Any:
            with anthropic.Anthropic(base_url=url, api_key="none", max_retries=0) as c:
                return use(c)
        return await asyncio.to_thread(run)
    async with anthropic.AsyncAnthropic(base_url=url, api_key="none", max_retries=0) as ac:
        return await use(ac)


@pytest.mark.parametrize("mode", MODES)
async def test_create_whole(harness: Harness, client: aiohttp.ClientSession, mode: str) -> None:
    app, worker = await _start(harness)
    got = await _call(mode, base(app), lambda c: c.messages.create(model=MODEL, system=SYSTEM, messages=QUESTION,
                                                                   max_tokens=8))
    assert got.type == "message" and got.role == "assistant" and got.content[0].text
    assert got.stop_reason == "max_tokens" and got.usage.output_tokens == 8 and got.usage.input_tokens > 100
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
async def test_create_streamed(harness: Harness, client: aiohttp.ClientSession, mode: str) -> None:
    app, worker = await _start(harness)
    if mode == "sync":
        def use(c: Any) -> Any:
            with c.messages.stream(model=MODEL, system=SYSTEM, messages=QUESTION, max_tokens=6) as s:
                return "".join(s.text_stream), s.get_final_message()
    else:
        async def use(c: Any) -> Any:  # type: ignore[misc]
            async with c.messages.stream(model=MODEL, system=SYSTEM, messages=QUESTION, max_tokens=6) as s:
                return "".join([t async for t in s.text_stream]), await s.get_final_message()
    text, final = await _call(mode, base(app), use)
    assert text and text == final.content[0].text
    assert final.usage.output_tokens == 6 and final.stop_reason == "max_tokens"
    await _tokens_match_worker(client, app, worker)


async def test_count_tokens_is_the_workers_and_agrees_with_the_prompt(harness: Harness) -> None:
    app, _ = await _start(harness)
    counted = await _call("async", base(app), lambda c: c.messages.count_tokens(model=MODEL, system=SYSTEM,
                                                                                messages=QUESTION))
    made = await _call("async", base(app), lambda c: c.messages.create(model=MODEL, system=SYSTEM, messages=QUESTION,
                                                                       max_tokens=2))
    assert counted.input_tokens == made.usage.input_tokens > 0


async def test_errors_reach_the_sdk_as_its_own_exceptions(harness: Harness) -> None:
    app, _ = await _start(harness)
    with pytest.raises(anthropic.NotFoundError):  # no worker serves the model: the proxy's 404
        await _call("async", base(app), lambda c: c.messages.create(model="nobody-serves-this", messages=QUESTION,
                                                                    max_tokens=2))
    with pytest.raises(anthropic.BadRequestError) as e:  # max_tokens 0: refused before routing
        await _call("sync", base(app), lambda c: c.messages.create(model=MODEL, messages=QUESTION, max_tokens=0))
    assert "max_tokens" in str(e.value)


async def test_a_worker_failing_mid_stream_ends_it_with_an_error_the_sdk_raises(harness: Harness) -> None:
    """A worker that starts a message, sends a token and drops the connection."""
    events = [b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","type":"message",'
              b'"role":"assistant","model":"m","content":[],"usage":{"input_tokens":1,"output_tokens":0}}}\n\n',
              b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
              b'"content_block":{"type":"text","text":""}}\n\n',
              b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
              b'"delta":{"type":"text_delta","text":"half"}}\n\n']
    async with BrokenWorker.running() as worker:
        worker.on("/v1/messages", [sse_head(), *(chunk(e) for e in events), CLOSE])
        app = await harness.proxy([worker.url])

        async def use(c: Any) -> Any:
            async with c.messages.stream(model="m", messages=QUESTION, max_tokens=4) as s:
                return [t async for t in s.text_stream]
        with pytest.raises(anthropic.APIStatusError) as e:
            await _call("async", base(app), use)
        assert "closed the stream" in str(e.value) or "broke" in str(e.value)


async def test_a_client_leaving_a_message_stream_aborts_it_by_the_connection_not_by_rid(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """SGLang's Anthropic endpoint drops the rid, so /abort_request would miss: the proxy closes the
    worker's connection instead, and the worker aborts the request it was generating."""
    fleet = await harness.fleet([SimConfig(time_scale=1.0, enable_metrics=True)])
    app = await harness.proxy(fleet.urls)
    body = {"model": MODEL, "max_tokens": 100_000, "stream": True, "messages": QUESTION}
    async with client.post(base(app) + "/v1/messages", json=body) as r:
        assert r.status == 200
        while b"content_block_delta" not in await r.content.readany():
            pass  # generating: now leave

    async def aborted_by_the_worker() -> bool:
        return (await _samples(client, fleet.urls[0])).get("sglang:num_aborted_requests_total", 0.0) == 1
    await eventually(aborted_by_the_worker, timeout_s=10.0, what="the worker aborted the abandoned stream")
    assert (await _samples(client, admin(app))).get("radixgate_upstream_aborts_total", 0.0) == 0


async def test_an_x_api_key_reaches_a_keyed_worker_as_its_bearer(harness: Harness,
                                                                 client: aiohttp.ClientSession) -> None:
    """Where the proxy checks no keys of its own, the caller's credential is the worker's: Anthropic's
    API documents ``x-api-key`` (curl, older SDKs; the current SDK sends a bearer), SGLang's
    --api-key checks the bearer."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST, api_key="worker-key")])
    app = await harness.proxy(fleet.urls)
    body = {"model": MODEL, "max_tokens": 2, "messages": QUESTION}
    async with client.post(base(app) + "/v1/messages", json=body, headers={"x-api-key": "worker-key"}) as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["usage"]["output_tokens"] == 2
    async with client.post(base(app) + "/v1/messages", json=body, headers={"x-api-key": "wrong"}) as r:
        assert r.status == 401  # the worker's own verdict, relayed
    # The current SDK's bearer passes through as it is.
    got = await _call("async", base(app), lambda c: c.with_options(api_key="worker-key").messages.create(
        model=MODEL, messages=QUESTION, max_tokens=2))
    assert got.usage.output_tokens == 2
