"""``POST /v1/rerank`` through a real radixgate to simulated SGLang workers (``proxy/sim/rerank.py``).

The ranking is the worker's, passed through (highest score first, ``top_n``, ``return_documents``);
the proxy counts the request and every pair's prompt tokens; requests with one query go where it
is cached (each pair the worker prefills starts with the query: the prefix its documents share);
a malformed body is refused by the proxy naming the field, before any worker sees it; a stream
flag is ignored as the worker ignores it; a ranking's summed tokens teach routing nothing.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import Harness, admin, base, eventually, post_json, ttft_fleet
from tests.integration.reliability import accounting, refused_naming, scrape
from tests.integration.test_usage_accounting import MODEL, _samples

QUERY = "Which of these passages says how a radix tree keeps the prefixes of many prompts? " * 6
DOCS = ["A radix tree stores shared prefixes once.", "Bread rises with yeast.", "Caches evict the least used."]
PATH = "/v1/rerank"


async def test_the_ranking_is_the_workers_and_every_pair_is_counted(harness: Harness,
                                                                    client: aiohttp.ClientSession) -> None:
    app, (worker,) = await ttft_fleet(harness)
    body = {"model": MODEL, "query": QUERY, "documents": DOCS, "return_documents": True}
    status, ranked, ctype = await post_json(client, base(app) + PATH, body)
    assert status == 200 and ctype.startswith("application/json")
    _, direct, _ = await post_json(client, worker + PATH, body)
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores, reverse=True) and sorted(r["index"] for r in ranked) == [0, 1, 2]
    assert [(r["index"], r["score"]) for r in ranked] == [(r["index"], r["score"]) for r in direct]
    assert all(r["document"] == DOCS[r["index"]] for r in ranked)
    pairs = sum(r["meta_info"]["prompt_tokens"] for r in ranked)
    assert pairs > 3 * len(QUERY.split())  # every pair holds the whole query

    async def counted() -> bool:
        p = await _samples(client, admin(app))
        return (p.get("radixgate_prompt_tokens_total", 0.0) == pairs
                and accounting(await scrape(client, admin(app))) == (1.0, 1.0, 0.0))
    await eventually(counted, timeout_s=5.0, what="one request accepted and succeeded, its pairs' tokens counted")
    status, top, _ = await post_json(client, base(app) + PATH, {"model": MODEL, "query": QUERY, "documents": DOCS, "top_n": 1})
    assert status == 200 and len(top) == 1 and top[0]["index"] == ranked[0]["index"] and "document" not in top[0]
    assert app.pipeline.token_estimate.snapshot() == {}  # the query's bytes are no pair's tokens


async def test_requests_with_one_query_go_where_it_is_cached(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, workers = await ttft_fleet(harness, workers=4)
    cached = []
    for i in range(6):
        docs = [f"document {i}-{k}: " + "words about other things " * 4 for k in range(3)]
        async with client.post(base(app) + "/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": docs}) as r:
            assert r.status == 200
            cached.append(min(item["meta_info"]["cached_tokens"] for item in await r.json()))
    served = []
    for url in workers:
        served.append((await _samples(client, url)).get("sglang:num_requests_total", 0.0))
    assert sorted(served) == [0.0, 0.0, 0.0, 18.0], served  # six rankings of three pairs, one worker
    assert cached[0] == 0 and all(c >= len(QUERY.split()) - 16 for c in cached[1:]), cached  # the query's pages


async def test_a_stream_flag_is_ignored_as_the_worker_ignores_it(harness: Harness, client: aiohttp.ClientSession) -> None:
    app, _ = await ttft_fleet(harness)
    status, ranked, ctype = await post_json(client, base(app) + PATH, {"query": QUERY, "documents": DOCS, "stream": True})
    assert status == 200 and ctype.startswith("application/json") and len(ranked) == 3


@pytest.mark.parametrize(("body", "field"), [
    ({"documents": DOCS}, "query"),
    ({"query": "  ", "documents": DOCS}, "query"),
    ({"query": QUERY}, "documents"),
    ({"query": QUERY, "documents": []}, "documents"),
    ({"query": QUERY, "documents": ["fine", 7]}, "documents[1]"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, "top_n"),
    ({"query": 5, "documents": DOCS}, "query"),
], ids=["no_query", "blank_query", "no_documents", "empty_documents", "document_not_text", "top_n", "query_number"])
async def test_a_malformed_body_is_refused_by_the_proxy_naming_the_field(
        harness: Harness, client: aiohttp.ClientSession, body: dict[str, Any], field: str) -> None:
    app, (worker,) = await ttft_fleet(harness)
    await refused_naming(client, base(app), "/v1/rerank", worker, body, field)
