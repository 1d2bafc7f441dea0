"""Helpers shared by the reliability tests (faults, drain, limits, security): metric reads, SSE
outcome classification, a ``radixgate serve`` subprocess, and a decoy HTTP server that counts hits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
ROOT = Path(__file__).resolve().parents[2]


async def scrape(client: aiohttp.ClientSession, admin_url: str) -> Samples:
    async with client.get(admin_url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == want for k, want in labels.items()))


async def refused_naming(client: aiohttp.ClientSession, proxy_url: str, path: str, worker: str,
                         body: Mapping[str, Any], field: str) -> None:
    """``body`` sent to ``path`` through the proxy is a 400 whose message starts with ``field``,
    and the (simulated, metrics on) worker never saw a request."""
    async with client.post(proxy_url + path, json=body) as r:
        assert r.status == 400
        answer = await r.json()
    assert answer["error"]["message"].startswith(field + ":"), answer
    assert total(await scrape(client, worker), "sglang:num_requests_total") == 0


def accounting(samples: Samples) -> tuple[float, float, float]:
    """(accepted, succeeded, failed) over every frontend."""
    return (total(samples, "radixgate_requests_accepted_total"),
            total(samples, "radixgate_requests_succeeded_total"),
            total(samples, "radixgate_requests_failed_total"))


@dataclass
class StreamResult:
    """What one streamed request looked like to its client."""

    status: int
    events: list[str] = field(default_factory=list)  # data payloads, in order
    error: dict[str, Any] | None = None  # the error event's "error" object, if any
    done: bool = False  # ended with data: [DONE]
    clean_close: bool = True  # the body ended without a transport error
    elapsed_s: float = 0.0
    finished_at: float = 0.0  # event-loop time when the body ended

    @property
    def tokens(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events if e != "[DONE]" and '"error"' not in e[:12]]

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.done and self.error is None and self.clean_close

    @property
    def explicit_error(self) -> bool:
        """Refused with a status, or ended by an error event then [DONE] on a clean close."""
        if self.status != 200:
            return True
        return self.error is not None and self.done and self.clean_close


async def stream(client: aiohttp.ClientSession, url: str, body: Mapping[str, Any],
                 headers: Mapping[str, str] | None = None) -> StreamResult:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with client.post(url, json=body, headers=headers) as r:
        result = StreamResult(r.status)
        if r.status != 200:
            with contextlib.suppress(aiohttp.ClientError, ValueError):
                result.error = (await r.json(content_type=None)).get("error")
            result.finished_at = loop.time()
            result.elapsed_s = result.finished_at - started
            return result
        try:
            raw = (await r.read()).decode()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
            result.clean_close = False
            raw = ""
    for block in raw.split("\n\n"):
        if not block.startswith("data: "):
            continue
        data = block[len("data: "):]
        result.events.append(data)
        if data == "[DONE]":
            result.done = True
        elif data.startswith('{"error"'):
            result.error = json.loads(data)["error"]
    result.finished_at = loop.time()
    result.elapsed_s = result.finished_at - started
    return result


# -- a proxy in its own process ---------------------------------------------------------------------
@dataclass
class ProxyProcess:
    proc: asyncio.subprocess.Process
    http: str
    admin: str
    stderr_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def terminate(self, timeout_s: float = 30.0) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        return await asyncio.wait_for(self.proc.wait(), timeout_s)

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def proxy_process(config: Mapping[str, Any], tmp_path: Path, *, args: Sequence[str] = (),
                        env: Mapping[str, str] | None = None) -> AsyncIterator[ProxyProcess]:
    """``python -m proxy serve --config <config>`` on free ports; yields once READY is printed."""
    import yaml

    path = tmp_path / "radixgate.yaml"
    path.write_text(yaml.safe_dump(dict(config)))
    stderr_path = tmp_path / "proxy.stderr"
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with stderr_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", "0", "--admin-port", "0",
            *args, stdout=asyncio.subprocess.PIPE, stderr=err, env=full_env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("READY "), (line, stderr_path.read_text(errors="replace")[-2000:])
        fields = dict(part.split("=", 1) for part in line.split()[1:])
        yield ProxyProcess(proc, f"http://{fields['http']}", f"http://{fields['admin']}", stderr_path)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if proc.stdout is not None:
            with contextlib.suppress(Exception):
                await proc.stdout.read()


# -- a decoy server ---------------------------------------------------------------------------------
@dataclass
class Decoy:
    url: str
    hits: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def decoy_server() -> AsyncIterator[Decoy]:
    """An HTTP server on 127.0.0.1 that answers anything and records every request it gets."""
    decoy = Decoy("")

    async def anything(request: web.Request) -> web.Response:
        decoy.hits.append(f"{request.method} {request.path_qs}")
        return web.json_response({"text": "decoy"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    decoy.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield decoy
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def scripted_worker(
    generate: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> AsyncIterator[str]:
    """A worker on 127.0.0.1 whose /generate misbehaves as the test scripts it (trickles, goes
    silent): faults the simulated worker has no knob for. /health answers 200. Yields its URL."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
