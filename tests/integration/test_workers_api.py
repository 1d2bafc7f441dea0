"""Adding and removing workers at runtime on the admin port (proxy/frontends/workers_api.py): real
simulated workers, a real proxy, a DNS server standing in for discovery, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import io
import json
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from yarl import URL

from proxy.app import App
from proxy.clock import MonotonicClock
from proxy.config_sections import HealthConfig, ScrapeConfig
from proxy.frontends.workers_api import WorkersApi
from proxy.security import ApiKeys
from proxy.sim.config import SimConfig
from proxy.telemetry.metrics import Metrics
from proxy.workers.membership import Membership
from proxy.workers.registry import WorkerRegistry
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.test_discovery_dns import SRV_NAME, Zone, dns_server
from tests.integration.test_discovery_proxy import port_of


async def listed(client: aiohttp.ClientSession, app: App) -> dict[str, dict]:
    async with client.get(f"{admin(app)}/workers") as r:
        assert r.status == 200
        return {w["url"]: w for w in (await r.json())["workers"]}


async def routable(client: aiohttp.ClientSession, app: App) -> set[str]:
    return {u for u, w in (await listed(client, app)).items() if w["healthy"]}


async def served_by(client: aiohttp.ClientSession, app: App, n: int) -> dict[str, int]:
    """Which workers n requests reached (round robin spreads them), from the proxy's counters."""
    before = await _served(client, app)
    for i in range(n):
        async with client.post(f"{base(app)}/generate",
                               json={"text": f"hello {i}", "sampling_params": {"max_new_tokens": 2}}) as r:
            assert r.status == 200, await r.text()
    after = await _served(client, app)
    return {u: int(after[u] - before.get(u, 0)) for u in after if after[u] - before.get(u, 0) > 0}


