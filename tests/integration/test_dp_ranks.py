"""routing.dp_ranks: requests pinned to a data-parallel rank of a worker that reports dp_size > 1,
by their prompt's head (proxy/routing/dp_rank.py), on a recording worker on 127.0.0.1."""

from __future__ import annotations

import functools
import json
from typing import Any

import aiohttp

from proxy.app import App
from tests.fixtures.broken_worker import GOOD_BODY, GOOD_OPENAI_BODY, BrokenWorker, http
from tests.integration.conftest import Harness, base, eventually

QUIET = {"health.interval_s": 0, "scrape.interval_s": 0.05}
LOADS = {"loads": [{"dp_rank": i, "num_running_reqs": 0, "num_waiting_reqs": 0, "max_running_requests": 64}
                   for i in range(4)]}


def dp_worker(w: BrokenWorker, bodies: list[dict[str, Any]], generate: Any = GOOD_BODY) -> None:
    """A worker of 4 idle DP ranks that records each generation body (``generate``: its answer)."""
    w.on("/get_server_info", http(200, json.dumps({"dp_size": 4, "page_size": 16}).encode()))
    w.on("/v1/loads", http(200, json.dumps(LOADS).encode()))

    def record(answer: Any) -> Any:
        def seen(body: bytes) -> Any:
            bodies.append({**json.loads(body), "_raw": body})
            return answer
        return seen
    w.on("/generate", record(generate))
    w.on("/v1/chat/completions", record(GOOD_OPENAI_BODY))


