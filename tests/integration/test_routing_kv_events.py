"""Routing on the workers' KV events, end to end: two simulated workers publish their caches (as
SGLang's --kv-events-config), the proxy follows both, and the default policy's predicted cached
tokens then equal what the workers report, request by request, with evictions."""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import aiohttp

from proxy.app import App
from proxy.loadgen import texts
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.reliability import scrape, total

TOKENIZER = Path(__file__).resolve().parents[2] / "loadtests" / "gpu" / "tokenizer"
KV = json.dumps({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"})


async def caught_up(app: App, fleet: Fleet, seconds: float = 5.0) -> None:
    """Until every subscriber applied every batch its worker published."""
    published = {w.url: w.worker.kv_publisher.seq for w in fleet.workers if w.worker and w.worker.kv_publisher}
    deadline = time.monotonic() + seconds
    for sub in app.kv.subscribers():
        while published[sub.url] and (sub.stats.last_seq if sub.stats.last_seq is not None else -1) < published[sub.url] - 1:
            assert time.monotonic() < deadline, (sub.url, sub.stats.last_seq, published[sub.url])
            await asyncio.sleep(0.005)


def event_workers(fleet: Fleet) -> list[dict[str, str | None]]:
    """``workers.static`` entries naming each simulated worker's own event and replay sockets."""
    workers = []
    for w in fleet.workers:
        assert w.worker is not None and w.worker.kv_publisher is not None
        workers.append({"url": w.url, "kv_events": w.worker.kv_publisher.endpoint,
                        "kv_events_replay": w.worker.kv_publisher.replay_endpoint})
    return workers


async def joined(app: App, fleet: Fleet) -> None:
    """PUB drops what it sends before a subscription lands: each worker publishes clears until
    the proxy's subscriber has one."""
    deadline = time.monotonic() + 10
    while len(app.kv.subscribers()) < len(fleet.workers) or any(s.stats.batches == 0 for s in app.kv.subscribers()):
        assert time.monotonic() < deadline, "the proxy never joined the workers' event streams"
        for w in fleet.workers:
            if w.worker is not None and w.worker.kv_publisher is not None:
                await w.worker.kv_publisher.publish_events([["AllBlocksCleared"]])
        await asyncio.sleep(0.02)


async def send_groups(client: aiohttp.ClientSession, app: App, fleet: Fleet, *, seed: int, groups: int,
                      requests: int) -> None:
    """Token-id prompts of ``groups`` 512-token prefixes, one at a time, each once the proxy has
    every event the workers published before it (so a prediction is judged on a settled table)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30_000) for _ in range(512)] for _ in range(groups)]
    for _ in range(requests):
        await caught_up(app, fleet)
        ids = prefixes[rng.randrange(groups)] + [rng.randrange(1, 30_000) for _ in range(rng.randrange(1, 80))]
        async with client.post(base(app) + "/generate",
                               json={"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}) as r:
            assert r.status == 200


async def test_predicted_cached_tokens_equal_reported_ones_with_events(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    configs = [SimConfig(time_scale=FAST, page_size=16, max_total_tokens=2048, enable_cache_report=True,
                         kv_events_config=KV) for _ in range(2)]
    fleet = await harness.fleet(configs)
    workers = event_workers(fleet)
    app = await harness.proxy([], **{"workers.static": workers, "routing.policy": "ttft"})
    await joined(app, fleet)
    await send_groups(client, app, fleet, seed=3, groups=8, requests=40)
    m = await scrape(client, admin(app))
    reported = total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft")
    assert reported > 0
    assert total(m, "radixgate_routing_predicted_cached_tokens_total", policy="ttft") == reported
    assert total(m, "radixgate_routing_cache_prediction_error_tokens_total", policy="ttft") == 0
    # every prediction came from the events (the approximate index would be counted apart)
    assert total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft", index="events") == reported
    for url in fleet.urls:
        assert total(m, "radixgate_kv_events_state", worker=url, state="live") == 1
        assert total(m, "radixgate_kv_events_batches_total", worker=url) > 0
    async with client.get(admin(app) + "/workers") as r:
        described = (await r.json())["workers"]
    assert {w["kv_events"]["source"] for w in described} == {"events"}


async def bpe_fleet(harness: Harness) -> tuple[App, Fleet]:
    """Two simulated workers publishing KV events and tokenizing with the BPE (its chat template
    too), and the default policy following them with the same tokenizer."""
    configs = [SimConfig(time_scale=FAST, page_size=16, max_total_tokens=4096, enable_cache_report=True,
                         kv_events_config=KV, tokenizer=str(TOKENIZER)) for _ in range(2)]
    fleet = await harness.fleet(configs)
    workers = event_workers(fleet)
    app = await harness.proxy([], **{"workers.static": workers, "routing.policy": "ttft",
                                     "routing.tokenizer": str(TOKENIZER)})
    await joined(app, fleet)
    return app, fleet


async def predictions_equal_reports(client: aiohttp.ClientSession, app: App, prompt_tokens: list[int]) -> None:
    m = await scrape(client, admin(app))
    reported = total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft")
    assert reported > 0
    assert total(m, "radixgate_routing_predicted_cached_tokens_total", policy="ttft") == reported
    # Token counts are the engine's own: the prompt-token counter equals the reported tokens.
    assert total(m, "radixgate_routing_prompt_tokens_total", policy="ttft") == sum(prompt_tokens)


async def test_with_the_models_tokenizer_text_prompts_match_the_events_exactly(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # The engines and the proxy tokenize with the same BPE (characters per token differ from the
    # proxy's prior): text prompts are then keyed by the engine's token ids and match its events.
    app, fleet = await bpe_fleet(harness)
    rng = random.Random(5)
    systems = [texts.prose(rng, 2500) for _ in range(6)]
    prompt_tokens = []
    for _ in range(30):
        await caught_up(app, fleet)
        body = {"text": rng.choice(systems) + "\n\n" + texts.prose(rng, 200), "sampling_params": {"max_new_tokens": 2}}
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            prompt_tokens.append((await r.json())["meta_info"]["prompt_tokens"])
    await predictions_equal_reports(client, app, prompt_tokens)


async def test_with_the_models_chat_template_chat_prompts_match_the_events_exactly(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # The tokenizer directory's chat template renders OpenAI chat on the engines (as SGLang does)
    # and on the proxy: chat prompts are keyed by the engine's token ids too. Without the template
    # they would be keyed by bytes and the predictions could not equal the reports token for token.
    app, fleet = await bpe_fleet(harness)
    rng = random.Random(6)
    systems = [texts.prose(rng, 2500) for _ in range(6)]
    prompt_tokens = []
    for _ in range(30):
        await caught_up(app, fleet)
        content: object = texts.prose(rng, 200)
        if rng.random() < 0.3:  # text parts, as the SDKs send them
            content = [{"type": "text", "text": str(content)}]
        body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "max_tokens": 2, "messages": [
            {"role": "system", "content": rng.choice(systems)}, {"role": "user", "content": content}]}
        async with client.post(base(app) + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            prompt_tokens.append((await r.json())["usage"]["prompt_tokens"])
    await predictions_equal_reports(client, app, prompt_tokens)


async def test_auto_follows_each_workers_own_kv_events_config(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # No endpoint configured per worker: each worker's /get_server_info says where its events are.
    configs = [SimConfig(time_scale=FAST, page_size=16, max_total_tokens=2048, enable_cache_report=True,
                         kv_events_config=KV) for _ in range(2)]
    fleet = await harness.fleet(configs)
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "kv_events.endpoint": "auto"})
    await joined(app, fleet)
    endpoints = {s.url: s.endpoint for s in app.kv.subscribers()}
    assert endpoints == {w.url: w.worker.kv_publisher.endpoint for w in fleet.workers
                         if w.worker is not None and w.worker.kv_publisher is not None}
    await send_groups(client, app, fleet, seed=4, groups=4, requests=20)
    m = await scrape(client, admin(app))
    reported = total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft")
    assert reported > 0 and total(m, "radixgate_routing_predicted_cached_tokens_total", policy="ttft") == reported
