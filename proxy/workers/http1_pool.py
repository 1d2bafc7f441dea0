"""Keep-alive connections to one worker for ``http1.Http1Connection``: lease, reuse, close.

A connection returns to the pool only when its response was read to the end (``reusable``);
an idle one is dropped after ``keepalive_s`` or once the worker closed it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from proxy.workers.http1 import DEFAULT_MAX_BODY, Http1Connection


class Http1Pool:
    """Keep-alive connections to one worker (``limit`` at most, idle ones kept ``keepalive_s``)."""

    def __init__(self, url: str, *, limit: int, keepalive_s: float, connect_timeout_s: float,
                 idle_timeout_s: float, max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.host_header = parts.netloc.encode("latin-1")
        self._ssl = ssl.create_default_context() if self.https else None
        self._keepalive = keepalive_s
        self._connect_timeout = connect_timeout_s
        self._idle_timeout = idle_timeout_s
        self._max_body = max_body_bytes
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[tuple[Http1Connection, float]] = []
        self._closed = False

    def head(self, path: str, body_len: int, headers: Mapping[str, str]) -> bytes:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (f"POST {path} HTTP/1.1\r\nHost: {self.host_header.decode('latin-1')}\r\n"
                f"Content-Length: {body_len}\r\n{extra}\r\n").encode("latin-1")

    async def request(self, path: str, body: bytes, headers: Mapping[str, str]) -> Http1Connection:
        """Send a POST and return the connection once the response head arrived."""
        await self._slots.acquire()
        conn: Http1Connection | None = None
        try:
            conn = await self._connection()
            conn.send(self.head(path, len(body), headers) + body)
            await conn.wait_head()
        except BaseException:
            self._slots.release()
            if conn is not None:
                conn.close()
            raise
        conn.pool = self
        return conn

    async def _connection(self) -> Http1Connection:
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._idle:
            conn, since = self._idle.pop()
            if not conn.closed and now - since < self._keepalive and not (
                    conn.transport is not None and conn.transport.is_closing()):
                return conn
            conn.close()
        _, proto = await asyncio.wait_for(
            loop.create_connection(lambda: Http1Connection(loop, self._idle_timeout, self._max_body),
                                   self.host, self.port,
                                   ssl=self._ssl, server_hostname=self.host if self._ssl else None),
            self._connect_timeout)
        return proto

    def release(self, conn: Http1Connection) -> None:
        """Return ``conn`` after its response: kept for reuse when it was read to the end (idempotent)."""
        if conn.pool is not self:
            return
        conn.pool = None
        self._slots.release()
        if conn.reusable and not self._closed:
            self._idle.append((conn, asyncio.get_running_loop().time()))
        else:
            conn.close()

    def close(self) -> None:
        self._closed = True
        for conn, _ in self._idle:
            conn.close()
        self._idle.clear()
