"""A worker that reports no load (no /v1/loads, /get_load or /metrics: 404) is not stale.

SGLang without ``--enable-metrics`` and engines that report only token counts answer 404 there.
Such a worker used to be published stale (never a good scrape) and so saturated for routing:
every decision on the real GPU fleet with minimal reports took the ``saturated`` branch.
"""

from __future__ import annotations

import asyncio

import aiohttp

from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, eventually


async def test_a_worker_without_load_reports_stays_fresh_and_keeps_its_static_shape(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, minimal_reports=True, max_running_requests=7),
                                 SimConfig(time_scale=FAST, enable_metrics=True)])
    app = await harness.proxy(fleet.urls, **{"scrape.stale_after_s": 0.3})

    async def workers() -> dict[str, dict[str, object]]:
        async with client.get(admin(app) + "/workers") as r:
            return {w["url"]: w for w in (await r.json())["workers"]}

    async def shaped() -> bool:
        engine = (await workers())[fleet.urls[0]]["engine"]
        return isinstance(engine, dict) and engine.get("max_running_requests") == 7

    await eventually(shaped, what="the unreported worker's server info")
    await asyncio.sleep(0.6)  # twice stale_after_s: a worker never scraped well would be stale now
    now = await workers()
    quiet, loud = now[fleet.urls[0]], now[fleet.urls[1]]
    assert quiet["stale"] is False and quiet["engine"]["running"] is None
    assert loud["stale"] is False and loud["engine"]["running"] is not None
