"""``POST /v1/classify`` through a real radixgate to simulated SGLang workers (``proxy/sim/classify.py``).

The classes are the worker's, passed through (``label``, ``probs``, ``num_classes`` per text); the
proxy counts the request and every text's prompt tokens; texts that share a head go where it is
cached; a malformed ``input`` is refused by the proxy naming the field, before any worker sees
it, and what only the worker checks comes back as its own 400; a stream flag is ignored as the
worker ignores it; a batch's summed tokens teach routing nothing.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Harness, admin, base, eventually, post_json, ttft_fleet
from tests.integration.reliability import accounting, refused_naming, scrape
from tests.integration.test_usage_accounting import MODEL, _samples

HEAD = "A customer writes about the delivery of an order placed three weeks ago and still missing. " * 6
TEXTS = [HEAD + "They are angry.", HEAD + "They are patient.", HEAD + "They ask for a refund."]
PATH = "/v1/classify"


async def test_the_classes_are_the_workers_and_every_text_is_counted(harness: Harness,
                                                                     client: aiohttp.ClientSession) -> None:
    app, (worker,) = await ttft_fleet(harness)
    body = {"model": MODEL, "input": TEXTS}
    status, got, ctype = await post_json(client, base(app) + PATH, body)
    assert status == 200 and ctype.startswith("application/json")
    _, direct, _ = await post_json(client, worker + PATH, body)
    assert got["object"] == "list" and got["id"].startswith("classify-")
    assert [(d["index"], d["label"], d["probs"]) for d in got["data"]] == \
        [(d["index"], d["label"], d["probs"]) for d in direct["data"]]
    assert all(d["num_classes"] == len(d["probs"]) == 2 and sum(d["probs"]) == pytest.approx(1.0, abs=1e-5)
               and d["label"] == f"LABEL_{d['probs'].index(max(d['probs']))}" for d in got["data"])
    tokens = got["usage"]["prompt_tokens"]
    assert tokens == direct["usage"]["prompt_tokens"] > 3 * len(HEAD.split())  # every text holds the head

    async def counted() -> bool:
        p = await _samples(client, admin(app))
        return (p.get("radixgate_prompt_tokens_total", 0.0) == tokens
                and accounting(await scrape(client, admin(app))) == (1.0, 1.0, 0.0))
    await eventually(counted, timeout_s=5.0, what="one request accepted and succeeded, its texts' tokens counted")
    assert app.pipeline.token_estimate.snapshot() == {}  # a batch's summed tokens are no prompt's


async def test_texts_with_one_head_go_where_it_is_cached(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, workers = await ttft_fleet(harness, workers=4)
    for i in range(6):
        status, got, _ = await post_json(client, base(app) + PATH, {"model": MODEL, "input": HEAD + f"Message number {i}."})
        assert status == 200 and len(got["data"]) == 1
    served = [(await _samples(client, url)).get("sglang:num_requests_total", 0.0) for url in workers]
    assert sorted(served) == [0.0, 0.0, 0.0, 6.0], served
    hit = [(await _samples(client, url)).get("sglang:cache_hit_rate", 0.0) for url in workers]
    assert max(hit) > 0.5, hit  # the head prefilled once, then read from the cache


async def test_a_stream_flag_is_ignored_and_token_ids_pass(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, _ = await ttft_fleet(harness)
    status, got, ctype = await post_json(client, base(app) + PATH, {"input": "one text", "stream": True})
    assert status == 200 and ctype.startswith("application/json") and len(got["data"]) == 1
    status, got, _ = await post_json(client, base(app) + PATH, {"input": [11, 12, 13, 14]})
    assert status == 200 and len(got["data"]) == 1 and got["usage"]["prompt_tokens"] == 4


@pytest.mark.parametrize(("body", "field"), [
    ({"model": MODEL}, "input"),
    ({"input": 7}, "input"),
    ({"input": ["fine", 7]}, "input"),
    ({"input": [1, -2]}, "input"),
], ids=["no_input", "number", "mixed_list", "negative_id"])
async def test_a_malformed_input_is_refused_by_the_proxy_naming_the_field(
        harness: Harness, client: aiohttp.ClientSession, body: dict[str, Any], field: str) -> None:
    app, (worker,) = await ttft_fleet(harness)
    await refused_naming(client, base(app), "/v1/classify", worker, body, field)


async def test_a_blank_text_is_the_workers_own_400(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, _ = await ttft_fleet(harness)
    status, got, _ = await post_json(client, base(app) + PATH, {"input": ["fine", "   "]})
    # SGLang's error shape, the worker's words: no proxy check reads a text's blankness
    assert status == 400 and got["object"] == "error" and "index 1" in got["message"], got
