"""Client-side helpers for tests against simulated workers: SSE parsing, polling, load reads."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp


def sse_events(body: str) -> list[str]:
    """Split an SSE body into its data payloads, checking the framing on the way."""
    assert body.endswith("\n\n"), body[-50:]
    blocks = body[:-2].split("\n\n")
    assert all(b.startswith("data: ") for b in blocks), blocks
    return [b[len("data: ") :] for b in blocks]


def json_events(body: str) -> list[dict[str, Any]]:
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def poll(check: Callable[[], Awaitable[bool]], limit_s: float = 10.0, interval_s: float = 0.01) -> None:
    """Wait until check() is true; fail after limit_s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(interval_s)


async def load(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/v1/loads") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return dict(body["loads"][0])
