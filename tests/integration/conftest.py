"""Shared fixtures for proxy integration tests: real simulated workers + a real proxy, on 127.0.0.1.

``harness.fleet([SimConfig(...), ...])`` starts in-process simulated SGLang workers;
``harness.proxy(urls, **overrides)`` starts an ``App`` on port 0 (config overrides by dotted path).
Everything is torn down in reverse order (proxies before the workers they front).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import load
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet

FAST = 50.0  # simulated workers run 50x faster than real time


class Harness:
    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self._stack = stack

    async def fleet(self, configs: Sequence[SimConfig] | None = None) -> Fleet:
        configs = configs or [SimConfig(time_scale=FAST), SimConfig(time_scale=FAST)]
        return await self._stack.enter_async_context(Fleet.in_process(list(configs)))

    async def proxy(self, urls: Sequence[str], **overrides: Any) -> App:
        settings: dict[str, Any] = {
            "workers.static": list(urls), "server.port": 0, "server.admin_port": 0,
            "server.drain_grace_s": 2.0, "health.interval_s": 0.05, "scrape.interval_s": 0.05,
            # These tests spread identical prompts over workers; the default (ttft) would keep
            # them together. Tests of a policy name it.
            "routing.policy": "round_robin",
        }
        settings.update({k.replace("__", "."): v for k, v in overrides.items()})
        app = App(load(env={}, overrides=settings), registry=CollectorRegistry())
        await app.start()
        self._stack.push_async_callback(app.stop, 2.0)
        return app


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async with contextlib.AsyncExitStack() as stack:
        yield Harness(stack)


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def base(app: App) -> str:
    return f"http://127.0.0.1:{app.http_port}"


def admin(app: App) -> str:
    return f"http://127.0.0.1:{app.admin_port}"


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = 10.0,
                     what: str = "condition") -> None:
    """Poll ``check`` until it is true; fail after ``timeout_s`` (a bound, not a wait)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s} s")
        await asyncio.sleep(0.01)


async def status_of(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as r:
        await r.read()
        return r.status


async def ttft_fleet(harness: Harness, workers: int = 1) -> tuple[App, list[str]]:
    """Simulated workers (metrics on, 16-token pages) behind one proxy routing by ``ttft``: what
    the prefill-only endpoints' tests (rerank, score, classify) send through."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, page_size=16) for _ in range(workers)])
    return await harness.proxy(fleet.urls, **{"routing.policy": "ttft"}), fleet.urls


async def post_json(client: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any, str]:
    """POST ``body``: the status, the JSON answer and its Content-Type."""
    async with client.post(url, json=body) as r:
        return r.status, await r.json(), r.headers.get("Content-Type", "")
