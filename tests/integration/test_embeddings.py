"""``POST /v1/embeddings`` through a real radixgate to simulated SGLang workers (``proxy/sim/embeddings.py``).

The openai SDK (sync and async) gets the vectors the worker gives directly; the proxy counts the
request and its prompt tokens as the worker reports them; ``stream`` is ignored as the worker
ignores it (an embedding is answered whole); a malformed ``input`` is refused by the proxy with a
400 naming the field, before any worker sees it; a batch, token ids, base64 and multimodal parts
pass through.
"""

from __future__ import annotations

import asyncio
import base64
import struct
from typing import Any

import aiohttp
import openai
import pytest

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually, post_json
from tests.integration.reliability import accounting, refused_naming, scrape
from tests.integration.test_usage_accounting import MODEL, _samples

TEXTS = ["radix caches keep prefixes", "a second sentence, nothing shared", "and a third one"]

PATH = "/v1/embeddings"

async def _start(harness: Harness, workers: int = 1) -> tuple[App, list[str]]:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True) for _ in range(workers)])
    return await harness.proxy(fleet.urls), fleet.urls


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_openai_sdk_gets_the_workers_vectors_and_the_tokens_are_counted(
        harness: Harness, client: aiohttp.ClientSession, mode: str) -> None:
    app, (worker,) = await _start(harness)
    url = base(app) + "/v1"
    if mode == "sync":
        def run() -> Any:
            with openai.OpenAI(base_url=url, api_key="none", max_retries=0) as c:
                return c.embeddings.create(model=MODEL, input=TEXTS)
        got = await asyncio.to_thread(run)
    else:
        async with openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0) as ac:
            got = await ac.embeddings.create(model=MODEL, input=TEXTS)
    status, direct, _ = await post_json(client, worker + PATH, {"model": MODEL, "input": TEXTS})
    assert status == 200
    assert [d.index for d in got.data] == [0, 1, 2]
    # the SDK asks for base64 (float32) and unpacks it: the worker's floats to float32 precision
    for mine, theirs in zip(got.data, direct["data"], strict=True):
        assert mine.embedding == pytest.approx(theirs["embedding"], abs=1e-6)
    assert len({tuple(d.embedding) for d in got.data}) == 3  # three inputs, three vectors
    assert got.usage.prompt_tokens == direct["usage"]["prompt_tokens"] > 0

    async def counted() -> bool:
        # the worker served the same three prompts twice: through the proxy, and directly
        w, p = await _samples(client, worker), await _samples(client, admin(app))
        return (2 * p.get("radixgate_prompt_tokens_total", 0.0) == w.get("sglang:prompt_tokens_total", 0.0) > 0
                and accounting(await scrape(client, admin(app))) == (1.0, 1.0, 0.0))
    await eventually(counted, timeout_s=5.0, what="one request accepted and succeeded, its prompt tokens counted")


async def test_a_stream_flag_is_ignored_as_the_worker_ignores_it(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, _ = await _start(harness)
    status, body, ctype = await post_json(client, base(app) + PATH, {"model": MODEL, "input": "one text", "stream": True})
    assert status == 200 and ctype.startswith("application/json")
    assert body["object"] == "list" and len(body["data"]) == 1


@pytest.mark.parametrize("value", [
    [1, 2, 3, 4],                                        # token ids
    [[1, 2, 3], [4, 5, 6, 7]],                           # a batch of them
    [{"text": "a caption", "image": "http://example.invalid/cat.png"}],  # multimodal parts
], ids=["ids", "ids_batch", "parts"])
async def test_every_input_form_sglang_takes_passes_through(harness: Harness, client: aiohttp.ClientSession,
                                                           value: Any) -> None:
    app, _ = await _start(harness)
    status, body, _ = await post_json(client, base(app) + PATH, {"model": MODEL, "input": value})
    assert status == 200, body
    assert len(body["data"]) == (len(value) if isinstance(value[0], list | dict) else 1)


async def test_base64_and_fewer_dimensions_pass_through(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, _ = await _start(harness)
    floats = {"model": MODEL, "input": "pack me", "dimensions": 8}
    status, plain, _ = await post_json(client, base(app) + PATH, floats)
    status64, packed, _ = await post_json(client, base(app) + PATH, {**floats, "encoding_format": "base64"})
    assert status == status64 == 200
    unpacked = struct.unpack("<8f", base64.b64decode(packed["data"][0]["embedding"]))
    assert len(plain["data"][0]["embedding"]) == 8
    assert unpacked == pytest.approx(plain["data"][0]["embedding"], abs=1e-6)
    status, refused, _ = await post_json(client, base(app) + PATH, {**floats, "dimensions": 10_000})
    assert status == 400 and "dimensions" in refused["message"]  # the worker's own 400 (SGLang's shape), relayed


@pytest.mark.parametrize(("body", "field"), [
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": {"text": "x"}}, "input"),
    ({"model": MODEL, "input": []}, "input"),
    ({"model": MODEL, "input": [1, "two"]}, "input"),
    ({"model": MODEL, "input": [{"text": 7}]}, "input"),
    ({"model": MODEL, "input": [-1]}, "input"),
    ({"model": 5, "input": "x"}, "model"),
], ids=["missing", "object", "empty", "mixed", "part_not_text", "negative_id", "model"])
async def test_a_malformed_input_is_refused_by_the_proxy_naming_the_field(
        harness: Harness, client: aiohttp.ClientSession, body: dict[str, Any], field: str) -> None:
    app, (worker,) = await _start(harness)
    await refused_naming(client, base(app), "/v1/embeddings", worker, body, field)
