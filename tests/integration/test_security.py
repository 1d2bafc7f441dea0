"""Security on real sockets: API keys on both public ports, admin routes only on the admin port,
upstreams only from configuration, no prompts or keys in the logs."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import aiohttp
import grpc
import psutil
import pytest

from proxy._proto.radixgate.v1 import admin_pb2, admin_pb2_grpc
from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.config import Config
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.reliability import accounting, decoy_server, proxy_process, scrape, total

BODY = {"text": "Tell me a story about a lighthouse keeper. " * 4, "sampling_params": {"max_new_tokens": 4}}
KEY = "rg-test-key-7f3a9c0e51"
OTHER_KEY = "rg-other-key-0b2d4e6f88"


def key_file(tmp_path: Path, *keys: str) -> str:
    path = tmp_path / "api-keys"
    path.write_text("# keys for the test\n" + "\n".join(keys) + "\n")
    return str(path)


async def post(client: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None,
               body: object = BODY) -> tuple[int, dict[str, str], dict[str, object]]:
    async with client.post(url, json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


async def test_with_keys_configured_every_public_route_but_the_probes_needs_one(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, **{"security.api_keys_file": key_file(tmp_path, KEY, OTHER_KEY),
                                             "security.api_keys_env": ""})
    url = base(app) + "/generate"
    status, headers, body = await post(client, url)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert "API key" in body["error"]["message"]  # type: ignore[index]
    assert (await post(client, url, {"Authorization": "Bearer " + KEY[:-1]}))[0] == 401
    assert (await post(client, url, {"Authorization": "Basic " + KEY}))[0] == 401
    assert (await post(client, url, {"Authorization": "Bearer " + KEY}))[0] == 200
    assert (await post(client, url, {"x-api-key": OTHER_KEY}))[0] == 200
    chat = {"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert (await post(client, base(app) + "/v1/chat/completions", body=chat))[0] == 401
    async with client.get(base(app) + "/v1/models") as r:
        assert r.status == 401
    for probe in ("/health", "/ready"):
        async with client.get(base(app) + probe) as r:
            assert r.status == 200, probe
    m = await scrape(client, admin(app))  # the admin port itself is not behind the key
    assert total(m, "radixgate_errors_total", cause="unauthorized") == 4
    accepted, succeeded, failed = accounting(m)
    assert (accepted, succeeded, failed) == (6, 2, 4)


async def test_keys_can_come_from_the_environment(harness: Harness, client: aiohttp.ClientSession,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXGATE_API_KEYS", f"{KEY},{OTHER_KEY}")
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    assert (await post(client, base(app) + "/generate"))[0] == 401
    assert (await post(client, base(app) + "/generate", {"Authorization": f"Bearer {OTHER_KEY}"}))[0] == 200


async def test_without_keys_no_key_is_asked_for(harness: Harness, client: aiohttp.ClientSession,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXGATE_API_KEYS", raising=False)
    app = await harness.proxy((await harness.fleet()).urls)
    assert (await post(client, base(app) + "/generate"))[0] == 200


async def test_grpc_needs_the_key_too_but_its_health_service_does_not(
        harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, **{"server.grpc_port": -1, "security.api_keys_file": key_file(tmp_path, KEY),
                                             "security.api_keys_env": ""})
    request = pb.GenerateRequest(text="hello there", sampling=pb.SamplingParams(max_new_tokens=3))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        generation = pb_grpc.GenerationStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),), (("x-api-key", KEY + "x"),)):
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await generation.GenerateUnary(request, metadata=metadata, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in generation.Generate(request, timeout=10):
                pass
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await admin_pb2_grpc.AdminStub(channel).ListWorkers(admin_pb2.ListWorkersRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        answer = await generation.GenerateUnary(request, metadata=(("authorization", f"Bearer {KEY}"),), timeout=10)
        assert answer.final.completion_tokens == 3
        chunks = [c async for c in generation.Generate(request, metadata=(("x-api-key", KEY),), timeout=10)]
        assert chunks[-1].final.completion_tokens == 3
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_admin_routes_exist_only_on_the_admin_port_and_it_listens_on_loopback(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await harness.proxy((await harness.fleet()).urls, **{"server.host": "0.0.0.0"})
    for path in ("/metrics", "/workers", "/diagnosis"):
        async with client.get(base(app) + path) as r:
            assert r.status == 404, path
        async with client.get(admin(app) + path) as r:
            assert r.status == 200, path
    listening = {c.laddr.port: c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening[app.admin_port] == "127.0.0.1"
    assert listening[app.http_port] == "0.0.0.0"
    assert Config().server.admin_host == "127.0.0.1"


async def test_a_request_cannot_steer_the_proxy_to_an_upstream_of_its_choosing(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    async with decoy_server() as decoy:
        app = await harness.proxy(fleet.urls)
        host = decoy.url.removeprefix("http://")
        steering_headers = {"Host": host, "X-Forwarded-Host": host, "X-Forwarded-For": "127.0.0.1",
                            "X-Upstream": decoy.url, "X-Worker": decoy.url, "X-Backend-Url": decoy.url,
                            "x-session-id": decoy.url}
        steering_body = {**BODY, "url": decoy.url, "worker": decoy.url, "upstream": decoy.url,
                         "base_url": decoy.url, "server_url": decoy.url, "bootstrap_host": "127.0.0.1",
                         "bootstrap_port": int(host.rsplit(":", 1)[1])}
        status, _, body = await post(client, base(app) + "/generate", steering_headers, steering_body)
        assert status == 200 and body["text"] != "decoy"
        async with client.post(base(app) + f"/generate?url={decoy.url}&worker={decoy.url}", json=BODY) as r:
            assert r.status == 200
        # An absolute-form request line naming the decoy: still only the path is used.
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        payload = json.dumps(BODY).encode()
        writer.write(f"POST {decoy.url}/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        await writer.wait_closed()
        assert answer.startswith(b"HTTP/1.1 200") and b"decoy" not in answer.split(b"\r\n\r\n", 1)[1]
        assert decoy.hits == []
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_requests_succeeded_total") == 3
        assert {dict(ls).get("worker") for (n, ls) in m if n == "radixgate_e2e_seconds_count"} <= set(fleet.urls)


async def test_request_log_lines_carry_no_prompt_unless_asked(
        harness: Harness, client: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture) -> None:
    marker = "zebra-quartz-marker-5521"
    body = {**BODY, "text": f"{marker} " + str(BODY["text"])}
    fleet = await harness.fleet()
    quiet = await harness.proxy(fleet.urls)
    loud = await harness.proxy(fleet.urls, **{"telemetry.log_prompts": True})
    with caplog.at_level(logging.DEBUG):
        assert (await post(client, base(quiet) + "/generate", body=body))[0] == 200
        quiet_lines = [r.getMessage() for r in caplog.records if r.name == "radixgate.requests"]
        everything = "\n".join(r.getMessage() for r in caplog.records)
        caplog.clear()
        assert (await post(client, base(loud) + "/generate", body=body))[0] == 200
        loud_lines = [r.getMessage() for r in caplog.records if r.name == "radixgate.requests"]
    assert len(quiet_lines) == 1 and json.loads(quiet_lines[0])["status"] == 200
    assert marker not in everything
    assert len(loud_lines) == 1 and marker in json.loads(loud_lines[0])["prompt"]  # the check can fail


async def test_a_serving_process_logs_neither_keys_nor_prompts(harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    marker = "walrus-indigo-marker-9034"
    config = {"workers": {"static": fleet.urls}, "health": {"interval_s": 0.2}, "scrape": {"interval_s": 0.2}}
    async with proxy_process(config, tmp_path, args=["--log-level", "debug"],
                             env={"RADIXGATE_API_KEYS": KEY}) as proxy, aiohttp.ClientSession() as s:
        prompted = {**BODY, "text": f"{marker} once upon a time"}
        for headers, want in (({"Authorization": f"Bearer {KEY}"}, 200), ({"x-api-key": KEY}, 200),
                              ({"Authorization": f"Bearer {OTHER_KEY}"}, 401), ({}, 401)):
            async with s.post(proxy.http + "/generate", json=prompted, headers=headers) as r:
                assert r.status == want
        streamed = {**prompted, "stream": True}
        async with s.post(proxy.http + "/generate", json=streamed, headers={"x-api-key": KEY}) as r:
            assert r.status == 200 and (await r.text()).endswith("[DONE]\n\n")
        async with s.post(proxy.http + "/generate", data=f'{{"text": "{marker}', headers={"x-api-key": KEY}) as r:
            assert r.status == 400
        assert await proxy.terminate() == 0
    log = proxy.stderr()
    request_lines = [json.loads(line) for line in log.splitlines() if line.startswith('{"rid"')]
    assert len(request_lines) == 6, log[-3000:]  # the lines are there: the test can see what is logged
    assert {line["status"] for line in request_lines} == {200, 400, 401}
    assert KEY not in log and OTHER_KEY not in log
    assert marker not in log


UPSTREAM_ENV = "RADIXGATE_TEST_UPSTREAM_KEY"
WORKER_KEY = "sglang-worker-key-5d1e"


async def protected_fleet(harness: Harness, key: str) -> list[str]:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, api_key=key), SimConfig(time_scale=FAST, api_key=key)])
    return fleet.urls


async def test_workers_started_with_an_api_key_get_the_configured_upstream_key_not_the_callers(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UPSTREAM_ENV, WORKER_KEY)
    urls = await protected_fleet(harness, WORKER_KEY)
    app = await harness.proxy(urls, **{"security.api_keys_file": key_file(tmp_path, KEY), "security.api_keys_env": "",
                                       "security.upstream_api_key_env": UPSTREAM_ENV})
    for _ in range(4):  # both workers, round robin
        assert (await post(client, base(app) + "/generate", {"Authorization": f"Bearer {KEY}"}))[0] == 200


async def test_a_key_meant_for_radixgate_is_never_passed_on_to_a_worker(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    # The workers would accept the caller's own key, so only withholding it can make them refuse.
    urls = await protected_fleet(harness, KEY)
    app = await harness.proxy(urls, **{"security.api_keys_file": key_file(tmp_path, KEY), "security.api_keys_env": "",
                                       "security.upstream_api_key_env": UPSTREAM_ENV})
    status, _, body = await post(client, base(app) + "/generate", {"Authorization": f"Bearer {KEY}"})
    assert status != 200 and "error" in body


async def test_without_keys_of_its_own_radixgate_passes_the_callers_authorization_through(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    urls = await protected_fleet(harness, WORKER_KEY)
    app = await harness.proxy(urls, **{"security.api_keys_env": "", "security.upstream_api_key_env": UPSTREAM_ENV})
    assert (await post(client, base(app) + "/generate", {"Authorization": f"Bearer {WORKER_KEY}"}))[0] == 200
    assert (await post(client, base(app) + "/generate"))[0] != 200


async def test_expect_100_continue_without_a_key_gets_the_401_before_any_body_is_sent(
        harness: Harness, tmp_path: Path) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, **{"security.api_keys_file": key_file(tmp_path, KEY),
                                             "security.api_keys_env": ""})
    body = json.dumps(BODY).encode()

    async def first_answer(auth: str) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", app.http_port)
        try:
            writer.write((f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n{auth}\r\n").encode())
            await writer.drain()
            return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        finally:
            writer.close()

    refused = await first_answer("")
    assert refused.startswith(b"HTTP/1.1 401 ") and b"WWW-Authenticate: Bearer" in refused
    assert (await first_answer("Authorization: Bearer wrong\r\n")).startswith(b"HTTP/1.1 401 ")
    assert await first_answer(f"Authorization: Bearer {KEY}\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
