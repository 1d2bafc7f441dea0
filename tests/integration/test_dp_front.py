"""The GPU fleet's DP front (``loadtests/gpu/dp_front.py``: one worker URL over several engines as
its data-parallel ranks), over simulated workers on 127.0.0.1, and radixgate's ``routing.dp_ranks``
through it: what a router reads of the ranks, and where each generation goes."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from loadtests.gpu.dp_front import Front, label_rank, named_rank
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, base, eventually


@contextlib.asynccontextmanager
async def front(ranks: list[str]) -> AsyncIterator[tuple[str, Front]]:
    f = Front(ranks)
    runner = web.AppRunner(f.app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", f
    finally:
        await runner.cleanup()


def test_a_rank_is_named_only_by_an_int_in_range_and_series_take_the_rank_label() -> None:
    assert named_rank({"data_parallel_rank": 1}, 2) == 1
    assert named_rank({"routed_dp_rank": 0}, 2) == 0
    assert named_rank({"data_parallel_rank": 2}, 2) is None
    assert named_rank({"data_parallel_rank": True}, 2) is None
    assert named_rank({"data_parallel_rank": "1"}, 2) is None
    assert named_rank([1], 2) is None
    text = '# HELP x y\nsglang:num_running_reqs{model_name="m"} 3\nsglang:page_size 32\n'
    assert label_rank(text, 1) == ['sglang:num_running_reqs{dp_rank="1",model_name="m"} 3',
                                   'sglang:page_size{dp_rank="1"} 32']


async def test_the_front_shows_its_engines_as_ranks_and_routes_named_ranks_there(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    sims = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, max_total_tokens=20_000),
                                SimConfig(time_scale=FAST, enable_metrics=True, max_total_tokens=30_000)])
    async with front(sims.urls) as (url, f):
        async with client.get(f"{url}/get_server_info") as r:
            info = await r.json()
        assert info["dp_size"] == 2
        assert [s["memory_usage"]["token_capacity"] for s in info["internal_states"]] == [20_000, 30_000]
        async with client.get(f"{url}/v1/loads") as r:
            assert [s["dp_rank"] for s in (await r.json())["loads"]] == [0, 1]
        async with client.get(f"{url}/metrics") as r:
            assert 'dp_rank="1"' in await r.text()
        body = {"text": "hello there", "sampling_params": {"max_new_tokens": 2}}
        for _ in range(4):  # no rank named: round robin
            async with client.post(f"{url}/generate", json=body) as r:
                assert r.status == 200 and "text" in await r.json()
        async with client.post(f"{url}/generate", json={**body, "data_parallel_rank": 1, "stream": True}) as r:
            assert r.status == 200 and (await r.read()).rstrip().endswith(b"data: [DONE]")
        assert (f.took, f.named) == ([2, 3], [0, 1])
        async with client.post(f"{url}/generate", data=b"{not json") as r:
            assert r.status == 400


async def test_radixgate_with_dp_ranks_names_a_rank_for_every_request_and_keeps_a_prompt_head_on_one(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    sims = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True)] * 2)
    async with front(sims.urls) as (url, f):
        app = await harness.proxy([url], **{"routing.policy": "ttft", "routing.dp_ranks": True})

        async def scraped() -> bool:
            e = app.workers.engine(url)
            return e is not None and e.dp_size == 2 and e.dp_outstanding is not None
        await eventually(scraped, what="the front's two ranks to be scraped")
        groups = [f"System prompt of tenant {g}: " + "answer briefly and exactly. " * 60 for g in range(8)]
        for g, system in enumerate(groups):
            took_before = list(f.took)
            for q in range(3):
                body = {"text": system + f"question {q}", "sampling_params": {"max_new_tokens": 2}}
                async with client.post(f"{base(app)}/generate", data=json.dumps(body)) as r:
                    assert r.status == 200, await r.text()
            moved = [a - b for a, b in zip(f.took, took_before, strict=True)]
            assert sorted(moved) == [0, 3], (g, moved)  # a group's requests on one rank
        assert f.named == f.took and sum(f.took) == 24
        assert min(f.took) > 0  # the groups spread over both ranks
        assert [w.dp_size for w in app.workers.published()] == [2]
        d = app.diagnosis.diagnoser

        async def diagnosed() -> bool:
            # What the diagnosis knows of the ranks, once a snapshot sample after the scrape is kept
            # (samples are kept at most one per interval, so the newest may predate it).
            signals = d.compute(d.inputs()).signals
            return (signals.dp_workers, signals.dp_ranks) == (1, True)
        await eventually(diagnosed, what="the diagnosis to see one worker of DP ranks that radixgate names")


async def test_through_the_front_radixgate_follows_each_ranks_kv_events_at_its_offset_port(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """As ``run_fleet.sh`` DP_EVENTS=1 lays them out: the engine of rank r publishes at rank 0's
    port + r; the front shows rank 0's config, and the proxy finds every rank's stream from it."""
    from proxy.sim.kv_publish import free_ports

    port = free_ports(4)
    # tcp://*: the engines' rule is to bind a wildcard host and connect to any other
    kv = [json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port + r}",
                      "replay_endpoint": f"tcp://*:{port + 2 + r}"}) for r in range(2)]
    # the replay ports are not rank 0's + r here (the proxy asks rank r's replay at rank 0's + r)
    sims = await harness.fleet([SimConfig(time_scale=FAST, page_size=16, kv_events_config=k) for k in kv])
    async with front(sims.urls) as (url, _):
        app = await harness.proxy([url], **{"routing.policy": "ttft", "routing.dp_ranks": True,
                                            "kv_events.endpoint": "auto"})

        async def ranks_live() -> bool:
            status = app.kv.status(url)
            if status is not None and [r["endpoint"] for r in status["ranks"]] == [
                    f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"] and all(
                    s.stats.batches > 0 for s in app.kv.subscribers()):
                return True
            for w in sims.workers:  # PUB drops what it sends before a subscription lands
                assert w.worker is not None
                for publisher in w.worker.kv_publishers:
                    await publisher.publish_events([["AllBlocksCleared"]])
            return False
        await eventually(ranks_live, what="a live subscriber on each rank's port")
