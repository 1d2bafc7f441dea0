"""The OpenAI Responses API through a real radixgate in front of simulated SGLang workers.

The openai SDK (sync and async) creates responses, streamed and not; the token counters equal the
workers' own; a follow-up (``previous_response_id``) goes to the worker that stored the
conversation, whatever the policy (round robin here) would pick, and reuses its cache; GET and
cancel reach that worker; an id the proxy never saw is found by asking the workers; an id no
worker has is a 404, a malformed one a 400, a follow-up whose worker is down a 503.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import App
from proxy.frontends import responses_api
from proxy.sim.config import SimConfig
from tests.fixtures.broken_worker import BrokenWorker, http
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.test_openai_sdk import MODES, _call, _drain, _tokens_match_worker
from tests.integration.test_usage_accounting import MODEL, _samples

SYSTEM = "You answer questions about the radix cache of a serving engine, briefly and exactly. " * 6


def _sim(**kw: Any) -> SimConfig:
    return SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True, **kw)


async def _start(harness: Harness, workers: int = 1) -> tuple[App, list[str]]:
    fleet = await harness.fleet([_sim() for _ in range(workers)])
    return await harness.proxy(fleet.urls), fleet.urls


@pytest.mark.parametrize("mode", MODES)
async def test_create_whole_and_the_counters_equal_the_workers(harness: Harness, client: aiohttp.ClientSession,
                                                               mode: str) -> None:
    app, (worker,) = await _start(harness)

    def make(c: Any) -> Any:
        return c.responses.create(model=MODEL, instructions=SYSTEM, input="What is a radix tree?",
                                  max_output_tokens=8)
    got = await _call(mode, app, make)
    assert got.id.startswith("resp_") and got.status == "completed" and got.output_text
    assert got.usage.output_tokens == 8 and got.usage.input_tokens > 100
    await _tokens_match_worker(client, app, worker)


@pytest.mark.parametrize("mode", MODES)
async def test_create_streamed_counts_its_deltas_and_ends_completed(harness: Harness,
                                                                    client: aiohttp.ClientSession, mode: str) -> None:
    app, (worker,) = await _start(harness)

    def make(c: Any) -> Any:
        return c.responses.create(model=MODEL, instructions=SYSTEM, input="Stream it.", max_output_tokens=6,
                                  stream=True)
    if mode == "sync":
        events = await _call(mode, app, lambda c: list(make(c)))
    else:
        events = await _call(mode, app, lambda c: _drain_async(make(c)))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and text == final.output_text and final.usage.output_tokens == 6
    await _tokens_match_worker(client, app, worker)
    # The proxy measured the stream's first token at the first delta, not at response.created.
    p = await _samples(client, admin(app))
    assert p.get("radixgate_ttft_seconds_count", 0) >= 1


async def _drain_async(pending: Any) -> list[Any]:
    return await _drain(await pending)


async def _post(client: aiohttp.ClientSession, app: App, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with client.post(base(app) + "/v1/responses", json=body) as r:
        return r.status, await r.json()


async def _value(client: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    async with client.get(url + "/metrics") as r:
        text = await r.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())


async def _decisions(client: aiohttp.ClientSession, app: App, branch: str) -> float:
    return await _value(client, admin(app), "radixgate_policy_decisions_total", branch=branch)


async def test_a_follow_up_goes_to_the_worker_holding_the_conversation(harness: Harness,
                                                                       client: aiohttp.ClientSession) -> None:
    app, urls = await _start(harness, workers=3)
    status, first = await _post(client, app, {"model": MODEL, "instructions": SYSTEM, "input": "Turn one.",
                                              "max_output_tokens": 4})
    assert status == 200
    turn_prompt = first["usage"]["input_tokens"]
    rid = first["id"]
    for i in range(4):  # round robin would move each of these to the next worker
        status, reply = await _post(client, app, {"model": MODEL, "previous_response_id": rid,
                                                  "input": f"Turn {i + 2}.", "max_output_tokens": 4})
        assert status == 200, reply
        # The worker prepended the stored conversation, and had it cached.
        assert reply["usage"]["input_tokens"] > turn_prompt
        assert reply["usage"]["input_tokens_details"]["cached_tokens"] >= turn_prompt - 64, reply["usage"]
        turn_prompt, rid = reply["usage"]["input_tokens"], reply["id"]
    assert await _decisions(client, app, "pinned") == 4
    # The routing telemetry counts the one decision a policy made: the pinned turns predicted
    # nothing (their prompt is the stored conversation, not what the proxy keyed).
    routed = await _value(client, admin(app), "radixgate_routing_prompt_tokens_total")
    assert routed == first["usage"]["input_tokens"]
    async with client.get(base(app) + f"/v1/responses/{rid}") as r:
        assert r.status == 200
        holder = r.headers["X-Radixgate-Worker"]
        assert holder in urls and (await r.json())["id"] == rid
    # Every turn ran on one worker: its finished requests are all five.
    served = [(await _samples(client, u)).get("sglang:num_requests_total", 0.0) for u in urls]
    assert served[urls.index(holder)] == 5, served
    # A synchronous response cannot be cancelled: the worker's own 400, relayed.
    async with client.post(base(app) + f"/v1/responses/{rid}/cancel") as r:
        assert r.status == 400 and r.headers["X-Radixgate-Worker"] == holder


async def test_sdk_retrieve_and_the_ids_the_proxy_never_saw(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([_sim(), _sim()])
    one = await harness.proxy(fleet.urls)
    made = await _call("async", one, lambda c: c.responses.create(model=MODEL, input="hello", max_output_tokens=3))
    got = await _call("sync", one, lambda c: c.responses.retrieve(made.id))
    assert got.id == made.id and got.output_text == made.output_text
    # A second replica (or this one after a restart) never saw the id: it asks the workers.
    two = await harness.proxy(fleet.urls)
    again = await _call("sync", two, lambda c: c.responses.retrieve(made.id))
    assert again.id == made.id
    status, follow = await _post(client, two, {"model": MODEL, "previous_response_id": made.id, "input": "more",
                                               "max_output_tokens": 3})
    assert status == 200 and follow["usage"]["input_tokens_details"]["cached_tokens"] > 0
    lookups = "radixgate_response_lookups_total"
    assert await _value(client, admin(two), lookups, outcome="found") == 1
    assert await _value(client, admin(two), lookups, outcome="known") == 1  # the second lookup knew it
    # No worker has it: the SDK's NotFoundError, in the OpenAI error shape.
    with pytest.raises(openai.NotFoundError):
        await _call("async", two, lambda c: c.responses.retrieve("resp_nobody_has_this"))
    status, body = await _post(client, two, {"model": MODEL, "previous_response_id": "resp_nobody", "input": "x"})
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    async with client.get(base(two) + "/v1/responses/bad%2Fid") as r:
        assert r.status in (400, 404)  # never forwarded into a worker's path
    status, body = await _post(client, two, {"model": MODEL, "previous_response_id": "a/b", "input": "x"})
    assert status == 400 and "previous_response_id" in body["error"]["message"]
    p = await _samples(client, admin(two))  # every accepted request ended, as a success or a counted error
    assert p["radixgate_requests_accepted_total"] == p.get("radixgate_requests_succeeded_total", 0) + p.get(
        "radixgate_requests_failed_total", 0)


async def test_a_follow_up_whose_worker_is_down_is_503_not_sent_elsewhere(harness: Harness,
                                                                          client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([_sim(), _sim()])
    app = await harness.proxy(fleet.urls)
    status, first = await _post(client, app, {"model": MODEL, "input": "remember me", "max_output_tokens": 2})
    assert status == 200
    async with client.get(base(app) + f"/v1/responses/{first['id']}") as r:
        holder = r.headers["X-Radixgate-Worker"]
    await fleet.workers[fleet.urls.index(holder)].stop()

    async def marked_down() -> bool:
        async with client.get(admin(app) + "/workers") as r:
            return any(w["url"] == holder and not w["healthy"] for w in (await r.json())["workers"])
    await eventually(marked_down, timeout_s=10.0, what="the stopped worker marked unhealthy")
    status, body = await _post(client, app, {"model": MODEL, "previous_response_id": first["id"], "input": "x"})
    assert status == 503, body
    other = next(u for u in fleet.urls if u != holder)
    assert (await _samples(client, other)).get("sglang:num_requests_total", 0.0) == 0  # nothing sent there


async def test_background_responses_are_polled_and_cancelled_on_their_worker(harness: Harness,
                                                                            client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([_sim(), _sim(), _sim()])
    app = await harness.proxy(fleet.urls)
    status, queued = await _post(client, app, {"model": MODEL, "input": "later", "background": True,
                                               "max_output_tokens": 4})
    assert status == 200 and queued["status"] in ("queued", "in_progress"), queued

    async def completed() -> bool:
        async with client.get(base(app) + f"/v1/responses/{queued['id']}") as r:
            assert r.status == 200
            return bool((await r.json())["status"] == "completed")
    await eventually(completed, timeout_s=10.0, what="the background response completed")
    # A long one, cancelled while it runs: the cancel reaches the worker generating it.
    status, long = await _post(client, app, {"model": MODEL, "input": "a long essay", "background": True,
                                             "max_output_tokens": 100_000})
    assert status == 200
    async with client.post(base(app) + f"/v1/responses/{long['id']}/cancel") as r:
        assert r.status == 200, await r.text()
        assert (await r.json())["status"] == "cancelled"
    async with client.get(base(app) + f"/v1/responses/{long['id']}") as r:
        assert (await r.json())["status"] == "cancelled"
    # Every lookup knew the worker from the answer that passed through: none had to ask the fleet.
    assert await _value(client, admin(app), "radixgate_response_lookups_total", outcome="known") >= 3
    assert await _value(client, admin(app), "radixgate_response_lookups_total", outcome="found") == 0


async def test_lookups_are_charged_to_the_rate_limit(harness: Harness, client: aiohttp.ClientSession,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RADIXGATE_API_KEYS", raising=False)
    fleet = await harness.fleet([_sim(), _sim()])
    app = await harness.proxy(fleet.urls, **{"limits.rate_limit_rps": 0.5, "limits.rate_limit_burst": 2})
    statuses = []
    for i in range(3):  # each unknown id asks both workers: a flood of them is charged like requests
        async with client.get(base(app) + f"/v1/responses/resp_made_up_{i}") as r:
            statuses.append(r.status)
    assert statuses == [404, 404, 429]


async def test_searches_for_unknown_ids_are_bounded_while_a_worker_does_not_answer(
        harness: Harness, client: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch) -> None:
    not_found = http(404, b'{"object": "error", "message": "not found", "code": 404}')
    async with BrokenWorker.running() as worker:
        for i in range(5):  # a worker that sits 2 s on every lookup, then has nothing
            worker.on(f"/v1/responses/resp_unknown_{i}", [2.0, *not_found])
        fleet = await harness.fleet([_sim()])
        monkeypatch.setattr(responses_api, "MAX_SEARCHES", 2)
        app = await harness.proxy([*fleet.urls, worker.url], **{"scrape.timeout_s": 5.0})

        async def both_healthy() -> bool:
            async with client.get(admin(app) + "/workers") as r:
                return all(w["healthy"] for w in (await r.json())["workers"])
        await eventually(both_healthy, timeout_s=10.0, what="both workers healthy")

        async def lookup(i: int) -> int:
            async with client.get(base(app) + f"/v1/responses/resp_unknown_{i}") as r:
                return r.status
        waiting = [asyncio.ensure_future(lookup(i)) for i in range(2)]

        async def two_in_flight() -> bool:
            return not any(t.done() for t in waiting) and responses_searching(app) == 2
        await eventually(two_in_flight, timeout_s=5.0, what="two searches waiting on the slow worker")
        assert await lookup(3) == 429  # a third would ask the slow worker too: refused at once
        assert await asyncio.gather(*waiting) == [404, 404]
        assert await lookup(4) == 404  # the bound is on searches in flight, not a count


def responses_searching(app: App) -> int:
    """Searches in flight on ``app``'s public port."""
    return app.public_app[responses_api.FRONT].searching


async def test_endpoints_the_worker_does_not_serve_answer_as_the_worker_does_and_forget_nothing(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """SGLang 0.5.23 serves no DELETE and no input_items: the holder's own answer is relayed, and the
    proxy still knows where the response lives."""
    app, urls = await _start(harness, workers=2)
    status, made = await _post(client, app, {"model": MODEL, "input": "keep me", "max_output_tokens": 2})
    assert status == 200
    rid = made["id"]
    async with client.get(base(app) + f"/v1/responses/{rid}/input_items?limit=5") as r:
        assert r.status == 404 and r.headers["X-Radixgate-Worker"] in urls
    async with client.delete(base(app) + f"/v1/responses/{rid}") as r:
        assert r.status == 405 and r.headers["X-Radixgate-Worker"] in urls
    async with client.get(base(app) + f"/v1/responses/{rid}") as r:
        assert r.status == 200
    lookups = "radixgate_response_lookups_total"
    assert await _value(client, admin(app), lookups, outcome="found") == 0  # never had to search again
    assert await _value(client, admin(app), lookups, outcome="known") == 3
