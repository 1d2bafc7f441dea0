"""The openai SDK (sync and async clients) against a real radixgate in front of simulated workers.

One test per endpoint and mode: completions and chat, streamed and not, with and without
``stream_options.include_usage``; models list and retrieve. The sync client blocks, so it runs in
a thread while the proxy and the workers serve on this test's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import openai
import pytest

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.test_usage_accounting import MODEL, _samples

T = TypeVar("T")
PROMPT = "The same long system prompt for every request, so the cache has something to hit. " * 8


async def _start(harness: Harness) -> tuple[App, str]:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    return await harness.proxy(fleet.urls), fleet.urls[0]


async def _call(mode: str, app: App, use: Callable[[Any], Any]) -> Any:
    """``use(client)`` with a sync client (in a thread) or an async one (awaited)."""
    url = base(app) + "/v1"
    if mode == "sync":
        def run() -> Any:
            with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as c:
                return use(c)
        return await asyncio.to_thread(run)
    async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as ac:
        return await use(ac)


async def _drain(stream: Any) -> list[Any]:
    if hasattr(stream, "__aiter__"):
        return [chunk async for chunk in stream]
    return list(stream)


def _sync_or_async(mode: str, make: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A ``use`` that also reads a stream to its end, in the client's own style."""
    if mode == "sync":
        def sync_use(c: Any) -> Any:
            out = make(c)
            return list(out) if isinstance(out, openai.Stream) else out
        return sync_use

    async def async_use(c: Any) -> Any:
        out = await make(c)
        return await _drain(out) if isinstance(out, openai.AsyncStream) else out
    return async_use


async def _tokens_match_worker(client: aiohttp.ClientSession, app: App, worker: str) -> None:
    async def equal() -> bool:
        w, p = await _samples(client, worker), await _samples(client, admin(app))
        return (w.get("sglang:prompt_tokens_total", 0) > 0
                and p.get("radixgate_prompt_tokens_total") == w["sglang:prompt_tokens_total"]
                and p.get("radixgate_cached_tokens_total", 0.0) == w.get("sglang:cached_tokens_total", 0.0))
    await eventually(equal, timeout_s=5.0, what="radixgate's token counters equal the worker's")


MODES = ["sync", "async"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("usage", [False, True], ids=["sdk_default", "include_usage"])
async def test_chat_stream(harness: Harness, client: aiohttp.ClientSession, mode: str, usage: bool) -> None:
    app, worker = await _start(harness)
    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
    chunks = await _call(mode, app, _sync_or_async(mode, lambda c: c.chat.completions.create(
        model=MODEL, stream=True, max_tokens=5, messages=[{"role": "user", "content": PROMPT}], **options)))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    with_usage = [ch for ch in chunks if ch.usage is not None]
    if usage:
        assert len(with_usage) == 1 and with_usage[0].choices == [] and with_usage[0].usage.completion_tokens == 5
    else:
        assert with_usage == [], "the SDK did not ask for usage: no usage chunk"
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("usage", [False, True], ids=["sdk_default", "include_usage"])
async def test_completions_stream(harness: Harness, client: aiohttp.ClientSession, mode: str, usage: bool) -> None:
    app, worker = await _start(harness)
    options: dict[str, Any] = {"stream_options": {"include_usage": True}} if usage else {}
    chunks = await _call(mode, app, _sync_or_async(mode, lambda c: c.completions.create(
        model=MODEL, stream=True, max_tokens=4, prompt=PROMPT, **options)))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices)
    with_usage = [ch for ch in chunks if ch.usage is not None]
    assert len(with_usage) == (1 if usage else 0)
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
async def test_chat(harness: Harness, client: aiohttp.ClientSession, mode: str) -> None:
    app, worker = await _start(harness)
    out = await _call(mode, app, _sync_or_async(mode, lambda c: c.chat.completions.create(
        model=MODEL, max_tokens=3, messages=[{"role": "user", "content": PROMPT}])))
    assert out.choices[0].message.content and out.usage.completion_tokens == 3
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
async def test_completions(harness: Harness, client: aiohttp.ClientSession, mode: str) -> None:
    app, worker = await _start(harness)
    out = await _call(mode, app, _sync_or_async(mode, lambda c: c.completions.create(
        model=MODEL, max_tokens=3, prompt=PROMPT)))
    assert out.choices[0].text and out.usage.prompt_tokens > 0
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
async def test_models_list_and_retrieve(harness: Harness, mode: str) -> None:
    app, _ = await _start(harness)

    def listed(c: Any) -> Any:
        return c.models.list()

    async def alisted(c: Any) -> Any:
        return [m async for m in c.models.list()]

    models = await _call(mode, app, listed if mode == "sync" else alisted)
    cards = list(models)
    assert [m.id for m in cards] == [MODEL]
    assert isinstance(cards[0].created, int) and cards[0].created > 1_600_000_000
    one = await _call(mode, app, lambda c: c.models.retrieve(MODEL))
    assert one.id == MODEL and one.object == "model" and one.created == cards[0].created
    with pytest.raises(openai.NotFoundError):
        await _call(mode, app, lambda c: c.models.retrieve("no-such-model"))


async def test_a_model_id_with_a_slash_is_retrieved(harness: Harness) -> None:
    name = "meta-llama/Llama-3.1-8B-Instruct"
    fleet = await harness.fleet([SimConfig(time_scale=FAST, served_model_name=name)])
    app = await harness.proxy(fleet.urls)
    await eventually(lambda: _served(app, name), what="the worker's model learned")
    one = await _call("async", app, lambda c: c.models.retrieve(name))
    assert one.id == name


async def _served(app: App, name: str) -> bool:
    return name in app.pipeline.models()
