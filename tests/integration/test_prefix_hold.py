"""Holding a request while the prefix it would reuse is still being prefilled (ttft's "hold").

One real-time simulated worker is busy prefilling a long unique prompt C when request A (a new
2,000-token prefix) and then B (same prefix, another question) arrive. Sent at once, A and B wait
in the engine's FCFS queue and are admitted into the same prefill batch, where B computes the
prefix again. Held at the proxy until A's first token, B finds the prefix cached.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import aiohttp
import grpc
import pytest

from loadtests.bench_overhead import free_port
from proxy._proto.radixgate.v1 import generate_pb2 as pb
from proxy._proto.radixgate.v1 import generate_pb2_grpc as pb_grpc
from proxy.app import App
from proxy.loadgen.workloads import words
from proxy.peers import PATH
from proxy.request import Dialect, GenerateRequest
from proxy.routing.prefix_key import build_route_request
from proxy.routing.ttft_cost import TtftCost
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base, eventually
from tests.integration.reliability import StreamResult, accounting, scrape, stream, total

PREFIX = 2000


def body(text: str, tokens: int = 4) -> dict[str, Any]:
    return {"text": text, "stream": True, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}


def cached_tokens(result: StreamResult) -> int:
    last = json.loads(next(e for e in reversed(result.events) if e.startswith("{")))
    return int(last["meta_info"]["cached_tokens"])


async def burst(client: aiohttp.ClientSession, app: App) -> tuple[StreamResult, StreamResult, asyncio.Task[StreamResult]]:
    """C (8,000 tokens: one 0.2 s prefill step), then A and B sharing a prefix while C is prefilling; returns A, B and C's task."""
    rng = random.Random(7)
    prefix = words(rng, PREFIX)
    url = base(app) + "/generate"
    c = asyncio.create_task(stream(client, url, body(words(rng, 8000), 1)))
    await routed(client, app, 1)
    a = asyncio.create_task(stream(client, url, body(f"{prefix} {words(rng, 20)}")))
    # B only once A is routed: on a busy machine a fixed sleep let B overtake A.
    await routed(client, app, 2)
    b = await stream(client, url, body(f"{prefix} {words(rng, 20)}"))
    return await a, b, c


async def routed(client: aiohttp.ClientSession, app: App, n: int) -> None:
    """Until the policy has made ``n`` decisions (bounded)."""
    async def made() -> bool:
        m = await scrape(client, admin(app))
        return total(m, "radixgate_policy_decisions_total", policy="ttft") >= n

    await eventually(made, timeout_s=5.0, what=f"{n} routing decisions")


async def fleet_and_proxy(harness: Harness, hold_max_s: float, **params: float) -> App:
    fleet = await harness.fleet([SimConfig(time_scale=1.0, enable_metrics=True, enable_cache_report=True)])
    return await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": hold_max_s,
                                              "routing.params": params})