async def _served(client: aiohttp.ClientSession, app: App) -> dict[str, float]:
    async with client.get(f"{admin(app)}/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("radixgate_completion_tokens_total{"):
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            out[worker] = float(line.rsplit(" ", 1)[1])
    return out


def changes(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith('radixgate_worker_changes_total{outcome="'):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


async def test_a_worker_added_takes_requests_and_a_removed_one_takes_no_more(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST), SimConfig(time_scale=FAST)])
    w0, w1 = fleet.urls
    app = await harness.proxy([w0])
    await eventually(lambda: _has(client, app, {w0}), what="w0 healthy")

    async with client.post(f"{admin(app)}/workers", json={"url": w1 + "/", "model": "pinned-model"}) as r:
        body = await r.json()
        assert r.status == 201, body
    assert body["url"] == w1 and body["added"] is True and body["worker"]["origin"] == "api"
    await eventually(lambda: _has(client, app, {w0, w1}), what="the added worker to pass its probe")
    workers = await listed(client, app)
    assert workers[w0]["origin"] == "source" and workers[w1]["origin"] == "api"
    async with client.get(f"{admin(app)}/workers") as r:
        doc = await r.json()
    assert (doc["total"], doc["healthy"]) == (2, 2)  # as smg's GET /workers counts them
    assert "pinned-model" in workers[w1]["models"]
    assert set(await served_by(client, app, 6)) == {w0, w1}

    async with client.post(f"{admin(app)}/workers", json={"url": w1}) as r:  # again: already a member
        assert r.status == 200 and (await r.json())["added"] is False
    async with client.get(f"{admin(app)}/workers/{quote(w1, safe='')}") as r:
        assert r.status == 200 and (await r.json())["url"] == w1

    # Percent-encoded, as smg's clients send it.
    async with client.delete(URL(f"{admin(app)}/workers/{quote(w1, safe='')}", encoded=True)) as r:
        assert r.status == 200 and await r.json() == {"url": w1, "removed": True}
    assert set(await listed(client, app)) == {w0}
    assert set(await served_by(client, app, 4)) == {w0}
    async with client.delete(f"{admin(app)}/workers/{w1}") as r:  # as it is: no member any more
        assert r.status == 404
    async with client.get(f"{admin(app)}/workers/{quote(w1, safe='')}") as r:
        assert r.status == 404

    # A configured worker can be taken out too, and put back.
    async with client.delete(f"{admin(app)}/workers/{w0}") as r:
        assert r.status == 200
    async with client.get(f"{admin(app)}/workers") as r:
        doc = await r.json()
    assert doc["workers"] == [] and doc["removed"] == [w0]
    async with client.post(f"{base(app)}/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}) as r:
        assert r.status == 503  # no worker: an explicit answer, counted like any refusal
    async with client.post(f"{admin(app)}/workers", json={"url": w0}) as r:
        assert r.status == 201
    await eventually(lambda: _has(client, app, {w0}), what="w0 back")
    async with client.get(f"{admin(app)}/metrics") as r:
        counted = changes(await r.text())
    assert counted == {"added": 2, "present": 1, "removed": 2, "absent": 1}


async def _has(client: aiohttp.ClientSession, app: App, urls: set[str]) -> bool:
    return await routable(client, app) == urls


async def test_a_request_in_flight_on_a_removed_worker_finishes_there(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    # Real time: the stream lasts long enough for the removal to land in its middle.
    fleet = await harness.fleet([SimConfig(time_scale=1.0), SimConfig(time_scale=FAST)])
    slow, other = fleet.urls
    app = await harness.proxy([slow, other])
    await eventually(lambda: _has(client, app, {slow, other}), what="both healthy")
    async with client.delete(f"{admin(app)}/workers/{other}") as r:  # round robin: the stream goes to slow
        assert r.status == 200
    body = {"text": "tell me a story", "stream": True, "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
    async with client.post(f"{base(app)}/generate", json=body) as r:
        assert r.status == 200
        first = await r.content.readline()
        assert first.startswith(b"data: {")
        async with client.delete(f"{admin(app)}/workers/{slow}") as d:
            assert d.status == 200
        assert set(await listed(client, app)) == set()
        rest = (first + await r.content.read()).decode()
    events = [line[6:] for line in rest.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["meta_info"]["completion_tokens"] == 48
    # Its label sets left with it and are not re-created by the request that ended after: that one
    # reports under worker="left" (no series per departed worker).
    async with client.get(f"{admin(app)}/metrics") as r:
        text = await r.text()
    assert f'worker="{slow}"' not in text and f'worker="{other}"' not in text
    assert 'radixgate_completion_tokens_total{worker="left"} 48.0' in text
    assert 'radixgate_requests_succeeded_total{frontend="http"} 1.0' in text


async def test_changes_are_refused_with_their_reasons(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    (w0,) = fleet.urls
    app = await harness.proxy([w0], workers__max_workers=2)
    url = f"{admin(app)}/workers"
    cases: list[tuple[bytes, int, str]] = [
        (b"not json", 400, "body: not JSON"),
        (b"[" * 5000 + b"]" * 5000, 400, "body: not JSON"),
        (b'"http://127.0.0.1:1"', 400, "JSON object"),
        (b'{"url": "http://127.0.0.1:1", "worker_type": "prefill"}', 400, "unknown field(s) ['worker_type']"),
        (b'{"url": "127.0.0.1:1"}', 400, "url: must start with http://"),
        (b'{"url": "http://u:p@127.0.0.1:1"}', 400, "url: must not carry credentials"),
        (b'{"model": "m"}', 400, "url: must be a non-empty string"),
        (b'{"url": "http://127.0.0.1:1", "model": 7}', 400, "model: must be a string"),
    ]
    for raw, status, message in cases:
        async with client.post(url, data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == status, (raw[:40], await r.text())
            assert message in (await r.json())["error"]["message"], raw[:40]
    async with client.post(url, data=io.BytesIO(b"{" + b" " * (2 * 1024 * 1024) + b"}")) as r:
        assert r.status == 413  # the admin port's body cap
    async with client.post(url, json={"url": "http://127.0.0.1:1"}) as r:
        assert r.status == 201  # a second worker: within workers.max_workers (2)
    async with client.post(url, json={"url": "http://127.0.0.1:2"}) as r:
        assert r.status == 409 and "workers.max_workers (2)" in (await r.json())["error"]["message"]
    async with client.delete(f"{url}/ftp://127.0.0.1:1") as r:
        assert r.status == 400
    assert set(await listed(client, app)) == {w0, "http://127.0.0.1:1"}
    async with client.get(f"{admin(app)}/metrics") as r:
        counted = changes(await r.text())
    assert counted == {"invalid": len(cases) + 1, "added": 1, "full": 1}


async def test_an_admin_key_guards_changes_and_reads_stay_open(
    harness: Harness, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RADIXGATE_ADMIN_KEY", "s3cret")
    fleet = await harness.fleet([SimConfig(time_scale=FAST), SimConfig(time_scale=FAST)])
    w0, w1 = fleet.urls
    app = await harness.proxy([w0])
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        async with client.post(f"{admin(app)}/workers", json={"url": w1}, headers=headers) as r:
            assert r.status == 401, headers
        async with client.post(f"{admin(app)}/add_worker", params={"url": w1}, headers=headers) as r:
            assert r.status == 401, headers
        async with client.delete(f"{admin(app)}/workers/{w0}", headers=headers) as r:
            assert r.status == 401, headers
    assert set(await listed(client, app)) == {w0}  # reads need no key
    async with client.post(f"{admin(app)}/workers", json={"url": w1}, headers={"x-api-key": "s3cret"}) as r:
        assert r.status == 201
    async with client.delete(f"{admin(app)}/workers/{w0}", headers={"Authorization": "Bearer s3cret"}) as r:
        assert r.status == 200
    assert set(await listed(client, app)) == {w1}
    async with client.get(f"{admin(app)}/metrics") as r:
        assert changes(await r.text()) == {"unauthorized": 9, "added": 1, "removed": 1}


async def test_without_a_key_changes_are_refused_when_the_admin_port_is_not_loopback(
    client: aiohttp.ClientSession,
) -> None:
    """The admin port's guard for a non-loopback ``server.admin_host``, served on 127.0.0.1 (tests stay
    on loopback): the handler is told the port is reachable from elsewhere."""
    registry = WorkerRegistry(health=HealthConfig(), scrape=ScrapeConfig(), clock=MonotonicClock())
    metrics = Metrics(CollectorRegistry())
    app = web.Application()
    WorkersApi(Membership(max_workers=4), registry, metrics, key=ApiKeys([]), loopback=False).add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        root = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with client.post(f"{root}/workers", json={"url": "http://10.0.0.9:30000"}) as r:
            assert r.status == 403 and "security.admin_key_env" in (await r.json())["error"]["message"]
        async with client.post(f"{root}/remove_worker", params={"url": "http://10.0.0.9:30000"}) as r:
            assert r.status == 403
        async with client.get(f"{root}/list_workers") as r:
            assert r.status == 200 and await r.json() == {"urls": []}
        assert registry.urls() == []
    finally:
        await runner.cleanup()


async def test_sglang_routers_add_remove_and_list_calls(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST), SimConfig(time_scale=FAST)])
    w0, w1 = fleet.urls
    app = await harness.proxy([w0])
    root = admin(app)
    async with client.post(f"{root}/add_worker", params={"url": w1}) as r:
        assert (r.status, await r.text()) == (200, f"Successfully added worker: {w1}")
    async with client.post(f"{root}/add_worker", params={"url": w1}) as r:
        assert (r.status, await r.text()) == (400, f"Worker {w1} already exists")
    async with client.post(f"{root}/add_worker") as r:
        assert r.status == 400 and "'url' query parameter" in await r.text()
    async with client.get(f"{root}/list_workers") as r:
        assert await r.json() == {"urls": sorted([w0, w1])}
    await eventually(lambda: _has(client, app, {w0, w1}), what="w1 healthy")
    async with client.post(f"{root}/remove_worker", params={"url": w0}) as r:
        assert (r.status, await r.text()) == (200, f"Successfully removed worker: {w0}")
    async with client.post(f"{root}/remove_worker", params={"url": w0}) as r:
        assert r.status == 404
    async with client.get(f"{root}/list_workers") as r:
        assert await r.json() == {"urls": [w1]}
    assert set(await served_by(client, app, 3)) == {w1}


async def test_discovery_and_the_admin_port_together(harness: Harness, client: aiohttp.ClientSession) -> None:
    """A removed worker stays out while discovery keeps listing it; once discovery drops it, a later
    listing is a new worker. An added one stays whatever discovery says."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST) for _ in range(3)])
    w0, w1, w2 = fleet.urls
    records = [(0, 0, port_of(w), f"sglang-{i}.test") for i, w in enumerate((w0, w1))]
    zone = Zone(srv={SRV_NAME: list(records)}, glue={f"sglang-{i}.test": ["127.0.0.1"] for i in range(2)})
    async with dns_server(zone) as (host, port):
        app = await harness.proxy(
            [], discovery__kind="dns", discovery__interval_s=0.05, discovery__dns__name=SRV_NAME,
            discovery__dns__srv=True, discovery__dns__nameserver=f"{host}:{port}")
        await eventually(lambda: _has(client, app, {w0, w1}), what="discovery's two")
        async with client.delete(f"{admin(app)}/workers/{w1}") as r:
            assert r.status == 200
        async with client.post(f"{admin(app)}/workers", json={"url": w2}) as r:
            assert r.status == 201
        await eventually(lambda: _has(client, app, {w0, w2}), what="w2 in, w1 out")
        await asyncio.sleep(0.3)  # six discovery rounds, each listing w1 again: it stays out
        assert set(await listed(client, app)) == {w0, w2}
        assert set(await served_by(client, app, 4)) == {w0, w2}

        zone.srv[SRV_NAME] = [records[0]]  # discovery drops w1: its removal is forgotten
        async def forgotten() -> bool:
            async with client.get(f"{admin(app)}/workers") as r:
                return (await r.json())["removed"] == []
        await eventually(forgotten, what="the removal to be forgotten")
        zone.srv[SRV_NAME] = list(records)  # ... and lists it again: it joins
        await eventually(lambda: _has(client, app, {w0, w1, w2}), what="w1 rediscovered")
        zone.srv[SRV_NAME] = []  # discovery empties: the added worker stays
        await eventually(lambda: _has(client, app, {w2}), what="only the added worker left")
