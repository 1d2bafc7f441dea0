"""The simulated worker behaves like an SGLang engine under load: cache hits, queueing, faults."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.fixtures.sim_client import json_events, load, poll, sse_events

LONG_PROMPT = " ".join(f"w{i % 97}x{i}" for i in range(3000))  # ~4.3k tokens


async def stream_ttft(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Client-measured time to the first data chunk, and the final chunk."""
    start = time.monotonic()
    async with session.post(f"{url}/generate", json={**body, "stream": True}) as resp:
        await resp.content.readuntil(b"\n\n")
        ttft = time.monotonic() - start
        rest = (await resp.content.read()).decode()
    return ttft, json_events(rest)[-1]


async def test_the_same_prompt_twice_hits_the_cache_and_starts_faster() -> None:
    # Real time (scale 1): the cold prefill takes ~0.1 s, far above scheduling noise on a busy machine.
    async with Fleet.in_process([SimConfig(time_scale=1.0)]) as fleet, aiohttp.ClientSession() as s:
        body = {"text": LONG_PROMPT, "sampling_params": {"max_new_tokens": 2}}
        cold_ttft, cold = await stream_ttft(s, fleet.urls[0], body)
        warm_ttft, warm = await stream_ttft(s, fleet.urls[0], body)
    prompt = cold["meta_info"]["prompt_tokens"]
    assert cold["meta_info"]["cached_tokens"] == 0
    assert warm["meta_info"]["cached_tokens"] == prompt - 1
    assert warm_ttft < cold_ttft / 2, (cold_ttft, warm_ttft)


async def test_a_multi_turn_chat_reuses_the_previous_turn() -> None:
    config = SimConfig(time_scale=50.0, enable_cache_report=True)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        messages = [{"role": "user", "content": LONG_PROMPT[:2000]}]
        async with s.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 6}) as resp:
            first = await resp.json()
        messages += [first["choices"][0]["message"], {"role": "user", "content": "and then?"}]
        async with s.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 6}) as resp:
            second = await resp.json()
    turn1 = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= turn1 - 1


async def test_overload_raises_queue_time() -> None:
    config = SimConfig(time_scale=2.0, enable_metrics=True, max_running_requests=2)
    body = {"text": "short prompt here", "sampling_params": {"max_new_tokens": 20}}
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]

        async def one(i: int) -> dict[str, Any]:
            async with s.post(f"{url}/generate", json={**body, "text": f"{body['text']} {i}"}) as resp:
                meta: dict[str, Any] = (await resp.json())["meta_info"]
                return meta

        alone = await one(-1)
        crowd = await asyncio.gather(*(one(i) for i in range(6)))
    waits = sorted(m["queue_time"] for m in crowd)
    assert waits[-1] > alone["e2e_latency"]  # the last pair waited for two batches of two to finish
    assert waits[-1] > 10 * alone["queue_time"]
    assert waits[0] < waits[-1] / 4


async def test_past_max_queued_requests_the_worker_answers_503() -> None:
    config = SimConfig(time_scale=20.0, max_running_requests=1, max_queued_requests=1, enable_metrics=True)
    long_body = {"text": "busy", "stream": True, "sampling_params": {"max_new_tokens": 5000}}
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        async with s.post(f"{url}/generate", json=long_body) as running:
            await running.content.readuntil(b"\n\n")
            queued = asyncio.create_task(s.post(f"{url}/generate", json={"text": "waits"}))

            async def one_waiting() -> bool:
                return (await load(s, url))["num_waiting_reqs"] == 1

            await poll(one_waiting)
            async with s.post(f"{url}/generate", json={"text": "rejected"}) as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["message"] == "The request queue is full."
            async with s.post(f"{url}/v1/completions", json={"prompt": "rejected"}) as resp:
                assert resp.status == 503
            async with s.post(f"{url}/abort_request", json={"abort_all": True}):
                pass
        (await queued).release()
        async with s.get(f"{url}/metrics") as resp:
            assert 'sglang:num_aborted_requests_total{engine_type="unified"' in await resp.text()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_disconnect_frees_its_slot_and_kv(stream: bool) -> None:
    async with Fleet.in_process([SimConfig(time_scale=20.0)]) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        body = {"text": LONG_PROMPT, "stream": stream, "sampling_params": {"max_new_tokens": 20_000}}
        # A non-streamed reply has no headers until the end: the request runs inside a task.
        request = asyncio.create_task(s.post(f"{url}/generate", json=body))

        async def running(n: int) -> bool:
            return (await load(s, url))["num_running_reqs"] == n

        await poll(lambda: running(1))
        assert (await load(s, url))["num_used_tokens"] > 0
        if stream:
            (await request).close()  # drop the connection mid-stream
        else:
            request.cancel()  # gives up before any byte of the reply: the connection closes
            with pytest.raises(asyncio.CancelledError):
                await request
        await poll(lambda: running(0))
        snap = await load(s, url)
    assert snap["num_used_tokens"] == 0 and snap["num_waiting_reqs"] == 0


