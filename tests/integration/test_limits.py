"""Limits on the public port, on real sockets: sizes, connections, rate, timeouts, slow readers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from pathlib import Path

import aiohttp
import grpc
import psutil
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from proxy.sim.config import SimConfig
from tests.fixtures.sim_client import load
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.reliability import accounting, proxy_process, scrape, scripted_worker, stream, total

BODY = {"text": "Name three rivers of Europe. " * 4, "sampling_params": {"max_new_tokens": 3}}
KEYS = ("rg-limit-key-a-31e4", "rg-limit-key-b-98d2")


async def status_of(client: aiohttp.ClientSession, url: str, body: object = BODY,
                    headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    async with client.post(url, json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.text()


async def raw_exchange(port: int, data: bytes, *, timeout_s: float = 10.0) -> bytes:
    """Send raw bytes on a fresh connection; everything the proxy sends back until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def head(method: str, path: str, port: int, extra: str = "", length: int = 0) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n{extra}\r\n").encode()


# -- sizes -----------------------------------------------------------------------------------------
async def test_a_body_over_the_limit_is_413_with_or_without_a_content_length(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_body_bytes": 4096})
    big = {"text": "x" * 8000}
    status, _, text = await status_of(client, base(app) + "/generate", big)
    assert status == 413 and "body" in json.loads(text)["error"]["message"]

    async def chunks() -> object:  # no Content-Length: the limit applies while reading
        for _ in range(8):
            yield b'{"text": "' + b"y" * 1000 if _ == 0 else b"y" * 1000

    async with client.post(base(app) + "/generate", data=chunks()) as r:
        assert r.status == 413
    assert (await status_of(client, base(app) + "/generate"))[0] == 200  # still serving


async def _expect(port: int, extra: str, length: int) -> bytes:
    """curl's way: the headers with ``Expect: 100-continue``, then wait for the server's word before
    sending the body (never sent here); the first response it gets, head and body (Content-Length)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head("POST", "/generate", port, extra, length=length))
        await writer.drain()
        got = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        size = next((int(line.split(b":")[1]) for line in got.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")), 0)
        return got + await asyncio.wait_for(reader.readexactly(size), 10)
    finally:
        writer.close()  # as curl: a final answer instead of 100 Continue, the body is not sent


async def test_expect_100_continue_with_an_oversized_body_gets_the_413_and_no_100_continue(
        harness: Harness) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_body_bytes": 4096})
    port = app.http_port
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(head("POST", path, port, "Expect: 100-continue\r\n", length=10_000_000))
            await writer.drain()
            first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()
        assert first.startswith(b"HTTP/1.1 413 "), first[:80]
        assert b"Connection: close" in first
    reply = await _expect(port, "Expect: 100-continue\r\n", 10_000_000)
    assert reply.startswith(b"HTTP/1.1 413 ") and b"over the limit" in reply
    # Compressed: refused unread too.
    reply = await _expect(port, "Expect: 100-continue\r\nContent-Encoding: gzip\r\n", 100)
    assert reply.startswith(b"HTTP/1.1 415 ")
    # Within the limit: 100 Continue, then the body, then the answer.
    body = json.dumps(BODY).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head("POST", "/generate", port, "Expect: 100-continue\r\n", length=len(body)))
        await writer.drain()
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(body)
        await writer.drain()
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()
    # An unknown expectation: 417, as before.
    reply = await raw_exchange(port, head("POST", "/generate", port, "Expect: tea\r\n", length=len(body)) + body)
    assert reply.startswith(b"HTTP/1.1 417 ")
    async with aiohttp.ClientSession() as session:
        m = await scrape(session, admin(app))
    assert total(m, "radixgate_errors_total", cause="payload_too_large") == 4
    assert total(m, "radixgate_errors_total", cause="unsupported_encoding") == 1


async def test_a_prompt_over_the_limit_is_413_naming_the_prompt(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_prompt_chars": 300})
    status, _, text = await status_of(client, base(app) + "/generate", {"text": "z" * 400})
    assert status == 413 and "prompt" in json.loads(text)["error"]["message"]
    status, _, _ = await status_of(client, base(app) + "/generate", {"input_ids": list(range(400))})
    assert status == 413
    chat = {"model": "", "messages": [{"role": "user", "content": "w" * 400}]}
    assert (await status_of(client, base(app) + "/v1/chat/completions", chat))[0] == 413
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_errors_total", cause="payload_too_large") == 3


async def test_oversized_or_too_many_headers_are_refused_with_400(harness: Harness,
                                                                  client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_header_bytes": 1024,
                                                               "limits.max_headers": 16})
    port = app.http_port
    answer = await raw_exchange(port, head("GET", "/health", port, extra=f"X-Big: {'a' * 2000}\r\n"))
    assert answer.startswith(b"HTTP/1.") and answer.split(b" ", 2)[1] == b"400"
    many = "".join(f"X-H{i}: v\r\n" for i in range(40))
    assert (await raw_exchange(port, head("GET", "/health", port, extra=many))).split(b" ", 2)[1] == b"400"
    long_line = head("GET", "/health?" + "q" * 2000, port)
    assert (await raw_exchange(port, long_line)).split(b" ", 2)[1] == b"400"
    assert (await raw_exchange(port, head("GET", "/health", port, extra="X-Ok: fine\r\n"))).startswith(
        b"HTTP/1.1 200")


# -- connections -------------------------------------------------------------------------------------
# uvloop is what `radixgate serve` runs on (the refusal once failed there only); the default loop too.
@pytest.mark.asyncio(loop_factories=["uvloop", "asyncio"])
async def test_connections_beyond_the_limit_get_503_and_a_freed_slot_is_reused(
        harness: Harness, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.max_connections": 3})
    port = app.http_port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    try:
        await eventually(lambda: _open_is(app, 3), what="three connections counted")
        refused = await raw_exchange(port, head("GET", "/health", port))
        assert refused.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in refused
        assert b"too many open connections" in refused
        assert app.connections.refused == 1
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # no traceback per refusal
    finally:
        for _, writer in held[1:]:
            writer.close()
    await eventually(lambda: _open_is(app, 1), what="closed connections released")
    answer = await raw_exchange(port, head("GET", "/health", port))
    assert answer.startswith(b"HTTP/1.1 200")
    held[0][1].close()


async def _open_is(app: App, n: int) -> bool:
    return app.connections.open == n


# -- rate ------------------------------------------------------------------------------------------
async def test_each_client_gets_a_token_bucket_and_429_with_retry_after_beyond_it(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("\n".join(KEYS))
    # 1 token a second: at 4/s a loaded CI box once took the 250 ms a token refills over the first
    # three requests, and the fourth found it
    app = await harness.proxy((await harness.fleet()).urls, **{
        "limits.rate_limit_rps": 1.0, "limits.rate_limit_burst": 3, "security.api_keys_file": str(keys),
        "security.api_keys_env": ""})
    url = base(app) + "/generate"
    a, b = ({"Authorization": f"Bearer {k}"} for k in KEYS)
    assert [(await status_of(client, url, headers=a))[0] for _ in range(3)] == [200, 200, 200]
    status, headers, text = await status_of(client, url, headers=a)
    assert status == 429 and int(headers["Retry-After"]) >= 1
    assert "rate limit" in json.loads(text)["error"]["message"]
    assert (await status_of(client, url, headers=b))[0] == 200  # another key, another bucket
    async with client.get(base(app) + "/health") as r:
        assert r.status == 200  # probes are not charged

    async def refilled() -> bool:
        return (await status_of(client, url, headers=a))[0] == 200

    await eventually(refilled, timeout_s=5, what="a token back after 1/rate seconds")
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_errors_total", cause="rate_limited") >= 1
    accepted, succeeded, failed = accounting(m)
    assert accepted == succeeded + failed


async def test_without_keys_a_made_up_key_does_not_buy_a_fresh_bucket(
        harness: Harness, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXGATE_API_KEYS", raising=False)
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.rate_limit_rps": 0.5,
                                                               "limits.rate_limit_burst": 2})
    url = base(app) + "/generate"
    statuses = [(await status_of(client, url, headers={"x-api-key": f"made-up-{i}"}))[0] for i in range(4)]
    assert statuses == [200, 200, 429, 429]  # one peer, one bucket


async def test_grpc_calls_share_the_rate_limit_and_get_resource_exhausted(harness: Harness) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"server.grpc_port": -1,
                                                               "limits.rate_limit_rps": 0.5,
                                                               "limits.rate_limit_burst": 2})
    request = pb.GenerateRequest(text="hello", sampling=pb.SamplingParams(max_new_tokens=2))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        await stub.GenerateUnary(request, timeout=10)
        assert [c async for c in stub.Generate(request, timeout=10)][-1].HasField("final")
        call = stub.GenerateUnary(request, timeout=10)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "rate limit" in (info.value.details() or "")
        assert int(dict(await call.trailing_metadata())["retry-after"]) >= 1


# -- time ------------------------------------------------------------------------------------------
async def test_a_connection_that_sends_nothing_or_trickles_its_headers_is_closed_after_the_idle_timeout(
        harness: Harness) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.idle_timeout_s": 0.3})
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await raw_exchange(app.http_port, b"", timeout_s=5) == b""  # closed by the proxy
    assert 0.25 <= loop.time() - started < 2.0
    reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
    started = loop.time()
    closed_at = None
    for piece in (b"GET /hea", b"lth HTTP/1.1\r\n", b"Host: x\r\n", b"X-Slow: 1\r\n") * 10:
        try:
            writer.write(piece)
            await writer.drain()
            if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                closed_at = loop.time()
                break
        except TimeoutError:
            continue
        except ConnectionError:
            closed_at = loop.time()
            break
    writer.close()
    assert closed_at is not None and closed_at - started < 2.0  # never finished its headers: dropped


async def test_a_body_that_never_finishes_arriving_gets_408(harness: Harness) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"limits.body_timeout_s": 0.3})
    port = app.http_port
    loop = asyncio.get_running_loop()
    started = loop.time()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head("POST", "/generate", port, length=1000) + b'{"text": "only the start')
    await writer.drain()
    status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    answered_after = loop.time() - started
    length = int(next(line.split(b":")[1] for line in status.split(b"\r\n") if line.lower().startswith(b"content-length")))
    answer = json.loads(await reader.readexactly(length))
    writer.close()
    assert status.startswith(b"HTTP/1.1 408") and "body" in answer["error"]["message"]
    assert 0.299 <= answered_after < 2.0  # uvloop's clock counts whole milliseconds: 1 ms of slack


async def test_a_stream_past_the_total_timeout_ends_with_a_504_event_and_is_aborted_upstream(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0)])
    app = await harness.proxy(fleet.urls, **{"upstream.total_timeout_s": 0.5})
    body = {"text": "Recite a very long poem.", "stream": True, "sampling_params": {"max_new_tokens": 20000}}
    r = await stream(client, base(app) + "/generate", body)
    assert r.status == 200 and r.tokens and r.error is not None and r.error["code"] == 504
    assert r.done and r.clean_close and 0.5 <= r.elapsed_s < 2.0

    async def worker_idle() -> bool:
        return int((await load(client, fleet.urls[0]))["num_running_reqs"]) == 0

    await eventually(worker_idle, what="the timed-out request aborted on the worker")


async def test_a_worker_that_goes_silent_mid_stream_ends_it_with_a_504_event_after_the_idle_timeout(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    from aiohttp import web

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"text": "one", "meta_info": {"completion_tokens": 1}}\n\n')
        await asyncio.Event().wait()  # silence, until the proxy gives up on us
        return resp

    async with scripted_worker(generate) as url:
        app = await harness.proxy([url], **{"upstream.idle_timeout_s": 0.3, "scrape.interval_s": 0})
        r = await stream(client, base(app) + "/generate", {"text": "hi", "stream": True})
        assert r.status == 200 and len(r.tokens) == 1 and r.error is not None and r.error["code"] == 504
        assert r.done and r.clean_close and r.elapsed_s < 2.0


# -- slow readers ------------------------------------------------------------------------------------
async def test_a_client_that_stops_reading_does_not_make_the_proxy_buffer_the_stream(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    """Cumulative SSE chunks make a 2,000-token stream ~O(n²) bytes; a stalled reader must cost the
    proxy (its own process, measured by RSS) a bounded amount, the worker being slowed instead."""
    fleet = await harness.fleet([SimConfig(time_scale=FAST)])
    worker = fleet.urls[0]
    tokens = 2500
    body = {"text": "Count slowly.", "stream": True, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    config = {"workers": {"static": fleet.urls}, "health": {"interval_s": 0.5}, "scrape": {"interval_s": 0.5},
              "telemetry": {"log_requests": False}}
    async with proxy_process(config, tmp_path) as proxy:
        full = await stream(client, proxy.http + "/generate", body)  # a reader that keeps up
        assert full.ok
        full_bytes = sum(len(e) + 8 for e in full.events)
        rss = psutil.Process(proxy.pid)
        before = rss.memory_info().rss

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", int(proxy.http.rsplit(":", 1)[1])))
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        payload = json.dumps(body).encode()
        writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        await writer.drain()
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")

        async def generated() -> bool:  # the worker's engine is done; its writes wait on us
            return int((await load(client, worker))["num_running_reqs"]) == 0

        await eventually(generated, timeout_s=30, what="the worker generating every token")
        peak = before
        for _ in range(20):  # watch the proxy for a while with the client still stalled
            peak = max(peak, rss.memory_info().rss)
            await asyncio.sleep(0.02)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):  # the terminating chunk of the chunked body
            data = await asyncio.wait_for(reader.read(65536), 10)
            assert data, "the proxy closed the stalled stream"
            received += data
        writer.close()
    growth = peak - before
    print(f"slow reader: stream {full_bytes / 2**20:.1f} MiB, proxy RSS {before / 2**20:.1f} MiB, "
          f"peak growth while stalled {growth / 2**20:.2f} MiB")
    assert full_bytes > 24 * 2**20  # what an unbounded buffer would have had to hold
    assert growth < 8 * 2**20, f"proxy RSS grew {growth / 2**20:.1f} MiB under a stalled reader"
    events = dechunk(received).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""] and b'"error"' not in events[-3]
    assert json.loads(events[-3][len(b"data: "):])["meta_info"]["completion_tokens"] == tokens


def dechunk(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body → its bytes."""
    out, i = [], 0
    while True:
        end = body.index(b"\r\n", i)
        size = int(body[i:end], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2:end + 2 + size])
        i = end + 2 + size + 2
