"""A lean HTTP/1.1 client for the request hot path: one protocol object per pooled connection.

Why not aiohttp's client here: it wakes the reading task once per HTTP chunk and builds a request
object per call. An SGLang stream sends one HTTP chunk per token, so that was most of the proxy's
CPU per streamed request. Here ``data_received`` decodes every chunk of a TCP read at once and
wakes the reader once per read; a request is one ``transport.write`` of prebuilt bytes.

Scope, on purpose small: ``POST`` with a body; responses framed by ``Content-Length``,
``Transfer-Encoding: chunked`` (trailers skipped) or connection close; keep-alive reuse;
``http`` and ``https``. TCP_NODELAY is set on every connection. A connection is reused only after
its response was read to the end; anything else closes it. The pool that leases connections
and reuses them is ``http1_pool.py``; the framing itself is parsed by ``http1_parse.py``.

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
import socket
from typing import Protocol

from proxy.workers.http1_parse import MAX_HEAD_BYTES, ChunkedDecoder, parse_head

PAUSE_ABOVE = 1 << 20  # buffered body bytes before we stop reading from the worker
DEFAULT_MAX_BODY = 64 << 20


class UpstreamClosed(ConnectionError):
    """The worker closed the connection before the response was complete."""


class UpstreamProtocolError(ConnectionError):
    """The worker's response was not valid HTTP/1.1 (the connection is dropped)."""


class ResponseTooLarge(UpstreamProtocolError):
    """A response (or its head) is larger than the client's bound."""


class UpstreamIdle(TimeoutError):
    """The worker went silent mid-response for longer than the idle timeout."""


class ConnectionOwner(Protocol):
    """Where a leased connection goes back when its response is done (``http1_pool.Http1Pool``)."""

    def release(self, conn: Http1Connection, /) -> None: ...


class Http1Connection(asyncio.Protocol):
    """One connection; at most one request on it at a time. Also the response object."""

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_timeout_s: float,
                 max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        self._loop = loop
        self._idle = idle_timeout_s
        self.max_body_bytes = max_body_bytes
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.pool: ConnectionOwner | None = None  # set while leased from a pool
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
        self._remaining = 0  # length framing: bytes left
        self._chunks: ChunkedDecoder | None = None  # chunked framing
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

    # -- framing (the parsing itself is http1_parse's) -------------------------------------------
    def _parse_head(self, head: bytes) -> None:
        parsed = parse_head(head, self._interim)
        if parsed is None:
            self._interim += 1  # an interim answer: the final one follows
            return
        self.status, self.headers, self.content_type = parsed.status, parsed.headers, parsed.content_type
        self.keep_alive = parsed.keep_alive
        self._framing = parsed.framing
        if parsed.framing == "chunked":
            self._chunks = ChunkedDecoder()
        elif parsed.framing == "length":
            self._remaining = parsed.length
            if self._remaining == 0:
                self._finish()
        self._head_done = True
        self._arm()  # from here on, silence is the idle timeout's

    def _feed_chunked(self, data: bytes) -> None:
        chunks = self._chunks
        assert chunks is not None
        try:
            body = chunks.feed(data)
        except ValueError as e:
            self._fail(UpstreamProtocolError(str(e)))
            return
        if chunks.done:
            self._finish()
        self._push(body)

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
        leftover = self._chunks is not None and self._chunks.buf
        return self.complete and self.keep_alive and not self.closed and self._exc is None and not leftover

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