async def test_requests_sharing_a_head_go_to_one_rank_and_groups_spread_over_the_ranks(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    bodies: list[dict[str, Any]] = []
    async with BrokenWorker.running() as w:
        dp_worker(w, bodies)
        app = await harness.proxy([w.url], **QUIET, **{"routing.dp_ranks": True})

        async def scraped() -> bool:
            e = app.workers.engine(w.url)
            return e is not None and e.dp_size == 4 and e.dp_outstanding == (0, 0, 0, 0)
        await eventually(scraped, what="the worker's ranks to be scraped")
        groups = [f"System prompt of tenant {g}: " + "be brief and exact. " * 80 for g in range(12)]
        for system in groups:
            for q in range(3):
                body = {"text": system + f"question {q}", "sampling_params": {"max_new_tokens": 2}}
                async with client.post(f"{base(app)}/generate", json=body) as r:
                    assert r.status == 200
        chat = {"model": "m", "messages": [{"role": "system", "content": groups[0]},
                                           {"role": "user", "content": "hi"}]}
        async with client.post(f"{base(app)}/v1/chat/completions", json=chat) as r:
            assert r.status == 200
        mine = {"text": groups[0] + "mine", "data_parallel_rank": 3}  # the caller's choice stands
        async with client.post(f"{base(app)}/generate", json=mine) as r:
            assert r.status == 200
        assert app.pipeline._parts.dp_in_flight == {}  # every request counted on its rank was let go
        # The diagnosis' records name the rank each went to (its cache model is one cache per rank).
        recorded = [r.dp_rank for r in app.diagnosis.windows.requests.items()]
    assert recorded == [b["data_parallel_rank"] for b in bodies]
    ranks = [b["data_parallel_rank"] for b in bodies[:36]]
    per_group = [set(ranks[3 * g:3 * g + 3]) for g in range(12)]
    assert all(len(s) == 1 for s in per_group)  # every group on one rank
    assert len({r for s in per_group for r in s}) >= 3  # 12 groups over 4 ranks: spread
    assert isinstance(bodies[36]["data_parallel_rank"], int)  # chat too
    assert bodies[37]["data_parallel_rank"] == 3 and bodies[37]["_raw"].count(b"data_parallel_rank") == 1


async def test_off_and_for_workers_without_ranks_no_rank_is_named(harness: Harness, client: aiohttp.ClientSession) -> None:
    bodies: list[dict[str, Any]] = []
    async with BrokenWorker.running() as w, BrokenWorker.running() as plain:
        dp_worker(w, bodies)
        app = await harness.proxy([w.url], **QUIET, **{"routing.dp_ranks": False})
        async with client.post(f"{base(app)}/generate", json={"text": "x " * 400}) as r:
            assert r.status == 200
        assert "data_parallel_rank" not in bodies[-1]
        assert [r.dp_rank for r in app.diagnosis.windows.requests.items()] == [None]
        seen: list[dict[str, Any]] = []
        plain.on("/generate", lambda body: (seen.append(json.loads(body)), GOOD_BODY)[1])
        app2 = await harness.proxy([plain.url], **QUIET, **{"routing.dp_ranks": True})  # dp_size not reported
        async with client.post(f"{base(app2)}/generate", json={"text": "x " * 400}) as r:
            assert r.status == 200
        assert seen and "data_parallel_rank" not in seen[-1]


async def test_a_simulated_dp_worker_keeps_a_cache_per_rank_and_takes_the_rank_a_request_names() -> None:
    """The simulator's --dp-size: ranks with their own caches, round robin unless a rank is named."""
    from proxy.sim.config import SimConfig
    from proxy.sim.fleet import Fleet

    prompt = {"text": "the same prompt, word after word " * 20, "sampling_params": {"max_new_tokens": 1}}
    async with Fleet.in_process([SimConfig(time_scale=200.0, dp_size=2, enable_cache_report=True)]) as fleet, \
            aiohttp.ClientSession() as s:
        url = fleet.urls[0]
        cached = []
        for body in (prompt, prompt, prompt, {**prompt, "data_parallel_rank": 1}, {**prompt, "routed_dp_rank": 0}):
            async with s.post(f"{url}/generate", json=body) as r:
                assert r.status == 200
                cached.append((await r.json())["meta_info"]["cached_tokens"])
        # Round robin: rank 0 (miss), rank 1 (miss), rank 0 (hit); then named: rank 1 (hit), rank 0 (hit).
        assert cached[0] <= 1 and cached[1] <= 1 and min(cached[2:]) > 100
        async with s.post(f"{url}/generate", json={**prompt, "data_parallel_rank": 2}) as r:
            assert r.status == 400 and "out of range" in (await r.json())["error"]["message"]
        async with s.get(f"{url}/v1/loads") as r:
            assert [x["dp_rank"] for x in (await r.json())["loads"]] == [0, 1]
        async with s.get(f"{url}/get_server_info") as r:
            info = await r.json()
        assert info["dp_size"] == 2 and len(info["internal_states"]) == 2


async def test_pinning_ranks_keeps_each_prefix_in_one_ranks_cache(harness: Harness, client: aiohttp.ClientSession) -> None:
    """Behind the proxy, 2 simulated workers of 4 DP ranks each: with routing.dp_ranks each system
    prompt's followers hit the rank that prefilled it; without, the worker's round robin sends each
    to another rank, which recomputes it."""
    from proxy.sim.config import SimConfig

    captured = {}
    for pin in (False, True):
        fleet = await harness.fleet([SimConfig(time_scale=200.0, dp_size=4, enable_cache_report=True)
                                     for _ in range(2)])
        app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.dp_ranks": pin,
                                                 "scrape.interval_s": 0.05})

        async def scraped(app: App = app, urls: list[str] = fleet.urls) -> bool:
            return all((e := app.workers.engine(u)) is not None and e.dp_size == 4 for u in urls)
        await eventually(scraped, what="the ranks to be scraped")
        prompt_tokens = cached_tokens = 0
        for g in range(8):
            system = f"You are assistant number {g}. " + "Answer in one short sentence. " * 60
            for q in range(4):
                body = {"text": system + f"Question {q}?", "sampling_params": {"max_new_tokens": 2}}
                async with client.post(f"{base(app)}/generate", json=body) as r:
                    meta = (await r.json())["meta_info"]
                prompt_tokens += meta["prompt_tokens"]
                cached_tokens += meta["cached_tokens"]
        captured[pin] = cached_tokens / prompt_tokens
    # 4 requests a prompt: pinned, 3 of 4 hit (~0.73 of all tokens); round robin, none do.
    assert captured[True] > 0.6 and captured[False] < 0.1, captured