async def test_a_follower_waits_for_its_prefix_and_finds_it_cached(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # B's hold is worth its recompute of the prefix plus the prefill the model sees ahead. C's
    # prefill in progress is in no queue a scrape reports, and A is counted or not as a scrape
    # races it, so at the default prior (12,000 tokens/s) the worth came out 0.165-0.33 s against
    # A's first token at ~0.23 s: a hold timed out in 1 of ~10 runs. A prior of half that rate
    # (the simulated worker prefills ~40,000 tokens/s) puts every case past A's first token.
    app = await fleet_and_proxy(harness, 1.0, prior_prefill_tokens_per_s=6_000.0)
    a, b, c = await burst(client, app)
    assert (await c).ok and a.ok and b.ok
    assert cached_tokens(a) < PREFIX
    assert cached_tokens(b) >= PREFIX  # computed once, by A
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_policy_decisions_total", policy="ttft", branch="hold") == 1
    assert total(m, "radixgate_prefix_hold_seconds_count", outcome="released") == 1
    # The hold is its own stage, not proxy overhead.
    assert total(m, "radixgate_prefix_hold_seconds_sum") > 0.15  # A waits behind C (0.2 s)
    assert total(m, "radixgate_proxy_overhead_seconds_bucket", le="0.1") == 3
    assert accounting(m) == (3, 3, 0)


@pytest.mark.parametrize("hold_max_s", [0.0, 0.02])
async def test_without_a_hold_or_past_hold_max_s_the_prefix_is_computed_twice(
        harness: Harness, client: aiohttp.ClientSession, hold_max_s: float) -> None:
    app = await fleet_and_proxy(harness, hold_max_s)
    a, b, c = await burst(client, app)
    assert (await c).ok and a.ok and b.ok
    assert cached_tokens(a) < PREFIX and cached_tokens(b) < PREFIX  # batched together behind C
    m = await scrape(client, admin(app))
    holds = total(m, "radixgate_policy_decisions_total", policy="ttft", branch="hold")
    timed_out = total(m, "radixgate_prefix_hold_seconds_count", outcome="timed_out")
    assert (holds, timed_out) == ((0, 0) if hold_max_s == 0 else (1, 1))
    assert accounting(m) == (3, 3, 0)


async def test_a_hold_ends_once_waiting_costs_more_than_recomputing_the_prefix(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # The model's prior says the engine prefills 10^6 tokens/s: C's and A's prefill ahead of B
    # and B's recompute of the prefix are worth ~15 ms of waiting, far below hold_max_s (1 s), and
    # far below the ~0.2 s A's first token takes. B is released at its hold_s, unreleased.
    fleet = await harness.fleet([SimConfig(time_scale=1.0, enable_metrics=True, enable_cache_report=True)])
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": 1.0,
                                             "routing.params": {"prior_prefill_tokens_per_s": 1e6}})
    a, b, c = await burst(client, app)
    assert (await c).ok and a.ok and b.ok
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_policy_decisions_total", policy="ttft", branch="hold") == 1
    assert total(m, "radixgate_prefix_hold_seconds_count", outcome="timed_out") == 1
    held = total(m, "radixgate_prefix_hold_seconds_sum")
    # 3-15 ms: B's recompute of the prefix (~3 ms at the prior's rate) plus the prefill still ahead
    # of it, which is C's and A's until a scrape shows C running (3.4 ms once in CI); far below 1 s
    assert 0.001 < held < 0.1
    # B was sent well before A's first token (~0.2 s), so it did not wait for the prefix. Whether
    # the engine then batched it with A or after A's prefill is the engine's timing, not the
    # proxy's decision: on a loaded 2-core CI box B once found A's prefix cached (2,001 tokens).
    assert held < a.elapsed_s
    assert accounting(m) == (3, 3, 0)


async def test_a_client_that_leaves_while_held_is_counted_and_releases_nothing(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    app = await fleet_and_proxy(harness, 1.0)
    rng = random.Random(7)
    prefix, url = words(rng, PREFIX), base(app) + "/generate"
    c = asyncio.create_task(stream(client, url, body(words(rng, 8000), 1)))
    await asyncio.sleep(0.02)
    a = asyncio.create_task(stream(client, url, body(f"{prefix} {words(rng, 20)}")))
    await asyncio.sleep(0.01)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(stream(client, url, body(f"{prefix} {words(rng, 20)}")), 0.03)
    assert (await a).ok and (await c).ok
    await asyncio.sleep(0.05)  # the proxy notices the disconnect
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_prefix_hold_seconds_count", outcome="cancelled") == 1
    assert total(m, "radixgate_errors_total", cause="client_disconnect") == 1
    assert accounting(m) == (3, 2, 1)
    assert app.pipeline.active == 0 and not app.pipeline._holds


async def test_a_replica_holds_for_a_prefix_its_peer_is_prefilling(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0, enable_metrics=True, enable_cache_report=True)])
    a_admin = free_port()
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": 1.0,
                                           "routing.peers": [f"http://127.0.0.1:{a_admin}"]})
    a = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": 1.0,
                                           "routing.peers": [admin(b)], "server.admin_port": a_admin})
    rng = random.Random(7)
    prefix = words(rng, PREFIX)
    c = asyncio.create_task(stream(client, base(a) + "/generate", body(words(rng, 8000), 1)))
    await asyncio.sleep(0.02)
    first = asyncio.create_task(stream(client, base(a) + "/generate", body(f"{prefix} {words(rng, 20)}")))

    async def b_heard_both() -> bool:
        return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total", outcome="applied") >= 2

    await eventually(b_heard_both)
    follower = await stream(client, base(b) + "/generate", body(f"{prefix} {words(rng, 20)}"))
    assert (await c).ok and (await first).ok and follower.ok
    assert cached_tokens(follower) >= PREFIX
    m = await scrape(client, admin(b))
    assert total(m, "radixgate_prefix_hold_seconds_count", outcome="released") == 1


