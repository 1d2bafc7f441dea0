"""Replicas sharing routing decisions (routing.peers) over real admin ports, in front of real
simulated workers: a prefix one proxy placed is found by another that never saw it."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from loadtests.bench_overhead import free_port
from proxy.loadgen.workloads import shared_prefix
from proxy.peers import PATH
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.reliability import scrape, total

SYSTEM_TOKENS = 300


async def generate(client: aiohttp.ClientSession, url: str, text: str) -> int:
    """Send one prompt; the cached tokens its worker reported."""
    body = {"text": text, "sampling_params": {"max_new_tokens": 2}}
    async with client.post(url + "/generate", json=body) as r:
        assert r.status == 200, await r.text()
        cached: int = (await r.json())["meta_info"]["cached_tokens"]
        return cached


async def test_a_replica_follows_the_placements_its_peer_told_it(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST) for _ in range(4)])
    # b routes with ttft; a (round robin, so not the placement b's hashing would pick) tells b.
    a_admin = free_port()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peers": [f"http://127.0.0.1:{a_admin}"]})
    a = await harness.proxy(fleet.urls, **{"routing.policy": "round_robin", "routing.peers": [admin(b)],
                                           "server.admin_port": a_admin, "routing.peer_heartbeat_s": 0.5})
    specs = shared_prefix(groups=8, prompts_per_group=2, system_tokens=SYSTEM_TOKENS, question_tokens=20,
                          output_tokens=2, shuffle=False)
    firsts, follow_ups = specs[0::2], specs[1::2]
    for spec in firsts:
        assert await generate(client, base(a), spec.text or "") < SYSTEM_TOKENS

    async def b_heard_all() -> bool:
        return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                     outcome="applied") >= len(firsts)

    await eventually(b_heard_all)
    for spec in reversed(follow_ups):  # another order than a's: b's own spread would differ
        assert await generate(client, base(b), spec.text or "") >= SYSTEM_TOKENS, spec.group
    m = await scrape(client, admin(b))
    assert total(m, "radixgate_policy_decisions_total", policy="ttft", branch="affinity") == len(follow_ups)
    # A streamed answer's first token is told too (b stops counting its prefill as queued).
    async with client.post(base(a) + "/generate", json={"text": "a stream " * 30, "stream": True,
                                                       "sampling_params": {"max_new_tokens": 4}}) as r:
        assert r.status == 200
        await r.read()

    async def b_heard_the_first_token() -> bool:
        m = await scrape(client, admin(b))
        return total(m, "radixgate_peer_decisions_received_total", outcome="prefilled") >= 1

    await eventually(b_heard_the_first_token)
    # A peer that answers its pings keeps its link: one connection all along.
    assert total(await scrape(client, admin(a)), "radixgate_peer_messages_total", peer=admin(b), outcome="closed") == 0
    assert total(await scrape(client, admin(a)), "radixgate_peer_messages_total", peer=admin(b), outcome="ok") >= 1


async def test_an_unreachable_peer_is_counted_and_serving_goes_on(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    a = await harness.proxy(fleet.urls, **{"routing.peers": [dead], "routing.peer_timeout_s": 0.2})
    for i in range(3):
        await generate(client, base(a), f"prompt number {i} " * 20)

    async def counted() -> bool:
        return total(await scrape(client, admin(a)), "radixgate_peer_messages_total", peer=dead,
                     outcome="connect_error") >= 1

    await eventually(counted)
    assert total(await scrape(client, admin(a)), "radixgate_requests_succeeded_total") == 3


async def test_a_proxy_without_peers_refuses_peer_connections(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    lone = await harness.proxy(fleet.urls, **{"routing.policy": "ttft"})
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(admin(lone) + PATH)
    assert refused.value.status == 404


async def test_peer_connections_and_messages_are_checked(harness: Harness, client: aiohttp.ClientSession,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RG_TEST_PEER_KEY", "s3cret")
    fleet = await harness.fleet()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peer_key_env": "RG_TEST_PEER_KEY",
                                           "routing.peers": ["http://127.0.0.1:9"]})
    good = {"v": 1, "decisions": [{"worker": fleet.urls[0], "model": "m", "block_tokens": 16, "prompt_tokens": 32,
                                   "blocks": [1, 2]}]}
    url = admin(b) + PATH
    auth = {"Authorization": "Bearer s3cret"}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(url, headers=headers)
        assert refused.value.status == 401
    async with client.ws_connect(url, headers=auth) as ws:
        await ws.send_str(json.dumps(good))
        await ws.send_str("{not json")
        closing = await ws.receive()
        assert closing.type is aiohttp.WSMsgType.CLOSE and closing.data == aiohttp.WSCloseCode.INVALID_TEXT
        assert closing.extra.startswith("body:")
    async with client.ws_connect(url, headers=auth) as ws:
        await ws.send_str(json.dumps({"v": 1, "decisions": [{**good["decisions"][0], "blocks": [-1]}]}))  # type: ignore[dict-item]
        closing = await ws.receive()
        assert closing.data == aiohttp.WSCloseCode.INVALID_TEXT and closing.extra.startswith("decisions[0].blocks")
    m = await scrape(client, admin(b))
    assert total(m, "radixgate_peer_decisions_received_total", outcome="unauthorized") == 2
    assert total(m, "radixgate_peer_decisions_received_total", outcome="bad_request") == 2
    assert total(m, "radixgate_peer_decisions_received_total", outcome="applied") == 1


async def test_peers_found_in_dns_get_the_decisions(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peers": ["http://127.0.0.1:9"]})
    a = await harness.proxy(fleet.urls, **{"routing.peers_dns": "127.0.0.1", "routing.peers_port": b.admin_port})
    sent = 0

    async def b_heard() -> bool:  # the first lookup may finish after a's first decisions
        nonlocal sent
        await generate(client, base(a), f"prompt number {sent} " * 20)
        sent += 1
        return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                     outcome="applied") >= 1

    await eventually(b_heard)


async def test_a_replica_that_finds_itself_among_its_peers_skips_itself(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    # Its own admin address is what DNS returns (peers_port 0 = our own admin port).
    a = await harness.proxy(fleet.urls, **{"server.admin_port": free_port(), "routing.peers_dns": "127.0.0.1"})
    for round_ in range(3):  # several decisions: none may reach itself
        await generate(client, base(a), f"prompt number {round_} " * 20)

        async def flushed(n: int = round_ + 1) -> bool:
            m = await scrape(client, admin(a))
            return total(m, "radixgate_peer_messages_total") >= 1 and total(m, "radixgate_requests_succeeded_total") >= n

        await eventually(flushed)
        await asyncio.sleep(0.05)  # a few flush intervals
    m = await scrape(client, admin(a))
    assert total(m, "radixgate_peer_messages_total", outcome="self") == 1
    assert total(m, "radixgate_peer_messages_total") == 1  # the refused connection, then nothing
    assert total(m, "radixgate_peer_decisions_received_total", outcome="self") == 1
    assert total(m, "radixgate_peer_decisions_received_total", outcome="applied") == 0


async def test_a_peer_that_stops_answering_pings_is_reconnected(harness: Harness, client: aiohttp.ClientSession) -> None:
    accepted = 0

    async def silent(request: web.Request) -> web.WebSocketResponse:  # takes the link, never pongs
        nonlocal accepted
        accepted += 1
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    app = web.Application()
    app.router.add_get(PATH, silent)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        fleet = await harness.fleet()
        peer = f"http://127.0.0.1:{port}"
        a = await harness.proxy(fleet.urls, **{"routing.peers": [peer], "routing.peer_heartbeat_s": 0.1})

        async def dropped_and_retried() -> bool:
            m = await scrape(client, admin(a))
            return total(m, "radixgate_peer_messages_total", peer=peer, outcome="closed") >= 1 and accepted >= 2

        await eventually(dropped_and_retried)
    finally:
        await runner.cleanup()


async def test_a_replica_hears_what_its_peer_has_in_flight_on_each_worker(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # Real time (time_scale 1): a 300-token answer stays in flight long enough to be seen.
    fleet = await harness.fleet([SimConfig(time_scale=1.0), SimConfig(time_scale=1.0)])
    a_admin = free_port()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peers": [f"http://127.0.0.1:{a_admin}"]})
    a = await harness.proxy(fleet.urls, **{"routing.policy": "round_robin", "routing.peers": [admin(b)],
                                           "server.admin_port": a_admin})

    async def b_sees(n: int) -> bool:
        return total(await scrape(client, admin(b)), "radixgate_peer_in_flight") == n

    body = {"text": "hold the line " * 20, "stream": True, "sampling_params": {"max_new_tokens": 300}}
    streams = [await client.post(base(a) + "/generate", json=body) for _ in range(3)]
    try:
        for r in streams:
            assert r.status == 200
            await r.content.readline()  # the first chunk: in flight, prefilled, decoding
        await eventually(lambda: b_sees(3), what="b counting a's 3 requests in flight")
        per_worker = {dict(ls)["worker"]: v for (n, ls), v in (await scrape(client, admin(b))).items()
                      if n == "radixgate_peer_in_flight"}
        assert set(per_worker) <= set(fleet.urls) and sorted(per_worker.values()) == [1, 2]  # round robin
    finally:
        for r in streams:
            await r.read()
            r.release()
    await eventually(lambda: b_sees(0), what="b seeing a's requests end")


async def test_a_peers_load_is_forgotten_when_its_last_connection_closes(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peers": ["http://127.0.0.1:9"]})

    async def b_sees(n: int) -> bool:
        return total(await scrape(client, admin(b)), "radixgate_peer_in_flight") == n

    told = {"v": 1, "from": "peer-x", "decisions": [], "in_flight": {fleet.urls[0]: 5, fleet.urls[1]: 2}}
    headers = {"X-Radixgate-Instance": "peer-x"}
    async with client.ws_connect(admin(b) + PATH, headers=headers) as first:
        await first.send_str(json.dumps(told))
        await eventually(lambda: b_sees(7), what="b counting the peer's 7 requests")
        async with client.ws_connect(admin(b) + PATH, headers=headers) as second:  # a reconnect overlapping
            await second.send_str(json.dumps({**told, "in_flight": {fleet.urls[0]: 1}}))  # replaces, not adds
            await eventually(lambda: b_sees(1), what="the newer count replacing the older")
            await first.close()
            await asyncio.sleep(0.1)
            assert await b_sees(1)  # another connection of that peer is still open
    await eventually(lambda: b_sees(0), what="the peer's load forgotten once it is gone")


async def test_a_replicas_diagnosis_counts_the_requests_its_peers_routed(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    a_admin = free_port()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.peers": [f"http://127.0.0.1:{a_admin}"],
                                           "diagnose.refresh_s": 0})
    # a tells b its decisions but not its finished requests (as a replica without the fleet view)
    a = await harness.proxy(fleet.urls, **{"routing.peers": [admin(b)], "server.admin_port": a_admin,
                                           "diagnose.fleet_view": False})
    await generate(client, base(b), "b's own prompt " * 20)
    for i in range(6):
        await generate(client, base(a), f"a's prompt {i} " * 20)

    async def b_heard_them() -> bool:
        return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                     outcome="applied") >= 6

    await eventually(b_heard_them)
    async with client.get(admin(b) + "/diagnosis") as r:
        assert r.status == 200
        doc = await r.json()
    assert doc["peer_requests"] == 6
    # Too few of its own to judge: it says the fleet routed more elsewhere.
    assert doc["verdict"]["kind"] == "insufficient_data"
    assert "(the peer replicas routed 6 more)" in doc["verdict"]["summary"], doc["verdict"]


async def test_replicas_with_the_fleet_view_each_diagnose_the_fleets_requests(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    a_admin = free_port()
    b = await harness.proxy(fleet.urls, **{"routing.peers": [f"http://127.0.0.1:{a_admin}"], "diagnose.refresh_s": 0})
    a = await harness.proxy(fleet.urls, **{"routing.peers": [admin(b)], "server.admin_port": a_admin,
                                           "diagnose.refresh_s": 0})
    await generate(client, base(b), "b's own prompt " * 20)
    for i in range(6):
        await generate(client, base(a), f"a's prompt {i} " * 20)

    async def window(proxy: str) -> dict[str, int]:
        async with client.get(admin(proxy) + "/diagnosis") as r:
            assert r.status == 200
            doc = await r.json()
        assert doc["peer_requests"] == 0  # nothing routed elsewhere is missing from it
        w: dict[str, int] = doc["window"]
        return w

    async def b_has_all() -> bool:
        return (await window(b))["requests"] == 7

    await eventually(b_has_all, what="b's window holding a's 6 requests and its own")
    wb = await window(b)
    assert (wb["from_peers"], wb["replicas"], wb["ok"]) == (6, 2, 7)

    async def a_has_all() -> bool:  # b's one was told once a came up (b's link kept it meanwhile)
        return (await window(a))["requests"] == 7

    await eventually(a_has_all, what="a's window holding b's request too")
    wa = await window(a)
    assert (wa["from_peers"], wa["replicas"]) == (1, 2)
    # Each record came once: a's records are not told back to a by b.
    assert total(await scrape(client, admin(a)), "radixgate_peer_decisions_received_total", outcome="finished") == 1
    async with client.get(admin(b) + "/diagnosis") as r:
        doc = await r.json()
    # The peers' requests' stages are the fleet's: end to end measured for all seven.
    assert doc["stages"]["e2e"]["n"] == 7, doc["stages"]["e2e"]


async def test_a_peer_record_naming_a_worker_we_do_not_have_is_counted_not_diagnosed(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    b = await harness.proxy(fleet.urls, **{"routing.peers": ["http://127.0.0.1:9"], "diagnose.refresh_s": 0})
    record = {"worker": fleet.urls[0], "policy": "ttft", "outcome": "ok", "cause": None, "age": 0.5,
              "marks": [0.0, 0.0, 0.1, 0.1, 0.2, 0.4, 0.4], "hold": 0.0, "gaps": [0.1, 0.1],
              "engine": [None, None, None], "tokens": [100, 0, 3], "blocks": [1, 2, 3], "block_tokens": 16,
              "estimated_prompt_tokens": 100, "text": False, "predicted_cached": 0}
    elsewhere = {**record, "worker": "http://10.9.9.9:30000"}
    async with client.ws_connect(admin(b) + PATH, headers={"X-Radixgate-Instance": "peer-x"}) as ws:
        await ws.send_str(json.dumps({"v": 1, "from": "peer-x", "decisions": [], "finished": [record, elsewhere]}))

        async def counted() -> bool:
            return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                         outcome="unknown_worker") == 1

        await eventually(counted)
    async with client.get(admin(b) + "/diagnosis") as r:
        w = (await r.json())["window"]
    assert (w["requests"], w["from_peers"]) == (1, 1)
