"""The hot-path HTTP/1.1 client against real servers on 127.0.0.1: framing, keep-alive, failures."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.workers.http1 import UpstreamClosed, UpstreamIdle
from proxy.workers.http1_pool import Http1Pool

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))
    return await reader.readexactly(length)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Script], Awaitable[str]]]:
    servers: list[asyncio.Server] = []
    connections: list[int] = []

    async def start(script: Script) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            try:
                await script(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    start.connections = connections  # type: ignore[attr-defined]
    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def pool(url: str, idle: float = 5.0) -> Http1Pool:
    return Http1Pool(url, limit=4, keepalive_s=5.0, connect_timeout_s=2.0, idle_timeout_s=idle)


async def test_content_length_response_and_keep_alive_reuse(serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()

    url = await serve(script)
    p = pool(url)
    for i in range(3):
        resp = await p.request("/generate", f'{{"n":{i}}}'.encode(), {"Content-Type": "application/json"})
        assert (resp.status, resp.content_type) == (200, "application/json")
        assert await resp.read() == f'{{"n":{i}}}'.encode()
        p.release(resp)
    assert len(serve.connections) == 1  # type: ignore[attr-defined]  # one connection, reused
    p.close()


async def test_chunked_body_split_at_every_byte_with_trailers(serve: Callable[[Script], Awaitable[str]]) -> None:
    wire = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            b"9\r\ndata: a\n\n\r\n" b"9;ext=1\r\ndata: b\n\n\r\n" b"0\r\nX-Trailer: t\r\n\r\n")

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for i in range(len(wire)):  # the worst case for a framing parser
            writer.write(wire[i:i + 1])
            await writer.drain()
        await reader.read()

    url = await serve(script)
    p = pool(url)
    resp = await p.request("/generate", b"{}", {})
    assert resp.content_type == "text/event-stream"
    assert await resp.read() == b"data: a\n\ndata: b\n\n"
    assert resp.reusable
    p.release(resp)
    p.close()


async def test_many_chunks_in_one_read_arrive_together(serve: Callable[[Script], Awaitable[str]]) -> None:
    events = [f"data: {i}\n\n".encode() for i in range(50)]
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
        f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n"

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(wire)
        await writer.drain()
        await reader.read()

    url = await serve(script)
    p = pool(url)
    resp = await p.request("/generate", b"{}", {})
    first = await resp.readany()
    assert first == b"".join(events)  # one wake-up for the whole read
    assert await resp.readany() == b""
    p.release(resp)
    p.close()


@pytest.mark.parametrize("cut", [None, 3, 9, 17])
async def test_chunk_data_holding_crlf_is_decoded_whole(serve: Callable[[Script], Awaitable[str]],
                                                       cut: int | None) -> None:
    # Data that holds CRLF (even CRLF + something that reads as a chunk size) must not be taken
    # for framing, whether a read ends at a chunk boundary or inside a chunk's data.
    datas = [b"a\r\nb", b"1\r\nx\r\n", b"data: c\n\n", b"\r\n"]
    body = b"".join(f"{len(d):x}\r\n".encode() + d + b"\r\n" for d in datas) + b"0\r\n\r\n"
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    parts = [head + body] if cut is None else [head + body[:cut], body[cut:]]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0)
        await reader.read()

    url = await serve(script)
    p = pool(url)
    resp = await p.request("/generate", b"{}", {})
    assert await resp.read() == b"".join(datas)
    assert resp.reusable
    p.release(resp)
    p.close()


async def test_close_mid_response_raises_and_the_connection_is_not_reused(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n")
        await writer.drain()
        writer.transport.abort()

    url = await serve(script)
    p = pool(url)
    resp = await p.request("/generate", b"{}", {})
    assert await resp.readany() == b"data: a\n\n"
    with pytest.raises(UpstreamClosed):
        await resp.readany()
    assert not resp.reusable
    p.release(resp)
    p.close()


async def test_silence_mid_body_past_the_idle_timeout_fails_naming_that_limit(
        serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\ndata: a\n\n\r\n")
        await writer.drain()
        await reader.read()  # then silence

    url = await serve(script)
    p = pool(url, idle=0.05)
    resp = await p.request("/generate", b"{}", {})
    assert await resp.readany() == b"data: a\n\n"
    with pytest.raises(UpstreamIdle, match=r"upstream\.idle_timeout_s"):
        await resp.readany()
    p.release(resp)
    p.close()


async def test_the_wait_for_the_head_is_not_the_idle_timers(serve: Callable[[Script], Awaitable[str]]) -> None:
    # A non-stream answer's head comes only once the whole generation is done: the caller bounds
    # that wait (deadline + health checks), never the idle timeout (which failed long generations).
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(0.4)  # 8 idle timeouts of "thinking"
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await reader.read()

    url = await serve(script)
    p = pool(url, idle=0.05)
    resp = await asyncio.wait_for(p.request("/generate", b"{}", {}), 5)
    assert resp.status == 200 and await resp.read() == b"{}"
    p.release(resp)
    p.close()


async def test_connection_refused_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: refused
        p = pool(f"http://127.0.0.1:{port}")
        with pytest.raises(OSError):
            await p.request("/generate", b"{}", {})
        p.close()


async def test_a_response_without_length_ends_at_close(serve: Callable[[Script], Awaitable[str]]) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\nboom")
        await writer.drain()

    url = await serve(script)
    p = pool(url)
    resp = await p.request("/generate", b"{}", {})
    assert resp.status == 500
    assert await resp.read() == b"boom"
    assert not resp.reusable
    p.release(resp)
    p.close()