async def test_a_peer_that_never_reports_its_first_token_is_waited_for_once(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # A peer (here a bare WebSocket client) says it sent a streamed request with this prefix to the
    # worker, then goes silent. The first follower waits hold_max_s; after that nobody waits for it.
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)])
    b = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": 0.2,
                                           "routing.peers": ["http://127.0.0.1:9"]})
    rng = random.Random(7)
    prefix = words(rng, PREFIX)
    first = build_route_request(GenerateRequest(dialect=Dialect.SGLANG, payload={}, text=f"{prefix} {words(rng, 20)}"),
                                block_tokens=16, chars_per_token=4.0, max_blocks=2048)
    decision = {"worker": fleet.urls[0], "model": first.model, "block_tokens": 16,
                "prompt_tokens": first.prompt_tokens, "blocks": list(first.block_hashes), "ref": "r1",
                "uncached": first.prompt_tokens, "stream": True}
    async with client.ws_connect(admin(b) + PATH) as ws:
        await ws.send_str(json.dumps({"v": 1, "from": "gone", "decisions": [decision]}))

        async def applied() -> bool:
            return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                         outcome="applied") >= 1

        await eventually(applied)
        for _ in range(2):
            assert (await stream(client, base(b) + "/generate", body(f"{prefix} {words(rng, 20)}"))).ok
    m = await scrape(client, admin(b))
    assert total(m, "radixgate_prefix_hold_seconds_count", outcome="timed_out") == 1
    assert total(m, "radixgate_prefix_hold_seconds_count") == 1
    assert total(m, "radixgate_prefix_hold_seconds_sum") >= 0.199  # uvloop times in whole ms: 1 ms slack
    # The silent peer's request is forgotten, not waited for by the next follower still unconfirmed.
    policy = b.policy
    assert isinstance(policy, TtftCost)
    assert not any(policy.pending.peer_pending.values())


async def test_over_grpc_the_hold_is_a_stage_of_the_final_message(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=1.0, enable_metrics=True, enable_cache_report=True)])
    # As in the HTTP follower test: a prior of half the simulated prefill rate, so the hold's worth
    # clears A's first token (at the default prior it timed out before it once in CI: 0.166 s held,
    # B batched with A); and each request sent once the one before it is routed, not after a sleep.
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.hold_max_s": 1.0, "server.grpc_port": -1,
                                             "routing.params": {"prior_prefill_tokens_per_s": 6_000.0}})
    rng = random.Random(7)
    prefix = words(rng, PREFIX)

    async def generate(stub: pb_grpc.GenerationStub, text: str) -> pb.Final:
        request = pb.GenerateRequest(text=text, sampling=pb.SamplingParams(max_new_tokens=4, ignore_eos=True))
        final = None
        async for chunk in stub.Generate(request):
            if chunk.HasField("final"):
                final = chunk.final
        assert final is not None
        return final

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.GenerationStub(channel)
        c = asyncio.create_task(generate(stub, words(rng, 8000)))
        await routed(client, app, 1)
        a = asyncio.create_task(generate(stub, f"{prefix} {words(rng, 20)}"))
        await routed(client, app, 2)
        b = await generate(stub, f"{prefix} {words(rng, 20)}")
        first, _ = await a, await c
    assert first.cached_tokens < PREFIX <= b.cached_tokens
    assert b.timings.HasField("prefix_hold_s") and b.timings.prefix_hold_s > 0.01
    assert not first.timings.HasField("prefix_hold_s")
