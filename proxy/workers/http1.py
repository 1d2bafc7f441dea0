"""A lean HTTP/1.1 client for the request hot path: one protocol object per pooled connection.

Why not aiohttp's client here: it wakes the reading task once per HTTP chunk and builds a request
object per call. An SGLang stream sends one HTTP chunk per token, so that was most of the proxy's
CPU per streamed request. Here ``data_received`` decodes every chunk of a TCP read at once and
wakes the reader once per read; a request is one ``transport.write`` of prebuilt bytes.

Scope, on purpose small: ``POST`` with a body; responses framed by ``Content-Length``,
``Transfer-Encoding: chunked`` (trailers skipped) or connection close; keep-alive reuse;
``http`` and ``https``. TCP_NODELAY is set on every connection. A connection is reused only after
its response was read to the end; anything else closes it.

Timeouts: connecting is bounded by ``connect_timeout_s``; once its head arrived, a response that
stays silent for ``idle_timeout_s`` between reads fails with ``UpstreamIdle`` (a ``TimeoutError``).
The wait for the head is not this timer's: the caller bounds it (a stream's first-byte timeout; a
non-stream answer, whose head comes only when the whole generation is done, by its deadline and
health checks — an idle timer there failed every healthy generation longer than it). The idle
timer is one timer per silent period, re-armed lazily, not one per read. ``fail(exc)`` ends a
response from outside (the caller's deadline): the next read raises ``exc``.

Bounds on what a worker can make us hold: the head (interim 1xx heads included) at most
``MAX_HEAD_BYTES``; ``read()`` — a whole body — at most ``max_body_bytes`` (a larger
``Content-Length`` is refused before a byte of the body is read); ``readany()`` hands over what
arrived and pauses the socket above ``PAUSE_ABOVE`` buffered bytes. A status line that is not
``HTTP/1.x`` + three digits, a ``Content-Length`` that is not one decimal number, ``101`` (never
asked for) or more than ``MAX_INTERIM`` interim ``1xx`` heads are ``UpstreamProtocolError``; interim
``100`` / ``102`` / ``103`` heads are skipped, as RFC 9110 §15.2 asks of a client.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
MAX_INTERIM = 8  # interim 1xx heads skipped before the final one
PAUSE_ABOVE = 1 << 20  # buffered body bytes before we stop reading from the worker
DEFAULT_MAX_BODY = 64 << 20
_STATUS = re.compile(r"[1-5][0-9][0-9]")


class UpstreamClosed(ConnectionError):
    """The worker closed the connection before the response was complete."""


class UpstreamProtocolError(ConnectionError):
    """The worker's response was not valid HTTP/1.1 (the connection is dropped)."""


class ResponseTooLarge(UpstreamProtocolError):
    """A response (or its head) is larger than the client's bound."""


class UpstreamIdle(TimeoutError):
    """The worker went silent mid-response for longer than the idle timeout."""