async def test_a_rank_this_proxy_keeps_busy_is_passed_over_before_any_scrape_says_so(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    """The proxy's own requests in flight count at once (the per-rank loads are a scrape old)."""
    import asyncio

    from tests.fixtures.broken_worker import HANG, sse_head

    bodies: list[dict[str, Any]] = []
    async with BrokenWorker.running() as w:
        dp_worker(w, bodies, generate=[sse_head(), HANG])  # streams that never end
        # The worker's per-rank loads stay at 0 (a fixed answer): only the proxy's own count moves.
        app = await harness.proxy([w.url], **QUIET, **{"routing.dp_ranks": True})

        async def rank_known() -> bool:
            return (e := app.workers.engine(w.url)) is not None and e.dp_size == 4
        await eventually(rank_known, what="the worker's DP size")
        system = "One tenant's system prompt, " + "long and shared. " * 80
        streams = []
        for q in range(7):
            body = {"text": system + f"q{q}", "stream": True, "sampling_params": {"max_new_tokens": 8}}
            task = asyncio.create_task(client.post(f"{base(app)}/generate", json=body))
            streams.append(task)

            async def arrived(n: int = q + 1) -> bool:
                return len(bodies) >= n
            await eventually(arrived, what=f"request {q} to arrive")
        ranks = [b["data_parallel_rank"] for b in bodies]
        # Six on the prompt's rank (6 > max(1.5 x mean, mean + 4) only from the seventh), then the next.
        assert len(set(ranks[:6])) == 1 and ranks[6] != ranks[0], ranks
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)


async def joined(app: App, sim: Any) -> bool:
    """Whether the proxy has a subscriber with a batch on every rank's stream; else each rank
    publishes a clear (PUB drops what it sends before a subscription lands)."""
    subs = app.kv.subscribers()
    if len(subs) == len(sim.kv_publishers) and all(s.stats.batches > 0 for s in subs):
        return True
    for publisher in sim.kv_publishers:
        await publisher.publish_events([["AllBlocksCleared"]])
    return False


async def told(app: App, url: str, rank: int, prefix: list[int]) -> bool:
    """Whether the proxy's table of the worker's ``rank`` holds all of ``prefix``."""
    view = app.kv.view(url)
    held = view.rank_matches(prefix) if view is not None else None
    return held is not None and held[rank] == len(prefix)


async def test_each_rank_publishes_its_own_cache_and_followers_go_to_the_rank_that_holds_their_prefix(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    """A simulated worker of 4 DP ranks publishing each rank's KV events at its own ports (SGLang's
    layout: the configured ports plus the rank). The proxy follows the four streams; 8 prefixes are
    placed by their callers on ranks that are mostly not their hash's, and every follower is then
    sent where its prefix is. Without the events the followers go to the hash's rank: recomputed."""
    import random

    from proxy.sim.config import SimConfig
    from tests.integration.conftest import FAST, admin
    from tests.integration.reliability import scrape, total

    kv = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"})
    rng = random.Random(3)
    prefixes = [[rng.randrange(1, 30_000) for _ in range(512)] for _ in range(8)]
    hits: dict[bool, int] = {}
    for events in (True, False):
        fleet = await harness.fleet([SimConfig(time_scale=FAST, dp_size=4, page_size=16, enable_cache_report=True,
                                               kv_events_config=kv)])
        url, sim = fleet.urls[0], fleet.workers[0].worker
        assert sim is not None and len(sim.kv_publishers) == 4
        app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.dp_ranks": True,
                                                 "scrape.interval_s": 0.05,
                                                 **({"kv_events.endpoint": "auto"} if events else {})})

        async def scraped(app: App = app, url: str = url) -> bool:
            return (e := app.workers.engine(url)) is not None and e.dp_size == 4
        await eventually(scraped, what="the worker's ranks to be scraped")
        if events:
            await eventually(functools.partial(joined, app, sim), what="a subscriber on every rank's stream")
            status = app.kv.status(url)
            assert status is not None and status["source"] == "events"
            assert [r["endpoint"] for r in status["ranks"]] == [p.endpoint for p in sim.kv_publishers]
            m = await scrape(client, admin(app))
            assert all(total(m, "radixgate_kv_events_state", worker=url, rank=str(r), state="live") == 1
                       for r in range(4))
        hits[events] = 0
        for g, prefix in enumerate(prefixes):
            place = {"input_ids": [*prefix, 1, 2, 3], "data_parallel_rank": g % 4,
                     "sampling_params": {"max_new_tokens": 1}}
            # placed behind the proxy's back (a rank a caller names through it is booked there)
            async with client.post(f"{url}/generate", json=place) as r:
                assert r.status == 200
            if events:
                await eventually(functools.partial(told, app, url, g % 4, prefix),
                                 what="the rank's events to tell of the prefix")
            for q in range(3):
                body = {"input_ids": [*prefix, 100 + q, 7, 7], "sampling_params": {"max_new_tokens": 1}}
                async with client.post(f"{base(app)}/generate", json=body) as r:
                    hits[events] += (await r.json())["meta_info"]["cached_tokens"] >= 512
        if events:
            m = await scrape(client, admin(app))
            reported = total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft")
            assert reported == 24 * 512  # every follower a hit
            assert total(m, "radixgate_routing_predicted_cached_tokens_total", policy="ttft") == reported
    # Without: 19 of 24 over 4 runs. The prompts are fixed, so is their hash: 6 of the 8 prefixes were
    # placed off their hash's rank, and a first follower there recomputes it.
    assert hits[True] == 24 and hits[False] <= 20, hits


