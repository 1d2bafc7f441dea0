"""Workers that misbehave (issue 16), on real sockets: a raw fake worker (tests/fixtures/broken_worker.py)
in front of which the proxy must keep bounded memory, enforce its deadlines by the clock, and
answer an explicit 502 / 504 (retrying on a healthy worker while nothing reached the client) —
never a 500, never a hang, never a relayed non-answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from tests.fixtures.broken_worker import (
    ABORT,
    CLOSE,
    HANG,
    BrokenWorker,
    chunk,
    http,
    native_event,
    sse,
    sse_head,
)
from tests.integration.conftest import Harness, admin, base, eventually
from tests.integration.reliability import accounting, scrape, stream, total

BODY: dict[str, Any] = {"text": "Name three rivers.", "sampling_params": {"max_new_tokens": 3}}
STREAM_BODY: dict[str, Any] = {**BODY, "stream": True}
QUIET = {"health.interval_s": 0, "scrape.interval_s": 0}


@contextlib.asynccontextmanager
async def workers(n: int) -> AsyncIterator[list[BrokenWorker]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(BrokenWorker.running()) for _ in range(n)]


async def post(client: aiohttp.ClientSession, app: App, body: dict[str, Any] = BODY,
               path: str = "/generate") -> tuple[int, bytes]:
    async with client.post(base(app) + path, json=body) as r:
        return r.status, await r.read()


def error_message(raw: bytes) -> str:
    return str(json.loads(raw)["error"]["message"])


async def balanced(client: aiohttp.ClientSession, app: App) -> bool:
    accepted, succeeded, failed = accounting(await scrape(client, admin(app)))
    return accepted == succeeded + failed


# -- one judge of every answer: 502 + retry before the first byte ---------------------------------
BAD_ANSWERS = {
    "html-200": http(200, b"<html><body>502 Bad Gateway (nginx)</body></html>", content_type="text/html"),
    "truncated-json": http(200, b'{"text": "ok", "meta_info": {"finish'),
    "deep-json": http(200, b"[" * 100_000),
    "json-string": http(200, b'"just a string"'),
    "nan-literal": http(200, b'{"text": NaN}'),
    "redirect": http(302, b"", headers=[("Location", "http://elsewhere.example/")]),
    "redirect-without-location": http(307, b""),
    "no-content": http(204, b"", content_type=None, length=None),
    "gzip-answer": http(200, b"\x1f\x8b\x08\x00junk", headers=[("Content-Encoding", "gzip")]),
}


@pytest.mark.parametrize("name", list(BAD_ANSWERS))
async def test_a_200_that_is_no_answer_is_retried_on_a_healthy_worker_and_alone_is_a_502(
        harness: Harness, client: aiohttp.ClientSession, name: str) -> None:
    async with workers(2) as (bad, good):
        bad.on("/generate", BAD_ANSWERS[name])
        app = await harness.proxy([bad.url, good.url], **QUIET)
        for _ in range(4):  # round robin: the broken worker gets its turns
            status, raw = await post(client, app)
            assert status == 200 and json.loads(raw)["text"] == "ok", (status, raw[:200])
        assert bad.count("/generate") >= 1
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_retries_total") == bad.count("/generate")
        alone = await harness.proxy([bad.url], **QUIET)
        status, raw = await post(client, alone)
        assert status == 502 and error_message(raw)
        assert await balanced(client, app) and await balanced(client, alone)


@pytest.mark.parametrize(("name", "answer"), [
    ("bad-status-line", [b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}"]),
    ("not-http", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n"]),
    ("status-with-sign", [b"HTTP/1.1 +200 OK\r\nContent-Length: 2\r\n\r\n{}"]),
    ("huge-head", [b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 100_000 + b"\r\nContent-Length: 2\r\n\r\n{}"]),
    ("negative-length", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n{}"]),
    ("close-mid-body", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te",
                        CLOSE]),
    ("reset-mid-body", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te",
                        ABORT]),
    ("switching-protocols", [b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n"]),
    ("endless-100-continue", [b"HTTP/1.1 100 Continue\r\n\r\n" * 50]),
])
async def test_worker_protocol_errors_are_502_not_503_no_healthy_worker(
        harness: Harness, client: aiohttp.ClientSession, name: str, answer: list[Any]) -> None:
    async with workers(1) as (bad,):
        bad.on("/generate", answer)
        app = await harness.proxy([bad.url], **QUIET, **{"upstream.total_timeout_s": 5.0})
        status, raw = await post(client, app)
        assert status == 502, (status, raw[:300])
        assert error_message(raw)
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_upstream_failures_total", worker=bad.url) == 1
        assert await balanced(client, app)


async def test_interim_100_and_103_heads_are_skipped_and_the_final_answer_relayed(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        body = b'{"text": "after the interim heads", "meta_info": {}}'
        w.on("/generate", [b"HTTP/1.1 100 Continue\r\n\r\n", 0.02, b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n",
                           *http(200, body)])
        app = await harness.proxy([w.url], **QUIET)
        status, raw = await post(client, app)
        assert status == 200 and json.loads(raw)["text"] == "after the interim heads"


async def test_a_worker_4xx_is_its_verdict_on_the_request_and_is_relayed(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        w.on("/generate", http(400, b'{"error": {"message": "bad sampling", "code": 400}}'))
        app = await harness.proxy([w.url], **QUIET)
        status, raw = await post(client, app)
        assert status == 400 and error_message(raw) == "bad sampling"


# -- bounded memory ------------------------------------------------------------------------------
MB = 1 << 20


async def test_a_body_declared_larger_than_the_cap_is_refused_before_it_is_read(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (bad,):
        bad.on("/generate", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n",
                             b"{" + b" " * 100_000, HANG])
        app = await harness.proxy([bad.url], **QUIET, **{"upstream.total_timeout_s": 10.0})  # the default cap
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, raw = await post(client, app)
        assert status == 502 and "limit" in error_message(raw)
        assert loop.time() - started < 5.0  # refused at once, not after the deadline


async def test_a_body_without_a_length_is_counted_while_read_and_cut_at_the_cap(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (bad,):
        bad.on("/generate", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                             *[chunk(b" " * 8192) for _ in range(20)], HANG])
        app = await harness.proxy([bad.url], **QUIET, **{"upstream.max_response_bytes": 65536,
                                                         "upstream.total_timeout_s": 10.0})
        status, raw = await post(client, app)
        assert status == 502 and "65536-byte limit" in error_message(raw)


async def test_scrape_and_probe_answers_over_the_cap_fail_the_scrape_and_the_probe(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        pad = b" " * (9 * MB)  # over the default 8 MiB
        w.on("/v1/loads", http(200, b'{"loads": [{"num_running_reqs": 0}], "pad": "' + pad + b'"}'))
        w.on("/metrics", http(200, b"# " + pad + b"\n", content_type="text/plain"))
        w.on("/get_load", [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
                           *[chunk(b" " * (64 * 1024)) for _ in range(9 * 16)], b"0\r\n\r\n"])
        app = await harness.proxy([w.url], **{"health.interval_s": 0.2, "scrape.interval_s": 0.1,
                                              "scrape.stale_after_s": 0.3})

        async def scrapes_failing() -> bool:
            m = await scrape(client, admin(app))
            return total(m, "radixgate_scrape_failures_total", worker=w.url) >= 2

        await eventually(scrapes_failing, what="over-cap scrape answers counted as failures")
        w.on("/health", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                         *[chunk(b"{" * (64 * 1024)) for _ in range(9 * 16)], b"0\r\n\r\n"])

        async def down() -> bool:
            return total(await scrape(client, admin(app)), "radixgate_worker_healthy", worker=w.url) == 0

        await eventually(down, what="a worker whose probe answers 9 MB marked down")


async def test_an_sse_line_that_never_ends_is_cut_at_the_event_cap(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    endless = [sse_head(), chunk(b'data: {"text": "'), *[chunk(b"a" * (64 * 1024)) for _ in range(9 * 16)], HANG]
    async with workers(2) as (bad, good):
        bad.on("/generate", endless)
        app = await harness.proxy([bad.url, good.url], **QUIET)  # the default cap: 8 MiB
        for _ in range(2):  # before the first event: retried on the healthy worker
            assert (await stream(client, base(app) + "/generate", STREAM_BODY)).ok
        assert bad.count("/generate") >= 1
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_upstream_failures_total", worker=bad.url, cause="bad_answer") == bad.count("/generate")
        bad.on("/generate", [sse_head(), chunk(b"data: " + native_event("a", 1) + b"\n\n"), 0.05,
                             *endless[1:]])
        alone = await harness.proxy([bad.url], **QUIET, **{"upstream.max_event_bytes": 65536})
        r = await stream(client, base(alone) + "/generate", STREAM_BODY)  # after it: an error event
        assert r.status == 200 and r.explicit_error and r.error is not None
        assert r.error["code"] == 502 and "max_event_bytes" in r.error["message"]
        assert len(r.tokens) == 1


# -- deadlines by the clock ------------------------------------------------------------------------
async def test_a_worker_dribbling_a_byte_at_a_time_cannot_keep_a_stream_past_its_deadline(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    dribble = [sse_head(), chunk(b"data: " + native_event("a", 1) + b"\n\n"),
               *[x for _ in range(60) for x in (0.05, chunk(b" "))], b"0\r\n\r\n"]  # ~3 s of one byte / 50 ms
    async with workers(1) as (w,):
        w.on("/generate", dribble)
        app = await harness.proxy([w.url], **QUIET, **{"upstream.total_timeout_s": 0.8,
                                                       "upstream.idle_timeout_s": 5.0})
        r = await stream(client, base(app) + "/generate", STREAM_BODY)
        assert r.status == 200 and r.explicit_error and r.error is not None
        assert r.error["code"] == 504 and "total_timeout_s" in r.error["message"]
        assert 0.7 < r.elapsed_s < 2.0  # the deadline, not the dribble, ended it
        await eventually(lambda: _aborted(w), what="the worker told to abort")


async def _aborted(w: BrokenWorker) -> bool:
    return w.count("/abort_request") >= 1


async def test_a_non_stream_answer_slower_than_the_idle_timeout_is_waited_for(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        w.on("/generate", [0.7, *http(200, b'{"text": "slow but fine", "meta_info": {}}')])
        app = await harness.proxy([w.url], **{"health.interval_s": 0, "scrape.interval_s": 0,
                                              "upstream.idle_timeout_s": 0.2, "upstream.first_byte_timeout_s": 0.3})
        status, raw = await post(client, app)
        assert status == 200 and json.loads(raw)["text"] == "slow but fine"
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_long_answer_checks_total", outcome="alive") >= 1


async def test_silence_mid_answer_is_a_504_naming_the_idle_timeout(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        w.on("/generate", [sse_head(), chunk(b"data: " + native_event("a", 1) + b"\n\n"), HANG])
        app = await harness.proxy([w.url], **QUIET, **{"upstream.idle_timeout_s": 0.3})
        r = await stream(client, base(app) + "/generate", STREAM_BODY)
        assert r.error is not None and r.error["code"] == 504 and "idle_timeout_s" in r.error["message"]
        assert r.done and r.clean_close


# -- malformed events after the first byte -------------------------------------------------------
@pytest.mark.parametrize(("path", "first", "bad"), [
    ("/generate", native_event("a", 1), b"this is not json"),
    ("/generate", native_event("a", 1), b"[1, 2, 3]"),
    ("/v1/completions", b'{"choices": [{"index": 0, "text": "a", "finish_reason": null}]}', b"{not json}"),
    ("/v1/completions", b'{"choices": [{"index": 0, "text": "a", "finish_reason": null}]}', b"[1, 2]"),
], ids=["native-text", "native-list", "openai-braces", "openai-list"])
async def test_a_malformed_event_mid_stream_ends_it_with_an_error_event_and_done(
        harness: Harness, client: aiohttp.ClientSession, path: str, first: bytes, bad: bytes) -> None:
    async with workers(1) as (w,):
        good, broken, done = (chunk(b"data: " + e + b"\n\n") for e in (first, bad, b"[DONE]"))
        w.on(path, [sse_head(), good, 0.05, broken, good, done, b"0\r\n\r\n"])  # the first event reaches the client
        app = await harness.proxy([w.url], **QUIET)
        body = STREAM_BODY if path == "/generate" else {"prompt": "x", "stream": True, "max_tokens": 3}
        r = await stream(client, base(app) + path, body)
        assert r.status == 200 and r.explicit_error and r.error is not None, r
        assert r.error["code"] == 502 and r.done and r.clean_close
        assert len(r.tokens) == 1  # the good event before it, nothing after
        assert await balanced(client, app)


async def test_a_malformed_event_on_grpc_is_unavailable_not_internal(harness: Harness) -> None:
    async with workers(1) as (w,):
        w.on("/generate", sse([native_event("a", 1), b'{"text": "ab", "output_ids": ["x"], "meta_info": {}}',
                               b"[DONE]"]))
        app = await harness.proxy([w.url], **QUIET, **{"server.grpc_port": -1})
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in pb_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(text="hi"), timeout=10):
                    pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value


# -- scrape answers with numbers that are not finite -------------------------------------------------
@pytest.mark.parametrize(("path", "answer"), [
    ("/v1/loads", http(200, b'{"loads": [{"num_running_reqs": 1e999, "num_waiting_reqs": 0}]}')),
    ("/v1/loads", http(200, b'{"loads": [{"num_running_reqs": 1, "token_usage": NaN}]}')),
    ("/metrics", http(200, b"sglang:num_running_reqs +Inf\nsglang:num_queue_reqs 0\n", content_type="text/plain")),
    ("/metrics", http(200, b"sglang:token_usage NaN\n", content_type="text/plain")),
    ("/v1/loads", http(200, b'{"loads": [' * 5000 + b"]" * 5000 + b"}")),
], ids=["loads-1e999", "loads-NaN", "metrics-Inf", "metrics-NaN", "loads-deep"])
async def test_a_non_finite_scrape_marks_that_worker_stale_and_the_fleet_keeps_being_scraped(
        harness: Harness, client: aiohttp.ClientSession, path: str, answer: list[Any]) -> None:
    async with workers(2) as (bad, good):
        if path == "/metrics":
            bad.on("/v1/loads", http(404, b"{}"))
        bad.on(path, answer)
        app = await harness.proxy([bad.url, good.url], **{"health.interval_s": 0.05, "scrape.interval_s": 0.05,
                                                          "scrape.stale_after_s": 0.3})
        seen = good.count("/v1/loads")

        async def still_scraping() -> bool:  # the loop for the whole fleet goes on
            return good.count("/v1/loads") >= seen + 5

        await eventually(still_scraping, what="the good worker scraped again and again")

        async def bad_is_stale() -> bool:
            described = {w["url"]: w for w in await _workers(client, app)}
            return described[bad.url]["stale"] and not described[good.url]["stale"]

        await eventually(bad_is_stale, what="only the worker with the non-finite answer stale")
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_scrape_failures_total", worker=bad.url) >= 1
        assert total(m, "radixgate_scrape_failures_total", worker=good.url) == 0


async def _workers(client: aiohttp.ClientSession, app: App) -> list[dict[str, Any]]:
    async with client.get(admin(app) + "/workers") as r:
        return list((await r.json())["workers"])


async def test_a_non_finite_page_size_in_server_info_does_not_stop_the_proxy_starting(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(1) as (w,):
        w.on("/get_server_info", http(200, b'{"page_size": 1e999, "max_running_requests": -Infinity}'))
        app = await harness.proxy([w.url], **{"health.interval_s": 0.05, "scrape.interval_s": 0.05})
        status, raw = await post(client, app)
        assert status == 200 and json.loads(raw)["text"] == "ok"


async def test_scrapes_and_probes_never_follow_a_worker_redirect(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    async with workers(2) as (w, elsewhere):
        for path in ("/v1/loads", "/metrics", "/get_load", "/health"):
            w.on(path, http(302, b"", headers=[("Location", elsewhere.url + path)]))
        app = await harness.proxy([w.url], **{"health.interval_s": 0.05, "scrape.interval_s": 0.05})

        async def failing() -> bool:
            m = await scrape(client, admin(app))
            return (total(m, "radixgate_scrape_failures_total", worker=w.url) >= 2
                    and total(m, "radixgate_worker_healthy", worker=w.url) == 0)

        await eventually(failing, what="redirected scrapes and probes failing")
        assert elsewhere.hits == []  # the proxy went nowhere it was sent
