"""``POST /v1/score`` through a real radixgate to simulated SGLang workers (``proxy/sim/score.py``).

The scores are the worker's, passed through; the proxy counts the request and every item's prompt
tokens (the answer's usage); requests with one query go where it is cached (each item's prompt
starts with it), text or token ids; ``item_first`` (the items lead) is routed on load; a
malformed body is refused by the proxy naming the field, before any worker sees it; the summed
tokens teach routing nothing.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Harness, admin, base, eventually, post_json, ttft_fleet
from tests.integration.reliability import accounting, refused_naming, scrape, total
from tests.integration.test_usage_accounting import MODEL

QUERY = "Is the following review of a radix-tree prefix cache positive? Answer yes or no. " * 6
ITEMS = [" It keeps shared prompts once.", " It forgets everything.", " It is fine."]
LABELS = [9, 10]

PATH = "/v1/score"

async def test_the_scores_are_the_workers_and_every_item_is_counted(harness: Harness,
                                                                   client: aiohttp.ClientSession) -> None:
    app, (worker,) = await ttft_fleet(harness)
    body = {"model": MODEL, "query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "apply_softmax": True}
    status, got, _ = await post_json(client, base(app) + PATH, body)
    assert status == 200 and got["object"] == "scoring"
    _, direct, _ = await post_json(client, worker + PATH, body)
    assert got["scores"] == direct["scores"] and len(got["scores"]) == 3
    assert all(len(s) == 2 and sum(s) == pytest.approx(1.0, abs=1e-5) for s in got["scores"])
    tokens = got["usage"]["prompt_tokens"]
    assert tokens > 3 * len(QUERY.split())  # every item's prompt holds the whole query

    async def counted() -> bool:
        m = await scrape(client, admin(app))
        return (total(m, "radixgate_prompt_tokens_total") == tokens
                and accounting(m) == (1.0, 1.0, 0.0))
    await eventually(counted, timeout_s=5.0, what="one request accepted and succeeded, its items' tokens counted")
    assert app.pipeline.token_estimate.snapshot() == {}  # the query's bytes are no item's tokens
    status, raw, _ = await post_json(client, base(app) + PATH, {**body, "apply_softmax": False, "items": ITEMS[0]})
    assert status == 200 and len(raw["scores"]) == 1 and sum(raw["scores"][0]) < 1.0


@pytest.mark.parametrize("form", ["text", "ids"])
async def test_requests_with_one_query_go_where_it_is_cached(harness: Harness, client: aiohttp.ClientSession,
                                                             form: str) -> None:
    app, workers = await ttft_fleet(harness, workers=4)
    query: Any = QUERY if form == "text" else list(range(100, 400))
    for i in range(5):
        items: Any = ([f" item {i}-{k} about other things" for k in range(3)] if form == "text"
                      else [[1000 + 10 * i + k] * 20 for k in range(3)])
        status, _, _ = await post_json(client, base(app) + PATH, {"query": query, "items": items, "label_token_ids": LABELS})
        assert status == 200
    served = [total(await scrape(client, url), "sglang:num_requests_total") for url in workers]
    assert sorted(served) == [0.0, 0.0, 0.0, 15.0], served  # five requests of three items, one worker
    hits = [total(await scrape(client, url), "sglang:cache_hit_rate") for url in workers]
    assert max(hits) > 0


async def test_items_first_are_routed_on_load(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, workers = await ttft_fleet(harness, workers=2)
    for i in range(4):
        status, got, _ = await post_json(client, base(app) + PATH, {"query": QUERY, "items": [f"item {i} "], "label_token_ids": LABELS,
                                                     "item_first": True})
        assert status == 200 and len(got["scores"]) == 1
    done: list[float] = [total(await scrape(client, url), "sglang:num_requests_total") for url in workers]
    assert sum(done) == 4


@pytest.mark.parametrize(("body", "field"), [
    ({"items": ITEMS, "label_token_ids": LABELS}, "query"),
    ({"query": "", "items": ITEMS, "label_token_ids": LABELS}, "query"),
    ({"query": QUERY, "label_token_ids": LABELS}, "items"),
    ({"query": QUERY, "items": [[1, 2]], "label_token_ids": LABELS}, "items"),
    ({"query": [1, 2, 3], "items": ITEMS, "label_token_ids": LABELS}, "items"),
    ({"query": QUERY, "items": ITEMS}, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": [-1]}, "label_token_ids"),
    ({"query": QUERY, "items": ITEMS, "label_token_ids": LABELS, "item_first": "yes"}, "item_first"),
], ids=["no_query", "empty_query", "no_items", "ids_items_text_query", "text_items_ids_query", "no_labels",
        "negative_label", "item_first"])
async def test_a_malformed_body_is_refused_by_the_proxy_naming_the_field(
        harness: Harness, client: aiohttp.ClientSession, body: dict[str, Any], field: str) -> None:
    app, (worker,) = await ttft_fleet(harness)
    await refused_naming(client, base(app), "/v1/score", worker, body, field)


async def test_a_label_outside_the_vocabulary_gets_the_workers_own_400(harness: Harness,
                                                                      client: aiohttp.ClientSession) -> None:
    app, _ = await ttft_fleet(harness)
    status, got, _ = await post_json(client, base(app) + PATH, {"query": QUERY, "items": ITEMS, "label_token_ids": [10**9]})
    assert status == 400 and "vocabulary" in got["message"], got
