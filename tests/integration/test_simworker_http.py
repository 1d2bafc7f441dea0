"""The simulated SGLang worker over real HTTP: every endpoint and the exact stream framing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.fixtures.sim_client import json_events, sse_events

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
async def worker() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    config = SimConfig(time_scale=200.0, enable_metrics=True, worker_id="sim-a", max_total_tokens=50_000)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as session:
        yield fleet.urls[0], session


async def test_generate_returns_text_ids_and_meta_info(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.post(f"{url}/generate", json={"text": "hello world", "rid": "r1",
                                               "sampling_params": {"max_new_tokens": 5}}) as resp:
        assert resp.status == 200
        assert resp.headers["x-simworker-id"] == "sim-a"
        body = await resp.json()
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 5 and len(body["text"].split()) == 5
    assert meta["id"] == "r1"
    assert meta["finish_reason"] == {"type": "length", "length": 5}
    assert meta["prompt_tokens"] == 5  # BOS + hell o worl d
    assert meta["completion_tokens"] == 5
    for key in ("cached_tokens", "reasoning_tokens", "weight_version", "num_retractions", "e2e_latency",
                "queue_time", "first_token_latency"):
        assert key in meta
    async with s.put(f"{url}/generate", json={"input_ids": [1, 2, 3]}) as resp:
        body = await resp.json()
        assert resp.status == 200 and body["meta_info"]["completion_tokens"] == 128  # SGLang's default


async def test_generate_rejects_bad_bodies_with_an_error_object(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.post(f"{url}/generate", data=b"{not json") as resp:
        assert resp.status == 400 and "message" in (await resp.json())["error"]
    async with s.post(f"{url}/generate", json={"sampling_params": {}}) as resp:
        assert resp.status == 400 and "text or input_ids" in (await resp.json())["error"]["message"]


async def test_a_stream_sends_cumulative_chunks_then_done(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.post(f"{url}/generate", json={"text": "tell me", "stream": True,
                                               "sampling_params": {"max_new_tokens": 4}}) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = json_events(await resp.text())
    assert len(events) == 4
    texts = [e["text"] for e in events]
    assert all(texts[i + 1].startswith(texts[i]) and len(texts[i + 1]) > len(texts[i]) for i in range(3))
    assert [len(e["output_ids"]) for e in events] == [1, 2, 3, 4]
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None, None, None]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert "e2e_latency" in events[-1]["meta_info"] and "e2e_latency" not in events[0]["meta_info"]
    assert all("queue_time" in e["meta_info"] for e in events)
    assert "first_token_latency" in events[-1]["meta_info"]


async def test_stop_strings_end_the_request_with_the_matched_string(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    body = {"input_ids": [9, 8, 7], "sampling_params": {"max_new_tokens": 8}}
    async with s.post(f"{url}/generate", json=body) as resp:
        words = (await resp.json())["text"].split()
    body["sampling_params"]["stop"] = [words[3]]  # type: ignore[index]
    async with s.post(f"{url}/generate", json=body) as resp:
        out = await resp.json()
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": words[3]}
    assert out["text"].split() == words[: words.index(words[3])]


async def test_incremental_output_and_stream_interval() -> None:
    config = SimConfig(time_scale=200.0, incremental_streaming_output=True, stream_interval=3)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        async with s.post(f"{fleet.urls[0]}/generate", json={"text": "go", "stream": True,
                                                             "sampling_params": {"max_new_tokens": 7}}) as resp:
            events = json_events(await resp.text())
        async with s.post(f"{fleet.urls[0]}/generate", json={"text": "go", "sampling_params": {"max_new_tokens": 7}}) as resp:
            whole = await resp.json()
    assert [len(e["output_ids"]) for e in events] == [1, 3, 3]  # first token at once, then every 3
    assert [t for e in events for t in e["output_ids"]] == whole["output_ids"]
    assert " ".join(e["text"].strip() for e in events) == whole["text"]
    assert "queue_time" not in events[0]["meta_info"]  # metrics off: no timing fields


async def test_openai_completions_stream_and_usage() -> None:
    config = SimConfig(time_scale=200.0, enable_cache_report=True)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        async with s.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "once upon", "max_tokens": 3}) as resp:
            body = await resp.json()
        assert body["object"] == "text_completion" and body["model"] == MODEL
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 3
        assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 3
        assert "cached_tokens" in body["usage"]["prompt_tokens_details"]
        async with s.post(f"{url}/v1/completions", json={"prompt": "once upon", "max_tokens": 3, "stream": True,
                                                         "stream_options": {"include_usage": True}}) as resp:
            events = json_events(await resp.text())
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == body["choices"][0]["text"]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
        assert events[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the same prompt again


async def test_openai_chat_stream_and_cache_report_off(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    messages = [{"role": "user", "content": "hi there"}]
    async with s.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4}) as resp:
        body = await resp.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens_details"] is None  # needs --enable-cache-report
    async with s.post(f"{url}/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "stream": True}) as resp:
        events = json_events(await resp.text())
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == body["choices"][0]["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    async with s.post(f"{url}/v1/chat/completions", json={"messages": []}) as resp:
        err = await resp.json()
        assert resp.status == 400 and err["object"] == "error" and err["code"] == 400


async def test_info_endpoints(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.get(f"{url}/get_server_info") as resp:
        info = await resp.json()
    for key in ("max_running_requests", "chunked_prefill_size", "max_prefill_tokens", "schedule_policy",
                "page_size", "version", "internal_states"):
        assert key in info
    assert info["scheduler_info"]["max_total_num_tokens"] == 50_000
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == info["max_running_requests"]
    async with s.get(f"{url}/get_model_info") as resp:
        model = await resp.json()
    assert model["model_path"] == MODEL and model["is_generation"] is True
    async with s.get(f"{url}/v1/models") as resp:
        models = await resp.json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 131072
    async with s.get(f"{url}/v1/models/{MODEL}") as resp:
        assert resp.status == 200
    async with s.get(f"{url}/v1/models/other") as resp:
        assert resp.status == 404
    for path in ("/health", "/health_generate", "/ready"):
        async with s.get(f"{url}{path}") as resp:
            assert resp.status == 200 and resp.headers["x-simworker-id"] == "sim-a"


async def test_load_endpoints(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.get(f"{url}/v1/loads") as resp:
        body = await resp.json()
    snap = body["loads"][0]
    for key in ("dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
                "num_used_tokens", "num_total_tokens", "max_total_num_tokens", "max_running_requests",
                "token_usage", "gen_throughput", "cache_hit_rate", "utilization", "memory", "queues"):
        assert key in snap
    assert snap["max_total_num_tokens"] == 50_000
    async with s.get(f"{url}/v1/loads?include=core") as resp:
        assert "memory" not in (await resp.json())["loads"][0]
    async with s.get(f"{url}/v1/loads?include=bogus") as resp:
        assert resp.status == 400
    async with s.get(f"{url}/v1/loads?format=prometheus") as resp:
        text = await resp.text()
    assert 'sglang_num_running_reqs{dp_rank="0"} 0' in text
    assert 'sglang_memory_token_capacity{dp_rank="0"} 50000' in text
    async with s.get(f"{url}/get_load") as resp:
        assert (await resp.json()) == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


async def test_metrics_use_sglang_names(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.post(f"{url}/generate", json={"text": "count me", "sampling_params": {"max_new_tokens": 3}}) as resp:
        assert resp.status == 200
    async with s.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:cache_hit_rate",
                 "sglang:gen_throughput", "sglang:num_used_tokens", "sglang:max_total_num_tokens",
                 "sglang:page_size", "sglang:queue_time_seconds_bucket", "sglang:time_to_first_token_seconds_bucket",
                 "sglang:inter_token_latency_seconds_bucket", "sglang:e2e_request_latency_seconds_bucket",
                 "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
                 "sglang:num_requests_total", "sglang:num_aborted_requests_total"):
        assert name in text, name
    assert f'sglang:generation_tokens_total{{engine_type="unified",model_name="{MODEL}"}} 3.0' in text
    assert 'sglang:cache_config_info{model_name="' + MODEL + '",num_pages="50000",page_size="1"} 1.0' in text
    assert 'tp_rank="0"' in text


async def test_metrics_are_absent_without_enable_metrics() -> None:
    async with Fleet.in_process([SimConfig(time_scale=200.0)]) as fleet, aiohttp.ClientSession() as s:
        async with s.get(f"{fleet.urls[0]}/metrics") as resp:
            assert resp.status == 404


async def test_flush_cache_and_abort_request(worker: tuple[str, aiohttp.ClientSession]) -> None:
    url, s = worker
    async with s.post(f"{url}/generate", json={"text": "a b c d e f", "sampling_params": {"max_new_tokens": 2}}):
        pass
    async with s.post(f"{url}/flush_cache") as resp:
        assert resp.status == 200 and (await resp.text()).startswith("Cache flushed")
    async with s.post(f"{url}/generate", json={"text": "a b c d e f", "sampling_params": {"max_new_tokens": 2}}) as resp:
        assert (await resp.json())["meta_info"]["cached_tokens"] <= 1  # only BOS survives other traffic
    body = {"text": "long one", "rid": "victim", "stream": True, "sampling_params": {"max_new_tokens": 100_000 // 4}}
    async with s.post(f"{url}/generate", json=body) as resp:
        await resp.content.readuntil(b"\n\n")  # running now
        async with s.get(f"{url}/flush_cache") as flush:
            assert flush.status == 400
        async with s.post(f"{url}/abort_request", json={"rid": "victim"}) as abort:
            assert abort.status == 200
        events = sse_events((await resp.content.read()).decode())
    assert events[-1] == "[DONE]"
    assert '"type":"abort"' in events[-2]
