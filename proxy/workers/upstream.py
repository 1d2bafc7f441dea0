"""Connections to workers: generation requests on the lean ``http1`` client, the rest on aiohttp.

Both keep pooled keep-alive connections per worker. Generation (``post``) uses ``http1_pool.Http1Pool``
— it is the hot path, see that module for why; probes, scrapes and ``/abort_request`` use one
aiohttp session per worker.

* Keep-alive: connections are reused; ``upstream.keepalive_timeout_s`` stays below SGLang's
  (uvicorn's 5 s) so we never write into a connection the worker is about to close.
* TCP_NODELAY on every socket: ``http1`` sets it on its connections, aiohttp on the ones it opens
  and on the client sockets our server accepts (``BaseProtocol.connection_made``). Small SSE writes
  then leave at once instead of waiting out a delayed ACK (~40 ms per streamed request
  otherwise); the integration test ``test_proxy_nagle`` checks that behaviour end to end.
* Timeouts: ``connect_timeout_s`` to connect, ``idle_timeout_s`` of silence from the worker once
  its answer began; the first byte and the total deadline are enforced by the pipeline around the
  whole exchange.
* Sizes: every byte read from a worker is bounded — a generation answer by
  ``max_response_bytes`` (``http1``), a probe, scrape or abort answer by ``max_scrape_bytes``
  (``ResponseTooLarge``, an ``OSError``: the probe or scrape fails). Side requests ask for
  ``Accept-Encoding: identity`` (aiohttp would offer gzip, and its bodies are not decoded here) and
  never follow a redirect (a worker must not send the proxy to another host: a 3xx is the answer).
* Side requests (``abort``) run as tracked background tasks and are awaited on ``close()``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping

import aiohttp

from proxy.config import UpstreamConfig
from proxy.workers.http1 import Http1Connection, ResponseTooLarge
from proxy.workers.http1_pool import Http1Pool

log = logging.getLogger("radixgate.upstream")

# Connection-level failures worth trying another worker for (refused, reset, closed mid-response,
# malformed response). TimeoutError is an OSError too: callers catch it first.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    aiohttp.ClientConnectionError,
    aiohttp.ClientPayloadError,
)


_IDENTITY = {"Accept-Encoding": "identity"}


async def read_capped(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """``resp``'s body, at most ``limit`` bytes: a larger one (declared or sent) is ``ResponseTooLarge``
    and the connection is dropped (aiohttp does not reuse a response left unread)."""
    declared = resp.content_length
    if declared is not None and declared > limit:
        raise ResponseTooLarge(f"{what}: the worker declared {declared} bytes, over the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    async for piece in resp.content.iter_any():
        size += len(piece)
        if size > limit:
            parts.clear()  # freed at once, not when the exception's frames are
            raise ResponseTooLarge(f"{what}: the worker's answer is over the {limit}-byte limit")
        parts.append(piece)
    return b"".join(parts)


class UpstreamPool:
    def __init__(self, cfg: UpstreamConfig) -> None:
        self.cfg = cfg
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._pools: dict[str, Http1Pool] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=cfg.connect_timeout_s, sock_read=cfg.idle_timeout_s)

    def session(self, url: str) -> aiohttp.ClientSession:
        s = self._sessions.get(url)
        if s is None or s.closed:
            connector = aiohttp.TCPConnector(
                limit=self.cfg.max_connections_per_worker,
                keepalive_timeout=self.cfg.keepalive_timeout_s,
            )
            s = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False)
            self._sessions[url] = s
        return s

    async def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> Http1Connection:
        """Send one request on the hot-path client; returns once the response head arrived.

        The caller reads the body (``read`` / ``readany``) and must ``release`` the response.
        """
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = Http1Pool(
                url, limit=self.cfg.max_connections_per_worker, keepalive_s=self.cfg.keepalive_timeout_s,
                connect_timeout_s=self.cfg.connect_timeout_s, idle_timeout_s=self.cfg.idle_timeout_s,
                max_body_bytes=self.cfg.max_response_bytes)
        return await pool.request(path, body, headers)

    @staticmethod
    def release(resp: Http1Connection) -> None:
        """Done with a response: its connection is reused if it was read to the end, else closed."""
        resp.release()

    async def get(self, url: str, path: str, timeout_s: float) -> tuple[int, str]:
        """A small GET (scrape): status and text (UTF-8, undecodable bytes replaced); aiohttp errors
        and an answer over ``max_scrape_bytes`` surface as ``OSError``."""
        try:
            async with self.session(url).get(url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                             headers=_IDENTITY, allow_redirects=False) as resp:
                body = await read_capped(resp, self.cfg.max_scrape_bytes, f"GET {path}")
                return resp.status, body.decode("utf-8", "replace")
        except aiohttp.ClientError as e:
            raise OSError(f"GET {url}{path}: {e!r}") from e

    async def probe(self, url: str, path: str, timeout_s: float) -> int:
        try:
            async with self.session(url).get(url + path, timeout=aiohttp.ClientTimeout(total=timeout_s),
                                             headers=_IDENTITY, allow_redirects=False) as resp:
                await read_capped(resp, self.cfg.max_scrape_bytes, f"probe {path}")
                return resp.status
        except aiohttp.ClientError as e:
            raise OSError(f"probe {url}{path}: {e!r}") from e

    def abort(self, url: str, rid: str) -> None:
        """Tell the worker to stop generating ``rid`` (the client went away); fire and forget."""
        self._spawn(self._abort(url, rid))

    async def _abort(self, url: str, rid: str) -> None:
        body = json.dumps({"rid": rid}).encode()
        try:
            async with self.session(url).post(
                    url + "/abort_request", data=body, headers={"Content-Type": "application/json"},
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=self.cfg.connect_timeout_s + 5.0)) as resp:
                await read_capped(resp, self.cfg.max_scrape_bytes, "/abort_request")
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.info("abort_request %s on %s failed: %r", rid, url, e)

    def forget(self, url: str) -> None:
        """The worker left: close its pool in the background."""
        pool = self._pools.pop(url, None)
        if pool is not None:
            pool.close()
        s = self._sessions.pop(url, None)
        if s is not None:
            self._spawn(s.close())

    def _spawn(self, coro: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, grace_s: float = 5.0) -> None:
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            await s.close()