class Http1Connection(asyncio.Protocol):
    """One connection; at most one request on it at a time. Also the response object."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_timeout_s: float,
                 max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        self._loop = loop
        self._idle = idle_timeout_s
        self.max_body_bytes = max_body_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.pool: Http1Pool | None = None  # set while leased from a pool
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.content_type = ""
        self.keep_alive = True
        self._head = bytearray()  # a head that arrived in pieces, until its blank line
        self._head_seen = 0  # head bytes so far, interim 1xx heads included
        self._interim = 0
        self._head_done = False
        self._framing = ""  # "length" | "chunked" | "eof"
        self._remaining = 0  # length framing: bytes left; chunked: bytes left in this chunk (+2 CRLF)
        self._cbuf = b""  # chunked: undecoded bytes
        self._body: list[bytes] = []
        self._buffered = 0
        self.complete = False
        self._exc: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._paused = False

    # -- protocol callbacks ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()
        while not self._head_done:
            if self._exc is not None:
                return
            buf: bytes | bytearray = data
            start = 0
            if self._head:  # a head split over reads: append, and search only the new bytes (+3)
                start = max(0, len(self._head) - 3)
                self._head += data
                buf = self._head
            end = buf.find(b"\r\n\r\n", start)
            if self._head_seen + (len(buf) if end < 0 else end) > MAX_HEAD_BYTES:
                self._fail(ResponseTooLarge(f"worker's response head is over {MAX_HEAD_BYTES} bytes"))
                return
            if end < 0:
                if buf is data:
                    self._head = bytearray(data)
                return
            head, data = bytes(buf[:end]), bytes(buf[end + 4:])
            self._head = bytearray()
            self._head_seen += end + 4
            try:
                self._parse_head(head)
            except ValueError as e:
                self._fail(UpstreamProtocolError(str(e)))
                return
        if self._exc is not None:
            return
        if data and not self.complete:
            if self._framing == "chunked":
                self._feed_chunked(data)
            elif self._framing == "length":
                take = data[: self._remaining]
                self._remaining -= len(take)
                self._push(take)
                if self._remaining == 0:
                    self._finish()
            else:
                self._push(data)
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete:
            if self._head_done and self._framing == "eof":
                self._finish()
            elif self._exc is None and not self._head_done and (self._head or self._head_seen):
                # It began answering, then closed before its head ended: a broken answer, not a lost worker.
                self._exc = UpstreamProtocolError("worker closed the connection inside its response head")
            elif self._exc is None:
                self._exc = UpstreamClosed(f"worker closed the connection mid-response ({exc!r})")
        self._stop_timer()
        self._wake()

    # -- parsing ---------------------------------------------------------------------------------
    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not _STATUS.fullmatch(parts[1]):
            raise ValueError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200:
            if status == 101 or self._interim >= MAX_INTERIM:
                raise ValueError(f"worker answered {lines[0][:40]!r}: no final response")
            self._interim += 1  # an interim answer (100 Continue, 103 Early Hints): the final one follows
            return
        self.status = status
        headers = self.headers
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        self.content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        connection = headers.get("connection", "").lower()
        self.keep_alive = "close" not in connection and (parts[0] != "HTTP/1.0" or "keep-alive" in connection)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self._framing, self._remaining = "chunked", -1
        elif "content-length" in headers:
            length = headers["content-length"]
            if not (length.isascii() and length.isdigit()) or len(length) > 18:
                raise ValueError(f"bad Content-Length {length[:30]!r}")
            self._framing, self._remaining = "length", int(length)
            if self._remaining == 0:
                self._finish()
        elif self.status in (204, 304):
            self._framing = "length"
            self._finish()
        else:
            self._framing = "eof"
            self.keep_alive = False
        self._head_done = True
        self._arm()  # from here on, silence is the idle timeout's

    def _feed_chunked(self, data: bytes) -> None:
        buf = self._cbuf + data if self._cbuf else data
        pos, size = 0, len(buf)
        pieces: list[bytes] = []
        while pos < size:
            if self._remaining > 0:  # inside a chunk's data (+ its trailing CRLF)
                take = min(self._remaining, size - pos)
                pieces.append(buf[pos:pos + take])
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._remaining = -2  # expect CRLF
                continue
            if self._remaining == -2:
                if size - pos < 2:
                    break
                pos += 2
                self._remaining = -1
                continue
            if self._remaining == -3:  # trailer lines after the last chunk, up to an empty one
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    self._finish()
                    break
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            try:
                length = int(buf[pos:end], 16)  # the common case: no chunk extension
            except ValueError:
                size_text = buf[pos:end].split(b";", 1)[0].strip()
                try:
                    length = int(size_text, 16)
                except ValueError:
                    self._fail(UpstreamProtocolError(f"bad chunk size {size_text[:20]!r}"))
                    return
            if length < 0:
                self._fail(UpstreamProtocolError(f"bad chunk size {buf[pos:end][:20]!r}"))
                return
            pos = end + 2
            if length == 0:
                self._remaining = -3
                continue
            stop = pos + length
            if stop + 2 <= size:  # the whole chunk and its CRLF are here (one token per chunk: usual)
                pieces.append(buf[pos:stop])
                pos = stop + 2
                continue
            self._remaining = length
        self._cbuf = buf[pos:] if pos < size else b""
        if pieces:
            self._push(b"".join(pieces) if len(pieces) > 1 else pieces[0])

    def _push(self, data: bytes) -> None:
        if not data:
            return
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered > PAUSE_ABOVE and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def _finish(self) -> None:
        self.complete = True
        self._stop_timer()

    def fail(self, exc: BaseException) -> None:
        """End the response from outside (e.g. the caller's deadline): the next read raises ``exc``."""
        if self._exc is None and not self.complete:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._exc = exc
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- idle timeout ----------------------------------------------------------------------------
    def _arm(self) -> None:
        if self._timer is None and self._idle > 0 and not self.complete:
            self._timer = self._loop.call_at(self._last + self._idle, self._check_idle)

    def _check_idle(self) -> None:
        self._timer = None
        if self.complete or self.closed:
            return
        if self._loop.time() - self._last >= self._idle:
            self._fail(UpstreamIdle(f"the worker sent nothing for {self._idle:g} s mid-answer "
                                    "(upstream.idle_timeout_s)"))
        else:
            self._arm()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- the caller's side -----------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self._reset()
        self._last = self._loop.time()
        try:
            self.transport.write(data)
        except RuntimeError as e:  # uvloop: the worker closed it and the close is not delivered yet
            self.closed = True
            raise UpstreamClosed(f"the connection closed before the request was sent ({e})") from None

    async def _wait(self) -> None:
        if self._exc is not None:
            raise self._exc
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self._exc is not None:
            raise self._exc

    async def wait_head(self) -> None:
        while not self._head_done:
            await self._wait()

    async def readany(self) -> bytes:
        """Whatever body bytes arrived (at least one), or b"" once the response is complete."""
        while not self._body:
            if self.complete:
                return b""
            await self._wait()
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body; ``ResponseTooLarge`` (connection dropped) beyond ``max_body_bytes``."""
        limit = self.max_body_bytes
        if self._framing == "length" and not self.complete and self._remaining + self._buffered > limit:
            raise self._too_large(f"worker declared a {self._remaining + self._buffered}-byte body, "
                                  f"over the {limit}-byte limit")
        parts: list[bytes] = []
        size = 0
        while True:
            data = await self.readany()
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                parts.clear()  # freed at once, not when the exception's frames are
                raise self._too_large(f"worker's body is over the {limit}-byte limit")
            parts.append(data)

    def _too_large(self, message: str) -> ResponseTooLarge:
        exc = ResponseTooLarge(message)
        self._fail(exc)
        self._body.clear()
        return exc

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self._exc is None and not self._cbuf

    def release(self) -> None:
        """Done with this response: back to its pool if read to the end (the pool decides), else closed."""
        if self.pool is not None:
            self.pool.release(self)
        else:
            self.close()

    def close(self) -> None:
        self._stop_timer()
        self.keep_alive = False
        self._body.clear()
        self._buffered = 0
        if self.transport is not None and not self.closed:
            self.transport.close()
            self.closed = True


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
