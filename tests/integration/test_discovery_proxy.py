"""Discovery through the whole proxy: a real App finds real simulated workers through the stand-in
Kubernetes API and through a DNS server on loopback; workers joining and leaving change /workers,
where requests go, and the metric label sets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proxy.app import App
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually, status_of
from tests.integration.k8s_standin import StandinApi, endpoint_slice, serve
from tests.integration.test_discovery_dns import SRV_NAME, Zone, dns_server

NS = "llm"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def worker_urls(client: aiohttp.ClientSession, app: App) -> set[str]:
    async with client.get(f"{admin(app)}/workers") as r:
        body = await r.json()
    return {w["url"] for w in (body["workers"] if isinstance(body, dict) else body)}


async def healthy_urls(client: aiohttp.ClientSession, app: App) -> set[str]:
    async with client.get(f"{admin(app)}/workers") as r:
        body = await r.json()
    return {w["url"] for w in (body["workers"] if isinstance(body, dict) else body) if w.get("healthy")}


async def metrics_text(client: aiohttp.ClientSession, app: App) -> str:
    async with client.get(f"{admin(app)}/metrics") as r:
        return await r.text()


async def generate(client: aiohttp.ClientSession, app: App, text: str) -> int:
    body = {"text": text, "sampling_params": {"max_new_tokens": 4}}
    async with client.post(f"{base(app)}/generate", json=body) as r:
        await r.read()
        return r.status


async def test_kubernetes_discovery_drives_membership_routing_and_metric_label_sets(
    harness: Harness, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST) for _ in range(3)])
    w0, w1, w2 = fleet.urls
    token = tmp_path / "token"
    token.write_text("test-token")
    api = StandinApi()
    # One slice per worker: the simulated workers share 127.0.0.1 and differ by port.
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("127.0.0.1", True, False)], port_of(w0)))
    await api.put("endpointslices", NS, endpoint_slice("sglang-b", "sglang", [("127.0.0.1", True, False)], port_of(w1)))
    async with serve(api) as api_url:
        app = await harness.proxy(
            [], discovery__kind="kubernetes", discovery__interval_s=0.05,
            discovery__kubernetes__api_server=api_url, discovery__kubernetes__namespace=NS,
            discovery__kubernetes__label_selector="kubernetes.io/service-name=sglang",
            discovery__kubernetes__port_name="http", discovery__kubernetes__token_file=str(token),
        )
        assert await worker_urls(client, app) == {w0, w1}
        for i in range(6):
            assert await generate(client, app, f"hello {i}") == 200
        assert f'worker="{w0}"' in await metrics_text(client, app)

        await api.put("endpointslices", NS, endpoint_slice("sglang-c", "sglang", [("127.0.0.1", True, False)], port_of(w2)))

        async def three() -> bool:
            return await worker_urls(client, app) == {w0, w1, w2}
        await eventually(three, what="the added worker to join")

        # w0's pod stops being ready (terminating), then w1's slice is deleted outright.
        await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("127.0.0.1", False, True)], port_of(w0)))
        await api.delete("endpointslices", NS, "sglang-b")

        async def only_w2() -> bool:
            return await worker_urls(client, app) == {w2} and await healthy_urls(client, app) == {w2}
        await eventually(only_w2, what="the removed workers to leave")
        for i in range(4):
            assert await generate(client, app, f"after {i}") == 200
        text = await metrics_text(client, app)
        assert f'worker="{w0}"' not in text and f'worker="{w1}"' not in text  # label sets removed
        assert f'radixgate_worker_healthy{{worker="{w2}"}} 1.0' in text
        assert api.list_count() == 1  # all of that arrived over the watch


async def test_dns_srv_discovery_follows_the_records_as_they_change(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST) for _ in range(2)])
    w0, w1 = fleet.urls
    zone = Zone(srv={SRV_NAME: [(0, 0, port_of(w0), "sglang-0.test")]}, glue={"sglang-0.test": ["127.0.0.1"],
                                                                               "sglang-1.test": ["127.0.0.1"]})
    async with dns_server(zone) as (host, port):
        app = await harness.proxy(
            [], discovery__kind="dns", discovery__interval_s=0.05, discovery__dns__name=SRV_NAME,
            discovery__dns__srv=True, discovery__dns__nameserver=f"{host}:{port}",
        )
        assert await worker_urls(client, app) == {w0}
        assert await generate(client, app, "hello") == 200
        zone.srv[SRV_NAME] = [(0, 0, port_of(w1), "sglang-1.test")]

        async def swapped() -> bool:
            # A newly discovered worker takes traffic once its first health probe passes.
            return await worker_urls(client, app) == {w1} and await healthy_urls(client, app) == {w1}
        await eventually(swapped, what="the SRV change to reach the proxy")
        assert await generate(client, app, "again") == 200
        assert f'worker="{w0}"' not in await metrics_text(client, app)


async def test_the_proxy_starts_at_once_when_the_api_is_down_and_picks_workers_up_when_it_returns(
    harness: Harness, client: aiohttp.ClientSession, tmp_path: Path
) -> None:
    """Also the probe semantics the manifests rely on: startup / liveness (GET /health) pass with no
    worker; readiness (gRPC health "", like GET /ready) passes only once a worker is discovered."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    (w0,) = fleet.urls
    token = tmp_path / "token"
    token.write_text("test-token")
    api = StandinApi(fail_requests=3)
    await api.put("endpointslices", NS, endpoint_slice("sglang-a", "sglang", [("127.0.0.1", True, False)], port_of(w0)))
    async with serve(api) as api_url:
        loop = asyncio.get_running_loop()
        started = loop.time()
        app = await harness.proxy(
            [], server__grpc_port=-1, discovery__kind="kubernetes", discovery__interval_s=0.2,
            discovery__kubernetes__api_server=api_url, discovery__kubernetes__namespace=NS,
            discovery__kubernetes__label_selector="kubernetes.io/service-name=sglang",
            discovery__kubernetes__token_file=str(token), discovery__port=port_of(w0),
        )
        # Far below the app's 10 s wait for a first worker set: the source said "none known yet".
        assert loop.time() - started < 5.0
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        health = health_pb2_grpc.HealthStub(channel)
        try:
            assert await status_of(client, f"{base(app)}/health") == 200
            assert await status_of(client, f"{base(app)}/ready") == 503
            assert (await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)).status == NOT_SERVING

            async def ready() -> bool:
                return await status_of(client, f"{base(app)}/ready") == 200
            await eventually(ready, what="the worker to be discovered once the API answers")
            assert (await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)).status == SERVING
            assert await worker_urls(client, app) == {w0}
            assert await generate(client, app, "hello") == 200
        finally:
            await channel.close()


async def test_a_probe_or_scrape_that_fails_after_its_worker_left_leaves_no_label_set(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    # Checks in flight when discovery drops a worker end afterwards; counting them would bring back
    # the label sets forget_worker just removed (seen as a flaky metrics assertion above).
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    app = await harness.proxy(fleet.urls)
    gone = "http://127.0.0.1:9"
    app._on_probe(gone, False)
    app._on_scrape_failure(gone)
    assert gone not in await metrics_text(client, app)
