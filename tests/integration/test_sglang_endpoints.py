"""SGLang's own server endpoints on radixgate: what bench_serving, sglang's scripts and tools call
beside generation (``/health_generate``, model and server info, ``/flush_cache``)."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base

KEY = "rg-flush-key-5d1c7e"
PROMPT = "A long shared prompt that lands in a worker's prefix cache and stays there. " * 12


async def _generate(client: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with client.post(url + "/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 2}}) as r:
        assert r.status == 200
        meta = (await r.json())["meta_info"]
        assert isinstance(meta, dict)
        return meta


@pytest.mark.parametrize(("path", "field"), [
    ("/get_model_info", "model_path"), ("/model_info", "model_path"),
    ("/get_server_info", "scheduler_info"), ("/server_info", "scheduler_info"),
])
async def test_info_endpoints_answer_with_a_healthy_workers_own_answer(
        harness: Harness, client: aiohttp.ClientSession, path: str, field: str) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    async with client.get(base(app) + path) as r:
        assert r.status == 200 and r.content_type == "application/json"
        body = await r.json()
        worker = r.headers["X-Radixgate-Worker"]
    assert worker in fleet.urls
    async with client.get(worker + path) as direct:
        assert field in body and body[field] == (await direct.json())[field]


async def test_health_generate_is_a_workers_and_503_without_one(harness: Harness,
                                                                client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls)
    async with client.get(base(app) + "/health_generate") as r:
        assert r.status == 200 and r.headers["X-Radixgate-Worker"] == fleet.urls[0]
    with socket.socket() as s:  # a port nothing listens on: the only worker is down
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    lonely = await harness.proxy([dead])
    async with client.get(base(lonely) + "/health_generate") as r:
        assert r.status == 503 and "Retry-After" in r.headers
        assert "healthy" in (await r.json())["error"]["message"]


async def test_flush_cache_on_the_admin_port_empties_every_workers_cache(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_cache_report=True)] * 2)
    app = await harness.proxy(fleet.urls)
    for url in fleet.urls:  # each worker holds the prompt
        await _generate(client, url)
        assert (await _generate(client, url))["cached_tokens"] > 0
    generations = await _generations(client, app)
    for method in ("POST", "GET"):  # SGLang takes both; bench_serving posts
        async with client.request(method, admin(app) + "/flush_cache") as r:
            assert r.status == 200
            body = await r.json()
        assert body["flushed"] is True
        assert sorted(w["worker"] for w in body["workers"]) == sorted(fleet.urls)
        assert all(w["status"] == 200 and w["flushed"] and "Cache flushed" in w["message"] for w in body["workers"])
    for url in fleet.urls:  # the prompt is prefilled from scratch again
        assert (await _generate(client, url))["cached_tokens"] == 0
    # and radixgate forgot what it believed they held: two flushes, two new generations each
    assert await _generations(client, app) == {u: g + 2 for u, g in generations.items()}


async def test_after_a_flush_through_radixgate_the_diagnosis_counts_the_caches_as_they_are(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_cache_report=True)] * 2)
    app = await harness.proxy(fleet.urls, **{"diagnose.refresh_s": 0})
    body = {"text": "a shared system prompt " * 40, "sampling_params": {"max_new_tokens": 2}}
    for _ in range(4):
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()
    async with client.post(admin(app) + "/flush_cache") as r:
        assert r.status == 200
    await asyncio.sleep(0.2)  # a few scrape intervals: the window's snapshots show every worker flushed
    for _ in range(2):
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()
    async with client.get(admin(app) + "/diagnosis") as r:
        doc = await r.json()
    assert doc["window"]["requests"] == 6
    # the cache figures are of the two requests since the flush (the first prefilled it again)
    assert doc["four_numbers"]["cache"]["n"] == 2


async def test_the_diagnosis_over_the_last_seconds_only_counts_the_requests_received_in_them(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)] * 2)
    app = await harness.proxy(fleet.urls, **{"diagnose.refresh_s": 0, "diagnose.window_s": 60})
    body = {"text": "a shared system prompt " * 40, "sampling_params": {"max_new_tokens": 2}}

    async def send(n: int) -> None:
        for _ in range(n):
            async with client.post(base(app) + "/generate", json=body) as r:
                assert r.status == 200
                await r.read()

    await send(3)
    await asyncio.sleep(1.5)
    started = asyncio.get_running_loop().time()
    await send(2)
    span = asyncio.get_running_loop().time() - started + 0.5  # the last two, none of the first three
    async with client.get(admin(app) + f"/diagnosis?window_s={span:.3f}") as r:
        assert r.status == 200
        recent = await r.json()
    assert recent["window"]["requests"] == 2
    assert abs(recent["window"]["max_age_s"] - span) < 0.5
    async with client.get(admin(app) + "/diagnosis") as r:
        whole = await r.json()
    assert whole["window"]["requests"] == 5 and whole["window"]["max_age_s"] == 60
    for bad in ("0", "-1", "abc", "nan", "61"):
        async with client.get(admin(app) + f"/diagnosis?window_s={bad}") as r:
            assert r.status == 400
            assert "window_s" in (await r.json())["error"]["message"]


async def _generations(client: aiohttp.ClientSession, app: App) -> dict[str, int]:
    async with client.get(admin(app) + "/workers") as r:
        return {w["url"]: w["generation"] for w in (await r.json())["workers"]}


async def test_flush_cache_reports_each_worker_that_did_not_flush(harness: Harness,
                                                                  client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    app = await harness.proxy([*fleet.urls, dead])
    async with client.post(admin(app) + "/flush_cache") as r:
        assert r.status == 502
        body = await r.json()
    by_worker = {w["worker"]: w for w in body["workers"]}
    assert body["flushed"] is False
    assert by_worker[fleet.urls[0]]["flushed"] is True and by_worker[fleet.urls[0]]["status"] == 200
    assert by_worker[dead]["flushed"] is False and by_worker[dead]["status"] == 502


async def test_flush_cache_on_the_public_port_needs_api_keys_configured(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    open_app = await harness.proxy(fleet.urls, **{"security.api_keys_env": ""})
    async with client.post(base(open_app) + "/flush_cache") as r:
        assert r.status == 403
        assert "admin port" in (await r.json())["error"]["message"]
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    keyed = await harness.proxy(fleet.urls, **{"security.api_keys_file": str(keys), "security.api_keys_env": ""})
    async with client.post(base(keyed) + "/flush_cache") as r:
        assert r.status == 401
    async with client.post(base(keyed) + "/flush_cache", headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200
        assert json.loads(await r.text())["workers"][0]["flushed"] is True
    async with client.get(base(keyed) + "/get_server_info", headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert r.status == 200
    async with client.get(base(keyed) + "/get_server_info") as r:
        assert r.status == 401
