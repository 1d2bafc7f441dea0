"""Limits on what a client may ask of the public ports: rate, connections, size, time.

Rate (``TokenBucket``, ``RateLimiter``; pure, time passed in). Each client owns a bucket of
``burst`` tokens that refills continuously at ``rate`` tokens per second. A generation request takes
one token; a request that finds less than one is refused (429, ``Retry-After`` = seconds until the
next token). So a client may send ``burst`` requests at once and ``rate`` per second sustained.
At most ``max_clients`` buckets are kept; the least recently seen client is forgotten first and
comes back with a full bucket — the state its bucket would have reached anyway after ``burst /
rate`` idle seconds. O(1) per request. A client is its API key when keys are checked (hashed, so
the table holds no secrets), else its peer address; an unchecked key or ``X-Forwarded-For`` names
nobody (any client can write either, and would get a fresh bucket each time).

Connections (``ConnectionGate``, ``serve_gated``). At most ``max_connections`` client connections
are open on the public port at once; one more is answered ``503`` with ``Connection: close`` and
closed before any of its request is read. The count is kept at ``connection_made`` /
``connection_lost`` of the HTTP protocol, so a failed TLS handshake never holds a slot; a handshake
that never ends is closed after ``tls_handshake_timeout_s`` (it is not counted while it lasts).

File descriptors (``plan_file_descriptors``, pure). Every client connection and every pooled
worker connection is a descriptor: at start-up the soft ``RLIMIT_NOFILE`` is raised (never above
the hard limit) to cover ``max_connections`` + the upstream pools + a reserve; where the hard limit
cannot cover them, the connection gate is lowered to what fits, and the proxy says so, rather than
failing ``accept()`` (EMFILE) under load with the limit still "allowing" more.

Sizes and times (``LimitsConfig``): body (413, aiohttp ``client_max_size`` + Content-Length check),
prompt length (413, parse), request line / header field size and header count (400, aiohttp's
parser), idle connections — including one that never finishes its headers — closed after
``idle_timeout_s`` (aiohttp ``keepalive_timeout``), the body must arrive within ``body_timeout_s``
(408). A request body with a ``Content-Encoding`` is refused 415 unread (the parser never inflates:
``auto_decompress`` off). A request with ``Expect: 100-continue`` whose declared body is over the
limit, or compressed, gets that 413 / 415 instead of ``100 Continue`` (the frontend's expect
handler), so its body is never sent. Upstream first-byte, idle and total timeouts are ``upstream.*`` (the pipeline's).

Slow readers: nothing here buffers a response. The HTTP frontend awaits each ``write`` (aiohttp
drains above its high-water mark) before reading the next chunk from the worker, and the upstream
reader pauses its socket when its own buffer is full, so a client that reads slowly slows its
worker's stream instead of growing the proxy's memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from proxy.clock import Clock
from proxy.config import LimitsConfig
from proxy.errors import BadRequest, Overloaded, RadixgateError


class RateLimited(Overloaded):
    """429: the client's token bucket is empty."""

    cause = "rate_limited"


class RequestTimeout(BadRequest):
    """408: the client did not finish sending its request in time."""

    status, cause = 408, "request_timeout"


