"""The simulated worker's Anthropic Messages API (SGLang 0.5.23) over real HTTP.

Every usage figure is checked against the worker's own counters (``bench_stats``), which the
proxy's accounting tests compare with the proxy's: a message must move them as a chat request
does. The ``anthropic`` SDK is not installed here, so these tests speak aiohttp only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from proxy.sim.config import SimConfig
from proxy.sim.server import SimWorker
from tests.fixtures.sim_client import counter_delta, named_events, one_worker, poll

MODEL = "claude-sim"  # echoed back: SGLang answers with the request's model
FAST = 200.0
SLOW = 1.0  # real time: ~7 ms a decode step, so a long answer is still running when the test looks
STREAM_TYPES = ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                "message_delta", "message_stop"]


@dataclass
class Sim:
    url: str
    session: aiohttp.ClientSession
    worker: SimWorker

    async def post(self, body: Any, path: str = "/v1/messages") -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body) as resp:
            return resp.status, await resp.json()

    async def stream(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        async with self.session.post(self.url + "/v1/messages", json={**body, "stream": True}) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            return named_events(await resp.text())


@contextlib.asynccontextmanager
async def _sim(config: SimConfig) -> AsyncIterator[Sim]:
    async with one_worker(config) as (url, session, worker):
        yield Sim(url, session, worker)


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    async with _sim(SimConfig(time_scale=FAST, enable_cache_report=True, enable_metrics=True,
                              max_total_tokens=50_000)) as s:
        yield s


@pytest.fixture
async def slow() -> AsyncIterator[Sim]:
    async with _sim(SimConfig(time_scale=SLOW, enable_cache_report=True, max_total_tokens=50_000)) as s:
        yield s


def ask(text: str, max_tokens: int = 6, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **extra}


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")


async def test_a_message_has_anthropics_shape_and_the_workers_own_usage(sim: Sim) -> None:
    before = sim.worker.bench_stats()
    status, body = await sim.post(ask("tell me about radix trees", system="be brief", temperature=0.2, top_k=5))
    assert status == 200
    counted = counter_delta(before, sim.worker.bench_stats())
    assert body["id"].startswith("msg_") and len(body["id"]) == len("msg_") + 32
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", MODEL)
    [block] = body["content"]
    assert block["type"] == "text" and len(block["text"].split()) == 6
    assert (body["stop_reason"], body["stop_sequence"]) == ("max_tokens", None)
    assert body["usage"] == {"input_tokens": counted["prompt_tokens"], "output_tokens": 6,
                             "cache_read_input_tokens": counted["cached_tokens"]}
    assert counted["requests"] == 1 and counted["prompt_tokens"] > 0
    assert sim.worker.engine.by_rid == {}  # finished, nothing left behind under the rid
    # Asked again, the prompt is in the cache and the answer says so.
    status, again = await sim.post(ask("tell me about radix trees", system="be brief"))
    assert status == 200 and again["content"] == body["content"]
    assert 0 < again["usage"]["cache_read_input_tokens"] <= again["usage"]["input_tokens"]


async def test_cache_reads_are_zero_without_enable_cache_report() -> None:
    async with _sim(SimConfig(time_scale=FAST)) as s:
        for _ in range(2):
            status, body = await s.post(ask("the same prompt twice"))
            assert status == 200 and body["usage"]["cache_read_input_tokens"] == 0
        assert s.worker.bench_stats()["cached_tokens"] > 0  # the second one did hit the cache


async def test_a_stream_sends_anthropics_events_in_order(sim: Sim) -> None:
    status, whole = await sim.post(ask("stream this please", 5))
    assert status == 200
    before = sim.worker.bench_stats()
    events = await sim.stream(ask("stream this please", 5))
    counted = counter_delta(before, sim.worker.bench_stats())
    assert [e["type"] for e in events] == [*STREAM_TYPES[:2], *["content_block_delta"] * 5, *STREAM_TYPES[3:]]
    message = events[0]["message"]
    assert message["id"].startswith("msg_") and message["id"] != whole["id"]
    assert (message["type"], message["role"], message["model"], message["content"]) == \
        ("message", "assistant", MODEL, [])
    assert message["stop_reason"] is None and message["stop_sequence"] is None
    assert message["usage"] == {"input_tokens": 0, "output_tokens": 0, "cache_read_input_tokens": 0}
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [e for e in events if e["type"] == "content_block_delta"]
    assert all(e["index"] == 0 and e["delta"]["type"] == "text_delta" for e in deltas)
    assert streamed_text(events) == whole["content"][0]["text"]  # the same prompt, the same answer
    assert events[-3] == {"type": "content_block_stop", "index": 0}
    final = events[-2]
    assert final["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert final["usage"] == {"input_tokens": counted["prompt_tokens"], "output_tokens": 5,
                              "cache_read_input_tokens": counted["cached_tokens"]}
    assert counted["cached_tokens"] > 0 and counted["requests"] == 1  # the non-stream one cached it
    assert events[-1] == {"type": "message_stop"}


async def test_stream_interval_groups_tokens_into_fewer_deltas() -> None:
    async with _sim(SimConfig(time_scale=FAST, stream_interval=3)) as s:
        events = await s.stream(ask("chunks", 7))
        deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
        # the first token at once, then every 3 tokens, and the rest at the end: 1 + 3 + 3
        assert [len(d.split()) for d in deltas] == [1, 3, 3]


async def test_a_stop_sequence_ends_the_message_with_stop_sequence(sim: Sim) -> None:
    status, full = await sim.post(ask("say something long", 12))
    assert status == 200
    text = full["content"][0]["text"]
    stop = text.split()[3]
    expected = text[:text.find(stop)]  # the output ends where the stop first appears
    status, body = await sim.post(ask("say something long", 12, stop_sequences=["zzz", stop]))
    assert status == 200 and body["content"][0]["text"] == expected
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", stop)
    assert body["usage"]["output_tokens"] < 12
    events = await sim.stream(ask("say something long", 12, stop_sequences=[stop]))
    assert streamed_text(events) == expected
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


async def test_an_empty_answer_has_no_content_block(sim: Sim) -> None:
    status, full = await sim.post(ask("first word only", 4))
    assert status == 200
    first = full["content"][0]["text"].split()[0]
    status, body = await sim.post(ask("first word only", 4, stop_sequences=[first]))
    assert status == 200 and body["content"] == [] and body["stop_sequence"] == first
    events = await sim.stream(ask("first word only", 4, stop_sequences=[first]))
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


async def test_a_conversation_tokenizes_as_the_same_chat(sim: Sim) -> None:
    system = [{"type": "text", "text": "you are terse"}, {"type": "text", "text": "and exact"}]
    messages = [{"role": "user", "content": [{"type": "text", "text": "first question"},
                                             {"type": "text", "text": "in two parts"}]},
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": "second question"}]
    status, body = await sim.post({"model": MODEL, "max_tokens": 1, "system": system, "messages": messages})
    assert status == 200
    chat = [{"role": "system", "content": "you are terse\nand exact"},
            {"role": "user", "content": "first question in two parts"},
            {"role": "assistant", "content": "an answer"}, {"role": "user", "content": "second question"}]
    status, answer = await sim.post({"messages": chat, "max_tokens": 1}, "/v1/chat/completions")
    assert status == 200 and answer["usage"]["prompt_tokens"] == body["usage"]["input_tokens"]
    # The system prompt as one string makes the same prompt.
    status, plain = await sim.post({"model": MODEL, "max_tokens": 1, "system": "you are terse\nand exact",
                                    "messages": messages})
    assert status == 200 and plain["usage"]["input_tokens"] == body["usage"]["input_tokens"]
    status, bare = await sim.post({"model": MODEL, "max_tokens": 1, "messages": messages})
    assert status == 200 and bare["usage"]["input_tokens"] < body["usage"]["input_tokens"]


async def test_tool_results_become_tool_turns(sim: Sim) -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}
    messages = [{"role": "user", "content": "weather in Oslo?"},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": "light rain, 4 degrees"}]},
                                             {"type": "text", "text": "so, a coat?"}]}]
    status, body = await sim.post({"model": MODEL, "max_tokens": 3, "messages": messages})
    assert status == 200 and body["stop_reason"] == "max_tokens"
    chat = [{"role": "user", "content": "weather in Oslo?"},
            {"role": "assistant", "content": json.dumps({"name": "weather", "parameters": {"city": "Oslo"}})},
            {"role": "tool", "content": "light rain, 4 degrees"},
            {"role": "user", "content": "so, a coat?"}]
    status, answer = await sim.post({"messages": chat, "max_tokens": 1}, "/v1/chat/completions")
    assert status == 200 and answer["usage"]["prompt_tokens"] == body["usage"]["input_tokens"]


async def test_count_tokens_is_the_prompt_a_message_would_have(sim: Sim) -> None:
    request = ask("how many tokens is this", 2, system=[{"type": "text", "text": "count me too"}])
    status, body = await sim.post(request)
    assert status == 200
    before = sim.worker.bench_stats()
    counting = {k: v for k, v in request.items() if k != "max_tokens"}
    status, counted = await sim.post(counting, "/v1/messages/count_tokens")
    assert status == 200 and counted == {"input_tokens": body["usage"]["input_tokens"]}
    assert sim.worker.bench_stats() == before  # counting generates nothing
    status, error = await sim.post({"model": MODEL, "messages": []}, "/v1/messages/count_tokens")
    assert status == 400 and error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [
    [],
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ask("hi", 0),
    {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    {"model": MODEL, "max_tokens": 4, "messages": []},
    {"model": MODEL, "max_tokens": 4, "messages": [{"role": "system", "content": "hi"}]},
    {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
    {"model": MODEL, "max_tokens": 4, "messages": [{"role": "assistant", "content": [{"type": "thinking"}]}]},
    ask("hi", stop_sequences="halt"),
    ask("hi", stream="yes"),
])
async def test_malformed_bodies_are_400_in_anthropics_shape(sim: Sim, body: Any) -> None:
    status, answer = await sim.post(body)
    assert status == 400 and answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["message"]
    assert sim.worker.bench_stats()["requests"] == 0


async def test_invalid_json_is_400(sim: Sim) -> None:
    async with sim.session.post(sim.url + "/v1/messages", data=b"{not json",
                                headers={"Content-Type": "application/json"}) as resp:
        answer = await resp.json()
    assert resp.status == 400 and answer["error"]["type"] == "invalid_request_error"


async def test_abort_request_by_the_rid_ends_a_stream(slow: Sim) -> None:
    rid = "proxy-named-rid"
    async with slow.session.post(slow.url + "/v1/messages",
                                 json=ask("long story", 4000, rid=rid, stream=True)) as resp:
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10.0)  # with the first token
        assert rid in slow.worker.engine.by_rid
        async with slow.session.post(slow.url + "/abort_request", json={"rid": rid}) as aborted:
            assert aborted.status == 200
        rest = await asyncio.wait_for(resp.content.read(), timeout=10.0)
    events = named_events((first + rest).decode())
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    final = events[-2]
    assert final["type"] == "message_delta" and final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert 0 < final["usage"]["output_tokens"] < 4000
    assert rid not in slow.worker.engine.by_rid and slow.worker.bench_stats()["requests"] == 1


async def test_abort_request_by_the_rid_ends_a_non_stream_message(slow: Sim) -> None:
    rid = "non-stream-rid"
    pending = asyncio.create_task(slow.post(ask("another long story", 4000, rid=rid)))

    async def generating() -> bool:
        req = slow.worker.engine.by_rid.get(rid)
        return req is not None and len(req.output_ids) > 0

    await poll(generating, limit_s=10.0)
    async with slow.session.post(slow.url + "/abort_request", json={"rid": rid}) as aborted:
        assert aborted.status == 200
    status, body = await asyncio.wait_for(pending, timeout=10.0)
    assert status == 200 and body["stop_reason"] == "end_turn" and 0 < body["usage"]["output_tokens"] < 4000


async def test_a_server_abort_mid_stream_sends_an_error_event(slow: Sim) -> None:
    async with slow.session.post(slow.url + "/v1/messages", json=ask("cut short", 4000, stream=True)) as resp:
        head = await asyncio.wait_for(resp.content.readuntil(b"event: content_block_delta\n"), timeout=10.0)
        await slow.worker.engine.stop()  # the engine aborts its requests with 503
        rest = await asyncio.wait_for(resp.content.read(), timeout=10.0)
    events = named_events((head + rest).decode())
    error = events[-1]
    assert error["type"] == "error" and error["error"]["type"] == "api_error"
    assert "shutting down" in error["error"]["message"]
    assert not {"message_delta", "message_stop"} & {e["type"] for e in events}


async def test_a_client_that_leaves_a_stream_has_its_request_aborted(slow: Sim) -> None:
    rid = "leaver"
    resp = await slow.session.post(slow.url + "/v1/messages", json=ask("nobody listens", 4000, rid=rid, stream=True))
    await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=10.0)
    assert rid in slow.worker.engine.by_rid
    resp.close()

    async def gone() -> bool:
        return rid not in slow.worker.engine.by_rid

    await poll(gone, limit_s=10.0)
    assert slow.worker.bench_stats()["requests"] == 0  # aborted, not finished


async def test_the_fault_gate_refuses_messages_like_chat(sim: Sim) -> None:
    sim.worker.set_faults(error_rate=1.0)
    status, body = await sim.post(ask("hi"))
    assert status == 500 and body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "fault_error_rate" in body["error"]["message"]
    assert sim.worker.bench_stats()["requests"] == 0


async def test_a_full_queue_is_503_overloaded_before_any_event() -> None:
    async with _sim(SimConfig(time_scale=SLOW, max_running_requests=1, max_queued_requests=1)) as s:
        sched = s.worker.engine.scheduler
        running = asyncio.create_task(s.post(ask("one", 300)))

        async def admitted() -> bool:
            return sched.num_running == 1

        await poll(admitted, limit_s=10.0)
        queued = asyncio.create_task(s.post(ask("two", 1)))

        async def waiting() -> bool:
            return len(sched.waiting) == 1

        await poll(waiting, limit_s=10.0)
        status, body = await s.post(ask("three", stream=True))
        assert status == 503 and body["type"] == "error" and body["error"]["type"] == "overloaded_error"
        assert (await running)[0] == 200 and (await queued)[0] == 200


async def test_the_api_key_guards_messages_as_the_other_v1_routes() -> None:
    async with _sim(SimConfig(time_scale=FAST, api_key="sekrit")) as s:
        status, _ = await s.post(ask("hi", 1))
        assert status == 401
        async with s.session.post(s.url + "/v1/messages", json=ask("hi", 1),
                                  headers={"Authorization": "Bearer sekrit"}) as resp:
            assert resp.status == 200 and (await resp.json())["usage"]["output_tokens"] == 1


async def test_message_start_waits_for_the_first_token() -> None:
    """SGLang sends message_start with the chat stream's first chunk: a queued message sends nothing."""
    async with _sim(SimConfig(time_scale=SLOW, max_running_requests=1)) as s:
        sched = s.worker.engine.scheduler
        running = asyncio.create_task(s.post(ask("hog the batch", 4000, rid="hog")))

        async def admitted() -> bool:
            return sched.num_running == 1

        await poll(admitted, limit_s=10.0)
        async with s.session.post(s.url + "/v1/messages", json=ask("wait your turn", 2, stream=True)) as resp:
            assert resp.status == 200  # headers go out at once, as a StreamingResponse's do
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=0.3)
            assert len(sched.waiting) == 1
            s.worker.engine.abort("hog")
            events = named_events((await asyncio.wait_for(resp.content.read(), timeout=10.0)).decode())
        assert [e["type"] for e in events] == [*STREAM_TYPES[:2], *["content_block_delta"] * 2, *STREAM_TYPES[3:]]
        assert (await running)[0] == 200
