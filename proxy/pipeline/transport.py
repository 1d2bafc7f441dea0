"""The seam between the request path and the HTTP client to workers.

The pipeline asks only this of its transport: send one generation request and return once the
answer's head arrived (``post``), probe a worker's health endpoint (``probe``), tell a worker to
stop a request (``abort``). In the product it is ``workers.upstream.UpstreamPool`` over the lean
``workers.http1`` client; the state machine's own unit tests put a scripted transport here, so a
retry, a hold or a client leaving mid-stream is tested without sockets (``tests/unit/
test_exchange_states.py``). Every integration test still runs the real client against real
servers.

The transport's own socket-level timeouts (``upstream.connect_timeout_s``, ``idle_timeout_s``)
stay inside it, on the loop's time; every wait the pipeline itself imposes (first byte, the
request's deadline, health checks) is on the injected clock.

Failures a transport raises are the real client's: ``CONNECT_ERRORS`` (refused, reset) before or
after the head, ``UpstreamClosed`` / ``UpstreamProtocolError`` / ``ResponseTooLarge`` while
reading, ``UpstreamIdle`` after ``upstream.idle_timeout_s`` of silence once the answer began.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class Answer(Protocol):
    """One worker's answer in progress: its head is known, its body is read by the caller."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        ...

    async def readany(self) -> bytes:
        """What arrived since the last read; b"" at the end of the body."""
        ...

    def fail(self, exc: BaseException) -> None:
        """End the answer from outside (a deadline): the next read raises ``exc``."""
        ...

    def close(self) -> None:
        """Drop the connection (the answer is not read to its end)."""
        ...

    def release(self) -> None:
        """Done with the answer: its connection is reused if it was read to the end, else closed."""
        ...


class Transport(Protocol):
    async def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """Send one generation request to worker ``url``; return once the answer's head arrived."""
        ...

    async def probe(self, url: str, path: str, timeout_s: float) -> int:
        """The HTTP status of ``url``'s health endpoint (``OSError`` / ``TimeoutError`` when unreachable)."""
        ...

    def abort(self, url: str, rid: str) -> None:
        """Tell the worker to stop generating ``rid``; fire and forget."""
        ...