async def test_fault_knobs_at_runtime() -> None:
    async with Fleet.in_process([SimConfig(time_scale=100.0)]) as fleet, aiohttp.ClientSession() as s:
        w, url = fleet.workers[0], fleet.urls[0]
        w.set_faults(fail_health=True)
        async with s.get(f"{url}/health") as resp:
            assert resp.status == 503
        w.set_faults(fail_health=False, error_rate=1.0)
        async with s.get(f"{url}/health") as resp:
            assert resp.status == 200
        async with s.post(f"{url}/generate", json={"text": "x"}) as resp:
            assert resp.status == 500 and "error" in await resp.json()
        w.set_faults(error_rate=0.0, hang_before_first_token=True)
        with pytest.raises(asyncio.TimeoutError):
            async with s.post(f"{url}/generate", json={"text": "x"}, timeout=aiohttp.ClientTimeout(total=0.3)):
                pass
        with pytest.raises(TypeError):
            w.set_faults(no_such_fault=True)


async def test_slow_start_answers_503_until_started() -> None:
    async with Fleet.in_process([SimConfig(time_scale=10.0, fault_slow_start=3.0)]) as fleet, \
            aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        async with s.get(f"{url}/health") as resp:
            assert resp.status == 503
        async with s.post(f"{url}/generate", json={"text": "x"}) as resp:
            assert resp.status == 503

        async def healthy() -> bool:
            async with s.get(f"{url}/health") as resp:
                return resp.status == 200

        await poll(healthy)


async def test_die_after_tokens_drops_connections_and_a_restart_comes_back_empty() -> None:
    config = SimConfig(time_scale=100.0, fault_die_after_tokens=30)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        w, url = fleet.workers[0], fleet.urls[0]
        async with s.post(f"{url}/generate", json={"text": "warm", "sampling_params": {"max_new_tokens": 10}}) as resp:
            assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(f"{url}/generate", json={"text": "dies", "stream": True,
                                                       "sampling_params": {"max_new_tokens": 100}}) as resp:
                await resp.read()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.get(f"{url}/health"):
                pass
        w.set_faults(die_after_tokens=None)
        await w.start()
        assert w.url == url
        async with s.post(f"{url}/generate", json={"text": "warm", "sampling_params": {"max_new_tokens": 1}}) as resp:
            assert (await resp.json())["meta_info"]["cached_tokens"] == 0  # a restart has an empty cache


async def test_a_subprocess_fleet_starts_kills_and_restarts_workers() -> None:
    configs = [SimConfig(time_scale=100.0, worker_id=f"proc-{i}") for i in range(2)]
    async with Fleet.subprocesses(configs) as fleet, aiohttp.ClientSession() as s:
        assert len(set(fleet.urls)) == 2
        for i, url in enumerate(fleet.urls):
            async with s.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}) as resp:
                assert resp.status == 200 and resp.headers["x-simworker-id"] == f"proc-{i}"
        url = fleet.urls[1]
        await fleet.workers[1].kill()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.get(f"{url}/health"):
                pass
        await fleet.workers[1].start()
        assert fleet.urls[1] == url
        async with s.get(f"{url}/health") as resp:
            assert resp.status == 200


async def test_a_stream_cut_by_shutdown_ends_with_an_error_chunk_then_done() -> None:
    async with Fleet.in_process([SimConfig(time_scale=20.0)]) as fleet, aiohttp.ClientSession() as s:
        body = {"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 5000}}
        async with s.post(f"{fleet.urls[0]}/generate", json=body) as resp:
            await resp.content.readuntil(b"\n\n")
            stopping = asyncio.create_task(fleet.workers[0].stop())
            events = sse_events((await resp.content.read()).decode())
            await stopping
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and error["type"] == "invalid_request_error" and error["retryable"] is False
