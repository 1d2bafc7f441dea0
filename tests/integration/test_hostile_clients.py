"""Client inputs that used to escape the error table (issue 16), on real sockets: each must be a
4xx naming what is wrong, counted like any refused request, and must never reach a worker."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import grpc
import pytest
from aiohttp import web

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from tests.integration.conftest import Harness, admin, base
from tests.integration.reliability import Decoy, accounting, decoy_server, scrape, total

BODY = {"text": "Name three rivers of Europe.", "sampling_params": {"max_new_tokens": 3}}


async def raw_post(port: int, path: str, body: bytes, extra_headers: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One POST written byte for byte (headers the client libraries would refuse to send)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + extra_headers + b"Content-Length: " + str(len(body)).encode()
                     + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, rest = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, rest


@contextlib.asynccontextmanager
async def decoy_proxy(harness: Harness, **overrides: object) -> AsyncIterator[tuple[Decoy, App]]:
    """A proxy whose only worker answers anything 200 and records each hit: a request that reaches
    it was not refused."""
    async with decoy_server() as decoy:
        app = await harness.proxy([decoy.url], **{"health.interval_s": 0, "scrape.interval_s": 0, **overrides})
        yield decoy, app


async def healthy(request: web.Request) -> web.Response:
    return web.json_response({})


async def idle_loads(request: web.Request) -> web.Response:
    return web.json_response({"loads": [{"num_running_reqs": 0, "num_waiting_reqs": 0}]})


def message(body: bytes) -> str:
    err = json.loads(body)["error"]
    assert isinstance(err["message"], str) and err["message"]
    return str(err["message"])


async def test_deeply_nested_json_is_a_400_in_json_not_a_bare_500(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with decoy_proxy(harness) as (decoy, app):
        port = app.http_port
        for nested in (b"[" * 100_000, b'{"text": "x", "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                       b'{"text": "x", "extra": ' + b"[" * 70 + b"]" * 70 + b"}"):
            status, headers, body = await raw_post(port, "/generate", nested)
            assert status == 400 and headers["content-type"].startswith("application/json")
            assert "nested too deeply" in message(body)
        assert decoy.hits == []
        m = await scrape(client, admin(app))
    assert total(m, "radixgate_errors_total", cause="bad_request") == 3  # counted, unlike aiohttp's own 500
    accepted, succeeded, failed = accounting(m)
    assert accepted == succeeded + failed == 3


async def test_grpc_extra_json_nested_too_deeply_is_invalid_argument(harness: Harness) -> None:
    async with decoy_server() as decoy:
        app = await harness.proxy([decoy.url], **{"server.grpc_port": -1, "health.interval_s": 0,
                                                  "scrape.interval_s": 0})
        request = pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(extra_json="[" * 100_000))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await pb_grpc.GenerationStub(channel).GenerateUnary(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "sampling.extra_json" in (info.value.details() or "")
        assert decoy.hits == []


async def test_a_compressed_request_body_is_refused_415_without_being_inflated(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with decoy_server() as decoy:
        app = await harness.proxy([decoy.url], **{"health.interval_s": 0, "scrape.interval_s": 0})
        port = app.http_port
        bomb = gzip.compress(b'{"text": "' + b"a" * 50_000_000 + b'"}', compresslevel=9)  # 50 MB inflated
        for body, encoding in ((gzip.compress(json.dumps(BODY).encode()), b"gzip"),
                               (b"\x1f\x8b not really gzip", b"gzip"), (bomb, b"gzip"),
                               (json.dumps(BODY).encode(), b"br"), (json.dumps(BODY).encode(), b"x-made-up")):
            status, headers, answer = await raw_post(port, "/generate", body, b"Content-Encoding: " + encoding + b"\r\n")
            assert status == 415, (encoding, status, answer[:200])
            assert headers["accept-encoding"] == "identity" and "Content-Encoding" in message(answer)
        status, _, _ = await raw_post(port, "/generate", json.dumps(BODY).encode(), b"Content-Encoding: identity\r\n")
        assert status == 200 and len(decoy.hits) == 1
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_errors_total", cause="unsupported_encoding") == 5
        accepted, succeeded, failed = accounting(m)
        assert accepted == succeeded + failed == 6


async def test_an_authorization_header_that_is_not_ascii_is_a_400_not_a_500(harness: Harness) -> None:
    async with decoy_proxy(harness) as (decoy, app):
        port, body = app.http_port, json.dumps(BODY).encode()
        for value in ("Bearer €uro".encode(), b"Bearer \xff\xfe", "Bearer café".encode()):
            status, _, answer = await raw_post(port, "/generate", body, b"Authorization: " + value + b"\r\n")
            assert status == 400 and "Authorization" in message(answer)
        assert decoy.hits == []
        status, _, _ = await raw_post(port, "/generate", body, b"Authorization: Bearer plain-ascii-1\r\n")
        assert status == 200 and len(decoy.hits) == 1


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": 1e999}}', "sampling_params.max_new_tokens"),
    ("/generate", b'{"text": "x", "sampling_params": {"max_new_tokens": "many"}}', "sampling_params.max_new_tokens"),
    ("/generate", b'{"text": "x", "sampling_params": {"temperature": NaN}}', "NaN"),
    ("/generate", b'{"text": "x", "sampling_params": {"temperature": -1}}', "sampling_params.temperature"),
    ("/generate", b'{"text": ["a"], "sampling_params": [{"top_p": 0}]}', "sampling_params[0].top_p"),
    ("/generate", b'{"input_ids": ["1"]}', "input_ids"),
    ("/generate", b'{"text": [1, 2, 3]}', "text"),
    ("/v1/completions", b'{"prompt": "x", "max_tokens": 1e999}', "max_tokens"),
    ("/v1/completions", b'{"prompt": "x", "top_k": 0}', "top_k"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": Infinity}', "Infinity"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "stop": [1]}', "stop"),
], ids=["max_new_tokens-1e999", "max_new_tokens-string", "temperature-NaN", "temperature-negative",
        "batch-top_p-0", "input_ids-strings", "text-ints", "max_tokens-1e999", "top_k-0", "temperature-Infinity",
        "stop-ints"])
async def test_sampling_values_no_worker_accepts_are_400_naming_the_field_and_never_forwarded(
        harness: Harness, path: str, body: bytes, field: str) -> None:
    async with decoy_proxy(harness) as (decoy, app):
        status, _, answer = await raw_post(app.http_port, path, body)
        assert status == 400 and field in message(answer), answer[:300]
        assert decoy.hits == []


async def test_grpc_refuses_the_same_sampling_values_through_extra_json(harness: Harness) -> None:
    async with decoy_server() as decoy:
        app = await harness.proxy([decoy.url], **{"server.grpc_port": -1, "health.interval_s": 0,
                                                  "scrape.interval_s": 0})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.GenerationStub(channel)
            for extra, field in (('{"max_new_tokens": "many"}', "extra_json.max_new_tokens"),
                                 ('{"min_p": 1e999}', "extra_json.min_p"),
                                 ('{"temperature": NaN}', "NaN")):
                request = pb.GenerateRequest(text="hi", sampling=pb.SamplingParams(extra_json=extra))
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await stub.GenerateUnary(request, timeout=10)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (info.value.details() or "")
        assert decoy.hits == []


@pytest.mark.parametrize("encoded", [
    json.dumps(BODY).encode("utf-16"), json.dumps(BODY).encode("utf-32-le"),
    b"\xef\xbb\xbf" + json.dumps(BODY).encode()], ids=["utf-16", "utf-32", "utf-8-bom"])
async def test_json_that_is_not_plain_utf8_is_400_not_forwarded_corrupted(harness: Harness, encoded: bytes) -> None:
    async with decoy_proxy(harness) as (decoy, app):
        status, _, answer = await raw_post(app.http_port, "/generate", encoded)
        assert status == 400 and "malformed JSON" in message(answer)
        assert decoy.hits == []


async def test_a_huge_caller_chosen_rid_is_forwarded_whole_but_logged_truncated(
        harness: Harness, caplog: pytest.LogCaptureFixture) -> None:
    rid = "r" * 200_000
    seen: list[str] = []

    async def generate(request: web.Request) -> web.Response:
        seen.append((await request.json())["rid"])
        return web.json_response({"text": "ok", "meta_info": {"finish_reason": {"type": "stop"}}})

    app = web.Application(client_max_size=1 << 22)
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", healthy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        proxy = await harness.proxy([f"http://127.0.0.1:{runner.addresses[0][1]}"],
                                    **{"health.interval_s": 0, "scrape.interval_s": 0})
        with caplog.at_level(logging.INFO, logger="radixgate.requests"):
            status, _, _ = await raw_post(proxy.http_port, "/generate", json.dumps({"text": "x", "rid": rid}).encode())
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "radixgate.requests"]
    finally:
        await runner.cleanup()
    assert status == 200 and seen == [rid]  # the worker got the rid it must abort by
    assert len(lines) == 1 and lines[0]["rid"].startswith("rrrr") and len(lines[0]["rid"]) <= 131
    assert max(len(r.getMessage()) for r in caplog.records) < 5000


async def test_a_404_for_an_unknown_model_stays_short_however_many_models_the_fleet_serves(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    models = [f"model-{i:06d}-" + "m" * 20 for i in range(20_000)]

    async def listing(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m} for m in models]})

    app = web.Application()
    app.router.add_get("/v1/models", listing)
    app.router.add_get("/health", healthy)
    app.router.add_get("/v1/loads", idle_loads)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        proxy = await harness.proxy([f"http://127.0.0.1:{runner.addresses[0][1]}"], **{"scrape.interval_s": 0.05})

        async def listed() -> bool:
            async with client.get(base(proxy) + "/v1/models") as r:
                return len((await r.json())["data"]) == len(models)

        for _ in range(200):
            if await listed():
                break
            await asyncio.sleep(0.02)
        name = "no-such-model-" + "z" * 50_000
        async with client.post(base(proxy) + "/v1/completions", json={"model": name, "prompt": "x"}) as r:
            status, text = r.status, await r.text()
    finally:
        await runner.cleanup()
    assert status == 404 and len(text) < 2000
    msg = json.loads(text)["error"]["message"]
    assert "no-such-model-zzz" in msg and "model-000000" in msg and "and 19992 more" in msg
