"""The simulated worker publishes its radix cache as SGLang does (``--kv-events-config``), and a
subscriber's table then predicts, before each request, exactly the cached tokens the worker
reports for it, evictions included."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp
import pytest

from proxy.clock import MonotonicClock
from proxy.routing.kv_index import EngineBlocks
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from proxy.workers.kv_subscriber import KvSubscriber, stop

pytestmark = pytest.mark.asyncio

KV = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"})


async def settled(sub: KvSubscriber, published: int, seconds: float = 5.0) -> None:
    """Until the subscriber applied every batch the worker published so far."""
    deadline = time.monotonic() + seconds
    while (sub.stats.last_seq if sub.stats.last_seq is not None else -1) < published - 1:
        assert time.monotonic() < deadline, f"subscriber at {sub.stats.last_seq}, published {published}"
        await asyncio.sleep(0.005)


async def joined(worker_publisher: object, sub: KvSubscriber) -> None:
    """PUB drops what it sends before the subscription lands: publish clears until one arrives."""
    from proxy.sim.kv_publish import KvPublisher

    assert isinstance(worker_publisher, KvPublisher)
    deadline = time.monotonic() + 5
    while sub.stats.batches == 0:
        assert time.monotonic() < deadline, "subscriber never joined"
        await worker_publisher.publish_events([["AllBlocksCleared"]])
        await asyncio.sleep(0.02)


async def test_predicted_cached_tokens_equal_what_the_worker_reports_under_eviction() -> None:
    # 8 groups x 512-token prefixes into a 2,048-token pool: most groups are evicted between uses.
    config = SimConfig(profile="zero", page_size=16, max_total_tokens=2048, enable_cache_report=True,
                       kv_events_config=KV)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as session:
        worker = fleet.workers[0].worker
        assert worker is not None and worker.kv_publisher is not None
        async with session.get(f"{fleet.urls[0]}/get_server_info") as resp:
            kv = (await resp.json())["simworker"]["kv_events"]
        assert kv["endpoint"] == worker.kv_publisher.endpoint
        table = EngineBlocks()
        sub = KvSubscriber(fleet.urls[0], kv["endpoint"], table, MonotonicClock(), replay_endpoint=kv["replay_endpoint"])
        task = asyncio.create_task(sub.run())
        try:
            await joined(worker.kv_publisher, sub)
            rng = random.Random(7)
            prefixes = [[rng.randrange(1, 30_000) for _ in range(512)] for _ in range(8)]
            agree, evicted_seen = 0, 0
            for i in range(60):
                ids = prefixes[rng.randrange(8)] + [rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 100))]
                if worker.kv_publisher.seq:
                    await settled(sub, worker.kv_publisher.seq)
                predicted = table.matched_tokens(ids)
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}
                async with session.post(f"{fleet.urls[0]}/generate", json=body) as resp:
                    reported = (await resp.json())["meta_info"]["cached_tokens"]
                agree += predicted == reported
                evicted_seen += reported == 0 and i > 8
            assert sub.state == "live" and sub.stats.gaps == 0
            assert agree == 60, f"{agree} of 60 predictions matched"
            assert evicted_seen > 5  # the pool was small enough to evict groups between uses
        finally:
            await stop(task)


async def test_a_flush_publishes_all_blocks_cleared() -> None:
    config = SimConfig(profile="zero", page_size=16, enable_cache_report=True, kv_events_config=KV)
    async with Fleet.in_process([config]) as fleet, aiohttp.ClientSession() as session:
        worker = fleet.workers[0].worker
        assert worker is not None and worker.kv_publisher is not None
        table = EngineBlocks()
        sub = KvSubscriber(fleet.urls[0], worker.kv_publisher.endpoint, table, MonotonicClock(),
                           replay_endpoint=worker.kv_publisher.replay_endpoint)
        task = asyncio.create_task(sub.run())
        try:
            await joined(worker.kv_publisher, sub)
            ids = list(range(1, 65))
            async with session.post(f"{fleet.urls[0]}/generate",
                                    json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}) as resp:
                assert resp.status == 200
            await settled(sub, worker.kv_publisher.seq)
            assert table.matched_tokens(ids) == 64
            async with session.post(f"{fleet.urls[0]}/flush_cache") as resp:
                assert resp.status == 200
            deadline = time.monotonic() + 5
            while table.matched_tokens(ids):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert table.clears >= 1
        finally:
            await stop(task)