# -- rate: pure core ---------------------------------------------------------------------------------
@dataclass(slots=True)
class TokenBucket:
    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """Take one token: 0.0 when granted, else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """One ``TokenBucket`` per client, at most ``max_clients`` of them."""

    def __init__(self, rate: float, burst: int, max_clients: int) -> None:
        if rate <= 0 or burst < 1 or max_clients < 1:
            raise ValueError("rate > 0, burst >= 1 and max_clients >= 1 are required")
        self.rate, self.burst, self.max_clients = rate, float(burst), max_clients
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()

    def check(self, client: str, now: float) -> float:
        """Charge one request to ``client``: 0.0 when allowed, else seconds to wait (Retry-After)."""
        bucket = self._buckets.get(client)
        if bucket is None:
            bucket = self._buckets[client] = TokenBucket(self.rate, self.burst, self.burst, now)
            if len(self._buckets) > self.max_clients:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(client)
        return bucket.take(now)

    def __len__(self) -> int:
        return len(self._buckets)


def client_identity(api_key: str | None, peer: str | None) -> str:
    """The rate-limit key: the (hashed) API key when one was presented, else the peer address."""
    if api_key:
        return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:24]
    return "peer:" + (peer or "unknown")


def retry_after_header(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


# -- rate: aiohttp shell -------------------------------------------------------------------------
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Refuse = Callable[[web.Request, RadixgateError], web.StreamResponse]


def rate_limit_middleware(limiter: RateLimiter, clock: Clock, *, paths: frozenset[str],
                          credential: Callable[[web.Request], str | None], refuse: Refuse,
                          prefixes: tuple[str, ...] = ()) -> Any:
    """Charge every request to ``paths`` (or under ``prefixes``) to its client; ``refuse`` answers
    the ones over the rate."""

    @web.middleware
    async def rate_limit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in paths or (prefixes and request.path.startswith(prefixes)):
            wait = limiter.check(client_identity(credential(request), request.remote), clock.now())
            if wait > 0:
                return refuse(request, RateLimited(
                    f"rate limit: at most {limiter.rate:g} requests/s (bursts of {limiter.burst:g}) per client; "
                    f"retry in {wait:.2f} s", retry_after=wait))
        return await handler(request)

    return rate_limit


# -- connections -------------------------------------------------------------------------------------
# Descriptors besides client and pooled worker connections: listeners, logs, probes, NVML, DNS.
FD_RESERVE = 64


@dataclass(frozen=True, slots=True)
class FdPlan:
    soft: int  # the soft RLIMIT_NOFILE to set (never below the current one)
    max_connections: int  # the connection gate's limit that fits under it (0 = no limit)


def plan_file_descriptors(max_connections: int, upstream: int, soft: int, hard: int,
                          reserve: int = FD_RESERVE) -> FdPlan:
    """The soft descriptor limit to ask for, and the client connections that fit under it.

    ``upstream``: pooled worker connections at most; ``hard`` < 0 = unlimited (RLIM_INFINITY)."""
    ceiling = hard if hard >= 0 else max(soft, max_connections + upstream + reserve)
    if max_connections == 0:  # no limit of our own: take what the system allows
        return FdPlan(max(soft, ceiling), 0)
    needed = max_connections + upstream + reserve
    new_soft = min(ceiling, max(soft, needed))
    if needed <= new_soft:
        return FdPlan(new_soft, max_connections)
    return FdPlan(new_soft, max(1, new_soft - upstream - reserve))


class ConnectionGate:
    """Counts open connections; ``limit`` 0 = no limit."""

    __slots__ = ("limit", "open", "refused")

    def __init__(self, limit: int) -> None:
        self.limit, self.open, self.refused = limit, 0, 0

    def try_enter(self) -> bool:
        if self.limit and self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


def _refusal() -> bytes:
    body = json.dumps({"error": {"message": "too many open connections; retry later", "type": "service_unavailable",
                                 "code": 503}}).encode()
    head = ("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


REFUSAL = _refusal()


class _GatedHandler(web.RequestHandler):
    """aiohttp's HTTP protocol, counted by a ``ConnectionGate`` (refused: 503, then closed)."""

    def __init__(self, manager: web.Server, *, gate: ConnectionGate, loop: asyncio.AbstractEventLoop,
                 **kwargs: Any) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._gate = gate
        self._entered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._gate.try_enter():
            self.force_close()  # ignore anything the client already sent
            # Duck-typed: uvloop's TCPTransport writes like asyncio's but is no asyncio.WriteTransport
            # subclass (an isinstance check here failed on uvloop, the loop `radixgate serve` runs).
            writer = cast(asyncio.Transport, transport)
            writer.write(REFUSAL)
            writer.close()  # after the buffered refusal is flushed
            return
        self._entered = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self._entered:
            return
        self._entered = False
        self._gate.leave()
        super().connection_lost(exc)


def handler_options(cfg: LimitsConfig) -> dict[str, Any]:
    """The aiohttp request-handler settings that carry ``limits`` (also given to the ``AppRunner``)."""
    # auto_decompress off: a Content-Encoding body is refused (415, frontends/http.py), never inflated.
    return {"keepalive_timeout": cfg.idle_timeout_s, "max_line_size": cfg.max_header_bytes,
            "max_field_size": cfg.max_header_bytes, "max_headers": cfg.max_headers, "auto_decompress": False}


class GatedListener:
    """A listening socket serving ``runner``'s app, its connections counted by ``gate``."""

    def __init__(self, server: asyncio.AbstractServer, gate: ConnectionGate) -> None:
        self._server = server
        self.gate = gate

    @property
    def port(self) -> int:
        sockets: Any = getattr(self._server, "sockets", None) or [None]
        return int(sockets[0].getsockname()[1])

    def close(self) -> None:
        """Stop accepting; open connections are the runner's to close (``runner.cleanup()``)."""
        self._server.close()


async def serve_gated(runner: web.AppRunner, host: str, port: int, *, gate: ConnectionGate,
                      options: dict[str, Any], ssl_context: ssl.SSLContext | None = None,
                      backlog: int = 128, tls_handshake_timeout_s: float = 10.0) -> GatedListener:
    """Listen on ``host:port`` for ``runner`` (after ``runner.setup()``), like ``web.TCPSite`` plus the gate.

    ``options`` must be the request-handler settings the runner was built with (``handler_options``
    and ``access_log``): the handlers are made here, so the gate sees every connection.
    """
    server = runner.server
    if server is None:
        raise RuntimeError("runner.setup() must run first")
    loop = asyncio.get_running_loop()

    def protocol() -> _GatedHandler:
        return _GatedHandler(server, gate=gate, loop=loop, **options)

    listening = await loop.create_server(protocol, host, port, ssl=ssl_context, backlog=backlog,
                                         ssl_handshake_timeout=tls_handshake_timeout_s if ssl_context else None)
    return GatedListener(listening, gate)
