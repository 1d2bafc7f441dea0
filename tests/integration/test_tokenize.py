"""SGLang's ``/tokenize`` and ``/detokenize`` (and their ``/v1/`` twins) through a real radixgate
to simulated SGLang workers (``proxy/sim/tokenize.py``): the answer is a healthy worker's, as it
sent it, for the caller's body as sent; the worker's own 400 comes back; no healthy worker is a
503; the calls are charged to the rate limit like requests."""

from __future__ import annotations

import json
import socket
from typing import Any

import aiohttp
import pytest

from loadtests.gpu.fleet import TOKENIZER
from proxy.sim.config import SimConfig
from tests.fixtures.broken_worker import BrokenWorker, http
from tests.integration.conftest import FAST, Harness, base

TEXT = "Radix caches keep the prefixes a fleet shares."


async def _post(client: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any, str]:
    async with client.post(url, json=body) as r:
        return r.status, await r.json(), r.headers.get("X-Radixgate-Worker", "")


@pytest.mark.parametrize("prefix", ["", "/v1"])
async def test_the_answer_is_the_workers_for_the_body_as_sent(harness: Harness, client: aiohttp.ClientSession,
                                                               prefix: str) -> None:
    # the repo's BPE tokenizer on the worker: the proxy has none, and needs none
    fleet = await harness.fleet([SimConfig(time_scale=FAST, tokenizer=str(TOKENIZER))])
    app = await harness.proxy(fleet.urls)
    (worker,) = fleet.urls
    for body in ({"prompt": TEXT}, {"prompt": [TEXT, "a second one"], "add_special_tokens": False}):
        status, got, via = await _post(client, base(app) + prefix + "/tokenize", body)
        assert status == 200 and via == worker
        _, direct, _ = await _post(client, worker + "/tokenize", body)
        assert got == direct
    single = (await _post(client, base(app) + prefix + "/tokenize", {"prompt": TEXT}))[1]
    bare = (await _post(client, base(app) + prefix + "/tokenize", {"prompt": TEXT, "add_special_tokens": False}))[1]
    assert single["count"] == len(single["tokens"]) == len(bare["tokens"]) + 1  # the BOS the flag leaves out
    assert single["max_model_len"] > 0
    status, text, via = await _post(client, base(app) + prefix + "/detokenize", {"tokens": bare["tokens"]})
    assert status == 200 and via == worker and text == {"text": TEXT}
    _, texts, _ = await _post(client, base(app) + prefix + "/detokenize", {"tokens": [bare["tokens"], []]})
    assert texts == {"text": [TEXT, ""]}


async def test_a_malformed_body_gets_the_workers_own_400(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls)
    for path, body in (("/tokenize", {"prompt": 7}), ("/v1/detokenize", {"tokens": ["a"]}),
                       ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"})):
        status, got, via = await _post(client, base(app) + path, body)
        assert status == 400 and via == fleet.urls[0], (path, got)
        assert got["object"] == "error" and got["message"]


async def test_without_a_healthy_worker_the_answer_is_503(harness: Harness, client: aiohttp.ClientSession) -> None:
    with socket.socket() as s:  # a port nothing listens on: the only worker is down
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    app = await harness.proxy([dead])
    async with client.post(base(app) + "/tokenize", json={"prompt": TEXT}) as r:
        assert r.status == 503 and "Retry-After" in r.headers


async def test_tokenizer_calls_are_charged_to_the_rate_limit(harness: Harness, client: aiohttp.ClientSession,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXGATE_API_KEYS", raising=False)
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls, **{"limits.rate_limit_rps": 0.5, "limits.rate_limit_burst": 2})
    statuses = [(await _post(client, base(app) + path, {"prompt": TEXT}))[0]
                for path in ("/tokenize", "/v1/tokenize", "/tokenize")]
    assert statuses == [200, 200, 429]


async def test_the_default_tokenizer_detokenizes_what_its_worker_generated(harness: Harness,
                                                                          client: aiohttp.ClientSession) -> None:
    """The fast default tokenizer hashes prompt pieces (not invertible): its words come back, any
    other id as ``<id>``."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls)
    async with client.post(base(app) + "/generate", json={"text": TEXT, "sampling_params": {"max_new_tokens": 5}}) as r:
        made = await r.json()
    status, got, _ = await _post(client, base(app) + "/detokenize", {"tokens": made["output_ids"]})
    assert status == 200 and got["text"] == made["text"].strip() and len(got["text"].split()) == 5
    _, odd, _ = await _post(client, base(app) + "/detokenize", {"tokens": [made["output_ids"][0], 3]})
    assert odd["text"].endswith(" <3>")


async def test_a_slow_or_large_tokenizer_answer_is_bounded_as_an_answer_not_as_a_scrape(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """A worker's tokenizer answer grows with the caller's body and waits behind its busy
    tokenizer: past the scrape's time and size (here 0.7 s with the connection's, and 1 KiB) it is
    still served, within the answer's bounds (here 1.5 s: ``upstream.first_byte_timeout_s`` with the
    connection's, and ``max_response_bytes``); past those, a 504 and a 502."""
    ids = json.dumps({"tokens": list(range(600)), "count": 600, "max_model_len": 4096}).encode()  # ~2.9 KB
    async with BrokenWorker.running() as worker:
        app = await harness.proxy([worker.url], **{"scrape.timeout_s": 0.2, "upstream.max_scrape_bytes": 1024,
                                                   "upstream.connect_timeout_s": 0.5,
                                                   "upstream.first_byte_timeout_s": 1.0})
        worker.on("/tokenize", [1.0, *http(200, ids)])
        async with client.post(base(app) + "/tokenize", json={"prompt": TEXT}) as r:
            assert r.status == 200 and (await r.json())["count"] == 600
        worker.on("/tokenize", [2.0, *http(200, ids)])
        async with client.post(base(app) + "/tokenize", json={"prompt": TEXT}) as r:
            assert r.status == 504
        lean = await harness.proxy([worker.url], **{"upstream.max_response_bytes": 2048})
        worker.on("/tokenize", http(200, ids))
        async with client.post(base(lean) + "/tokenize", json={"prompt": TEXT}) as r:
            assert r.status == 502
