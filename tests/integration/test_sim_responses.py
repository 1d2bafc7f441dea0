"""The simulated worker's OpenAI Responses API (SGLang 0.5.23) over real HTTP, and through the openai SDK.

Every usage figure is checked against the worker's own counters (``bench_stats``), which the
proxy's accounting tests compare with the proxy's: a Responses request must move them as a chat
request does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import openai
import pytest

from proxy.sim.config import SimConfig
from proxy.sim.server import SimWorker
from tests.fixtures.sim_client import counter_delta, named_events, one_worker, poll

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FAST = 200.0
SLOW = 1.0  # real time: ~7 ms a decode step, so a long answer is still running when the test looks


@dataclass
class Sim:
    url: str
    session: aiohttp.ClientSession
    worker: SimWorker

    async def post(self, body: dict[str, Any], path: str = "/v1/responses") -> tuple[int, Any]:
        async with self.session.post(self.url + path, json=body) as resp:
            return resp.status, await resp.json()

    async def get(self, response_id: str) -> tuple[int, Any]:
        async with self.session.get(f"{self.url}/v1/responses/{response_id}") as resp:
            return resp.status, await resp.json()

    async def cancel(self, response_id: str) -> tuple[int, Any]:
        async with self.session.post(f"{self.url}/v1/responses/{response_id}/cancel") as resp:
            return resp.status, await resp.json()


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


async def test_a_response_has_sglangs_shape_and_the_workers_own_usage(sim: Sim) -> None:
    before = sim.worker.bench_stats()
    status, body = await sim.post({"model": MODEL, "input": "tell me about radix trees", "instructions": "be brief",
                                   "max_output_tokens": 6, "rid": "ignored", "tools": []})
    assert status == 200
    counted = counter_delta(before, sim.worker.bench_stats())
    assert body["id"].startswith("resp_") and body["object"] == "response" and body["status"] == "completed"
    assert body["model"] == MODEL and isinstance(body["created_at"], int)
    [item] = body["output"]
    assert item["type"] == "message" and item["role"] == "assistant" and item["status"] == "completed"
    assert item["id"].startswith("msg_")
    [part] = item["content"]
    assert part["type"] == "output_text" and part["annotations"] == [] and len(part["text"].split()) == 6
    usage = body["usage"]
    assert usage == {"input_tokens": counted["prompt_tokens"],
                     "input_tokens_details": {"cached_tokens": counted["cached_tokens"], "cache_write_tokens": 0},
                     "output_tokens": 6, "output_tokens_details": {"reasoning_tokens": 0},
                     "total_tokens": counted["prompt_tokens"] + 6}
    assert counted["requests"] == 1
    assert (body["instructions"], body["max_output_tokens"], body["previous_response_id"], body["store"]) == \
        ("be brief", 6, None, True)
    assert body["text"] == {"format": {"type": "text"}} and body["error"] is None and body["metadata"] == {}
    assert sim.worker.engine.by_rid == {}  # finished, nothing left behind under the rid
    # The same conversation sent to chat tokenizes to the same prompt.
    chat = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "tell me about radix trees"}], "max_tokens": 1}
    status, answer = await sim.post(chat, "/v1/chat/completions")
    assert status == 200 and answer["usage"]["prompt_tokens"] == usage["input_tokens"]


async def test_request_id_names_the_response_and_the_default_length_is_sglangs(sim: Sim) -> None:
    status, body = await sim.post({"input": "hi", "request_id": "resp_mine"})
    assert status == 200 and body["id"] == "resp_mine"
    assert body["usage"]["output_tokens"] == 128  # protocol.DEFAULT_MAX_NEW_TOKENS
    status, again = await sim.get("resp_mine")
    assert status == 200 and again == body


async def test_a_stream_sends_named_events_in_order_with_sequence_numbers(sim: Sim) -> None:
    before = sim.worker.bench_stats()
    async with sim.session.post(sim.url + "/v1/responses",
                                json={"input": "stream this please", "stream": True, "max_output_tokens": 5}) as resp:
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.text()
    counted = counter_delta(before, sim.worker.bench_stats())
    assert "[DONE]" not in raw
    events = named_events(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * 5,
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"]
    created = events[0]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    item_id = events[2]["item"]["id"]
    assert events[2]["item"]["status"] == "in_progress" and events[2]["item"]["content"] == []
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": []}
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert all(e["item_id"] == item_id and e["output_index"] == 0 and e["content_index"] == 0 for e in deltas)
    text = "".join(e["delta"] for e in deltas)
    assert len(text.split()) == 5 and events[-4]["text"] == text and events[-3]["part"]["text"] == text
    assert events[-2]["item"]["status"] == "completed"
    final = events[-1]["response"]
    assert final["id"] == created["id"] and final["status"] == "completed"
    assert final["output"][0]["id"] == item_id and final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["input_tokens"] == counted["prompt_tokens"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == counted["cached_tokens"]
    assert final["usage"]["output_tokens"] == 5 and counted["requests"] == 1
    status, stored = await sim.get(created["id"])
    assert status == 200 and stored == final


async def test_stream_interval_groups_tokens_into_fewer_deltas() -> None:
    async with _sim(SimConfig(time_scale=FAST, stream_interval=3)) as s:
        async with s.session.post(s.url + "/v1/responses",
                                  json={"input": "chunks", "stream": True, "max_output_tokens": 7}) as resp:
            events = named_events(await resp.text())
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        # the first token at once, then every 3 tokens, and the rest at the end: 1 + 3 + 3
        assert [len(d.split()) for d in deltas] == [1, 3, 3]


async def test_a_follow_up_extends_the_previous_prompt_and_hits_the_cache(sim: Sim) -> None:
    first_input = [{"type": "message", "role": "user",
                    "content": [{"type": "input_text", "text": "a long first question about prefix caches"}]}]
    status, first = await sim.post({"input": first_input, "instructions": "answer plainly", "max_output_tokens": 8})
    assert status == 200
    p1, n1 = first["usage"]["input_tokens"], first["usage"]["output_tokens"]
    status, second = await sim.post({"input": "and a second one", "previous_response_id": first["id"],
                                     "max_output_tokens": 4})
    assert status == 200 and second["previous_response_id"] == first["id"]
    p2, cached = second["usage"]["input_tokens"], second["usage"]["input_tokens_details"]["cached_tokens"]
    page = sim.worker.config.page_size
    assert p2 > p1 + n1
    # The whole first prompt (and its answer, re-tokenized from the text) is a prefix of this one.
    assert cached >= p1 + n1 - page
    # The conversation it was rendered from: the first turn's messages, its answer as the assistant.
    chat = {"messages": [{"role": "system", "content": "answer plainly"},
                         {"role": "user", "content": "a long first question about prefix caches"},
                         {"role": "assistant", "content": first["output"][0]["content"][0]["text"]},
                         {"role": "user", "content": "and a second one"}], "max_tokens": 1}
    status, answer = await sim.post(chat, "/v1/chat/completions")
    assert status == 200 and answer["usage"]["prompt_tokens"] == p2


async def test_unknown_and_malformed_ids_get_sglangs_errors(sim: Sim) -> None:
    status, body = await sim.get("resp_nope")
    assert status == 404 and body == {"object": "error", "message": "Response with id 'resp_nope' not found.",
                                      "type": "invalid_request_error", "param": "response_id", "code": 404}
    status, body = await sim.get("chatcmpl-1")
    assert status == 400 and body == {
        "object": "error", "message": "Invalid 'response_id': 'chatcmpl-1'. Expected an ID that begins with 'resp'.",
        "type": "invalid_request_error", "param": "response_id", "code": 400}
    before = sim.worker.bench_stats()
    status, body = await sim.post({"input": "hi", "previous_response_id": "resp_nope"})
    assert status == 404 and body["message"] == "Response with id 'resp_nope' not found."
    status, body = await sim.post({"input": "hi", "previous_response_id": "nope"})
    assert status == 400 and body["param"] == "response_id"
    status, body = await sim.cancel("resp_nope")
    assert status == 404 and body["code"] == 404
    assert sim.worker.bench_stats() == before  # refused before the engine saw anything


@pytest.mark.parametrize("body", [
    {},
    {"input": 5},
    {"input": []},
    {"input": [{"role": "wizard", "content": "hi"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
    {"input": [{"type": "function_call", "name": "f"}]},
    {"input": "hi", "max_output_tokens": -1},
    {"input": "hi", "stream": "yes"},
    {"input": "hi", "background": True, "stream": True},
    {"input": "hi", "background": True, "store": False},
])
async def test_malformed_bodies_are_400(sim: Sim, body: dict[str, Any]) -> None:
    status, answer = await sim.post(body)
    assert status == 400 and answer["object"] == "error" and answer["code"] == 400
    assert sim.worker.bench_stats()["requests"] == 0


async def test_store_false_keeps_nothing(sim: Sim) -> None:
    status, body = await sim.post({"input": "forget me", "store": False, "max_output_tokens": 2})
    assert status == 200 and body["store"] is False
    assert (await sim.get(body["id"]))[0] == 404
    status, _ = await sim.post({"input": "more", "previous_response_id": body["id"]})
    assert status == 404


async def test_the_store_drops_the_least_recently_stored() -> None:
    async with _sim(SimConfig(time_scale=FAST, responses_store_max=2)) as s:
        ids = []
        for i in range(3):
            status, body = await s.post({"input": f"turn {i}", "max_output_tokens": 1})
            assert status == 200
            ids.append(body["id"])
        assert [(await s.get(i))[0] for i in ids] == [404, 200, 200]
        assert (await s.post({"input": "x", "previous_response_id": ids[0]}))[0] == 404


async def test_a_background_response_is_queued_then_runs_then_completes(slow: Sim) -> None:
    before = slow.worker.bench_stats()
    status, body = await slow.post({"input": "work in the background", "background": True,
                                    "max_output_tokens": 100})
    assert status == 200 and body["status"] == "queued" and body["output"] == [] and body["usage"] is None
    seen: list[str] = []

    async def completed() -> bool:
        status, got = await slow.get(body["id"])
        assert status == 200
        seen.append(got["status"])
        return bool(got["status"] == "completed")

    await poll(completed, limit_s=20.0, interval_s=0.02)
    assert "in_progress" in seen and set(seen) <= {"in_progress", "completed"}
    _, final = await slow.get(body["id"])
    counted = counter_delta(before, slow.worker.bench_stats())
    assert len(final["output"][0]["content"][0]["text"].split()) == 100
    assert final["usage"]["output_tokens"] == 100 and counted["requests"] == 1
    assert final["usage"]["input_tokens"] == counted["prompt_tokens"]
    status, answer = await slow.cancel(body["id"])  # finished: nothing left to cancel
    assert status == 400 and answer["message"] == "Cannot cancel a synchronous response."


async def test_cancelling_a_background_response_aborts_its_generation(slow: Sim) -> None:
    status, body = await slow.post({"input": "a very long job", "background": True, "max_output_tokens": 4000})
    assert status == 200
    rid = body["id"]

    async def generating() -> bool:
        req = slow.worker.engine.by_rid.get(rid)  # the response id is the engine's rid
        return req is not None and len(req.output_ids) > 0

    await poll(generating, limit_s=10.0)
    status, cancelled = await slow.cancel(rid)
    assert status == 200 and cancelled["id"] == rid and cancelled["status"] == "cancelled"
    assert rid not in slow.worker.engine.by_rid
    assert slow.worker.bench_stats()["requests"] == 1  # counted as it ended (aborted)
    await asyncio.sleep(0.05)
    status, got = await slow.get(rid)
    assert status == 200 and got["status"] == "cancelled"  # the ended task did not overwrite it
    status, again = await slow.cancel(rid)
    assert status == 400 and again["type"] == "invalid_request_error"


async def test_stopping_the_worker_ends_a_background_response_as_failed(slow: Sim) -> None:
    status, body = await slow.post({"input": "doomed", "background": True, "max_output_tokens": 4000})
    assert status == 200
    await slow.worker.engine.stop()  # aborts every request with 503, as a shutdown does

    async def failed() -> bool:
        status, got = await slow.get(body["id"])
        return status == 200 and bool(got["status"] == "failed")

    await poll(failed, limit_s=10.0)


async def test_abort_request_by_the_response_id_ends_a_stream(slow: Sim) -> None:
    async with slow.session.post(slow.url + "/v1/responses",
                                 json={"input": "long story", "stream": True, "max_output_tokens": 4000}) as resp:
        first = await resp.content.readuntil(b"\n\n")
        rid = json.loads(first.split(b"\ndata: ", 1)[1])["response"]["id"]
        async with slow.session.post(slow.url + "/abort_request", json={"rid": rid}) as aborted:
            assert aborted.status == 200
        rest = await asyncio.wait_for(resp.content.read(), timeout=10.0)
    events = named_events((first + rest).decode())
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["usage"]["output_tokens"] < 4000
    assert rid not in slow.worker.engine.by_rid


async def test_a_server_abort_mid_stream_sends_an_error_event(slow: Sim) -> None:
    async with slow.session.post(slow.url + "/v1/responses",
                                 json={"input": "cut short", "stream": True, "max_output_tokens": 4000}) as resp:
        head = await resp.content.readuntil(b"event: response.output_text.delta\n")
        await slow.worker.engine.stop()  # the engine aborts its requests with 503
        rest = await asyncio.wait_for(resp.content.read(), timeout=10.0)
    events = named_events((head + rest).decode())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    error = events[-1]
    assert error["type"] == "error" and error["code"] == 503 and error["param"] is None
    assert "shutting down" in error["message"]
    assert "response.completed" not in [e["type"] for e in events]


async def test_a_client_that_leaves_a_stream_has_its_request_aborted(slow: Sim) -> None:
    resp = await slow.session.post(slow.url + "/v1/responses",
                                   json={"input": "nobody listens", "stream": True, "max_output_tokens": 4000})
    first = await resp.content.readuntil(b"\n\n")
    rid = json.loads(first.split(b"\ndata: ", 1)[1])["response"]["id"]
    assert rid in slow.worker.engine.by_rid
    resp.close()

    async def gone() -> bool:
        return rid not in slow.worker.engine.by_rid

    await poll(gone, limit_s=10.0)
    assert slow.worker.bench_stats()["requests"] == 0  # aborted, not finished
    assert (await slow.get(rid))[0] == 404  # nothing stored for a response never completed


async def test_the_fault_gate_refuses_responses_like_chat(sim: Sim) -> None:
    sim.worker.set_faults(error_rate=1.0)
    status, body = await sim.post({"input": "hi"})
    assert status == 500 and body["object"] == "error" and "fault_error_rate" in body["message"]
    assert sim.worker.bench_stats()["requests"] == 0


async def test_a_full_queue_is_503_before_any_event() -> None:
    async with _sim(SimConfig(time_scale=SLOW, max_running_requests=1, max_queued_requests=1)) as s:
        sched = s.worker.engine.scheduler
        running = asyncio.create_task(s.post({"input": "one", "max_output_tokens": 300}))

        async def admitted() -> bool:
            return sched.num_running == 1

        await poll(admitted, limit_s=10.0)
        queued = asyncio.create_task(s.post({"input": "two", "max_output_tokens": 1}))

        async def waiting() -> bool:
            return len(sched.waiting) == 1

        await poll(waiting, limit_s=10.0)
        status, body = await s.post({"input": "three", "stream": True})
        assert status == 503 and body["code"] == 503
        assert (await running)[0] == 200 and (await queued)[0] == 200


# -- the openai SDK ----------------------------------------------------------------------------------
async def test_the_openai_sdk_creates_streams_and_retrieves_responses(sim: Sim) -> None:
    async with openai.AsyncOpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0) as client:
        before = sim.worker.bench_stats()
        created = await client.responses.create(model=MODEL, input="hello from the sdk", max_output_tokens=5)
        counted = counter_delta(before, sim.worker.bench_stats())
        assert created.status == "completed" and len(created.output_text.split()) == 5
        assert created.usage is not None and created.usage.input_tokens == counted["prompt_tokens"]
        assert created.usage.output_tokens == 5 and created.usage.total_tokens == counted["prompt_tokens"] + 5

        stream = await client.responses.create(model=MODEL, input="and now stream", max_output_tokens=4,
                                               stream=True, previous_response_id=created.id)
        events = [event async for event in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        completed = events[-1].response
        assert completed.output_text == text and len(text.split()) == 4
        assert completed.usage is not None and completed.usage.output_tokens == 4
        assert completed.usage.input_tokens_details.cached_tokens >= created.usage.input_tokens

        got = await client.responses.retrieve(created.id)
        assert got.id == created.id and got.output_text == created.output_text
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve("resp_missing")


async def test_the_sync_openai_sdk_and_its_stream_helper(sim: Sim) -> None:
    """The blocking client on a thread of its own while the worker serves on this test's loop."""

    def use() -> tuple[str, str, int]:
        with openai.OpenAI(base_url=sim.url + "/v1", api_key="none", max_retries=0) as c:
            made = c.responses.create(model=MODEL, input="sync client", max_output_tokens=3)
            with c.responses.stream(model=MODEL, input="sync stream", max_output_tokens=2) as st:
                final = st.get_final_response()
            assert final.usage is not None
            return made.output_text, c.responses.retrieve(made.id).output_text, final.usage.output_tokens

    made_text, got_text, streamed = await asyncio.to_thread(use)
    assert len(made_text.split()) == 3 and got_text == made_text and streamed == 2
