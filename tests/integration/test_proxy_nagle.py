"""Streaming through the proxy must not add Nagle / delayed-ACK stalls (~40 ms each).

Concurrency 1, one reused keep-alive connection per path, a zero-delay worker: the time to the
first SSE event through the proxy may exceed the direct one only by the proxy's own work. Direct
and proxied requests alternate so that load from other processes on the box hits both alike.
"""

from __future__ import annotations

import statistics
import time

import aiohttp

from proxy.sim.config import SimConfig
from tests.integration.conftest import Harness, base

ROUNDS = 25


async def first_event_seconds(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> float:
    start = time.perf_counter()
    async with session.post(url + "/generate", json=body) as r:
        assert r.status == 200
        await r.content.readuntil(b"\n\n")
        ttft = time.perf_counter() - start
        await r.read()
    return ttft


async def test_proxy_adds_no_nagle_stall_to_streamed_ttft(harness: Harness) -> None:
    fleet = await harness.fleet([SimConfig(profile="zero")])
    app = await harness.proxy(fleet.urls, **{"telemetry.log_requests": False})
    body = {"text": "ping " * 32, "stream": True, "sampling_params": {"max_new_tokens": 8}}
    direct, proxied = [], []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as to_worker, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as to_proxy:
        for _ in range(3):  # warm both connections
            await first_event_seconds(to_worker, fleet.urls[0], body)
            await first_event_seconds(to_proxy, base(app), body)
        for _ in range(ROUNDS):
            direct.append(await first_event_seconds(to_worker, fleet.urls[0], body))
            proxied.append(await first_event_seconds(to_proxy, base(app), body))
    added_ms = (statistics.median(proxied) - statistics.median(direct)) * 1000
    assert added_ms < 10.0, f"proxy added {added_ms:.1f} ms to median TTFT (direct {statistics.median(direct)*1e3:.1f} ms)"