async def test_a_rank_named_through_one_replica_is_where_its_peers_send_the_prefixs_followers(
    harness: Harness, client: aiohttp.ClientSession
) -> None:
    """Two replicas sharing decisions (routing.peers) in front of a simulated worker of 4 DP ranks:
    8 prefixes placed through replica a on ranks their callers chose, mostly not the ranks b would
    pick; b's followers, naming none, go where a said each went. Without the peers, b's own choice:
    recomputed where it differs."""
    import random

    from loadtests.bench_overhead import free_port
    from proxy.sim.config import SimConfig
    from tests.integration.conftest import FAST, admin
    from tests.integration.reliability import scrape, total

    rng = random.Random(5)
    prefixes = [[rng.randrange(1, 30_000) for _ in range(512)] for _ in range(8)]
    hits: dict[bool, int] = {}
    for peered in (True, False):
        fleet = await harness.fleet([SimConfig(time_scale=FAST, dp_size=4, page_size=16, enable_cache_report=True)])
        url = fleet.urls[0]
        common = {"routing.policy": "ttft", "routing.dp_ranks": True, "scrape.interval_s": 0.05}
        a_admin = free_port()
        b = await harness.proxy(fleet.urls, **common,
                                **({"routing.peers": [f"http://127.0.0.1:{a_admin}"]} if peered else {}))
        a = await harness.proxy(fleet.urls, **common, **{"server.admin_port": a_admin},
                                **({"routing.peers": [admin(b)], "routing.peer_heartbeat_s": 0.5} if peered else {}))
        for app in (a, b):
            async def scraped(app: App = app, url: str = url) -> bool:
                return (e := app.workers.engine(url)) is not None and e.dp_size == 4
            await eventually(scraped, what="the worker's ranks to be scraped")
        for g, prefix in enumerate(prefixes):
            place = {"input_ids": [*prefix, 1, 2, 3], "data_parallel_rank": (g + 1) % 4,
                     "sampling_params": {"max_new_tokens": 1}}
            async with client.post(f"{base(a)}/generate", json=place) as r:
                assert r.status == 200
        if peered:
            async def b_heard_all(b: App = b) -> bool:
                return total(await scrape(client, admin(b)), "radixgate_peer_decisions_received_total",
                             outcome="applied") >= len(prefixes)
            await eventually(b_heard_all, what="b to hear every placement")
        hits[peered] = 0
        for g, prefix in enumerate(prefixes):
            body = {"input_ids": [*prefix, 100 + g, 7, 7], "sampling_params": {"max_new_tokens": 1}}
            async with client.post(f"{base(b)}/generate", json=body) as r:
                assert r.status == 200
                hits[peered] += (await r.json())["meta_info"]["cached_tokens"] >= 512
    assert hits[True] == 8 and hits[False] <= 4, hits
