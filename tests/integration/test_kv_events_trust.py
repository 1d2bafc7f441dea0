"""A KV event stream is checked against the prompts its engine prefilled (proxy/workers/kv_trust.py):
a stream that is live but never shows them (the GPU shim's publisher once failed so, and routing
then read every prefix as evicted) is not trusted, and routing goes back to the approximate
index; a stream that shows them stays trusted."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import aiohttp

from proxy.app import App
from proxy.loadgen import texts
from proxy.sim.config import SimConfig
from proxy.sim.kv_publish import KvEventsSettings, KvPublisher
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.reliability import scrape, total
from tests.integration.test_routing_kv_events import KV, TOKENIZER, event_workers, joined

GRACE_S = 0.2


async def stream_groups(client: aiohttp.ClientSession, app: App, *, seed: int, requests: int) -> None:
    """Streamed token-id prompts of 4 shared 512-token prefixes, one at a time, a little apart
    (so the probes of the earlier ones come due while the later ones are routed)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 30_000) for _ in range(512)] for _ in range(4)]
    for _ in range(requests):
        ids = prefixes[rng.randrange(4)] + [rng.randrange(1, 30_000) for _ in range(rng.randrange(8, 40))]
        body = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": 2}}
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()
        await asyncio.sleep(GRACE_S / 4)


async def described(client: aiohttp.ClientSession, app: App) -> list[dict[str, Any]]:
    async with client.get(admin(app) + "/workers") as r:
        return [w["kv_events"] for w in (await r.json())["workers"]]


async def test_a_live_stream_that_never_shows_what_was_prefilled_is_not_trusted(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, page_size=16, max_total_tokens=8192,
                                           enable_cache_report=True) for _ in range(2)])
    # Each worker's "events": a publisher that only ever says its cache was cleared.
    publishers = [KvPublisher(KvEventsSettings.parse(KV)) for _ in fleet.urls]
    for pub in publishers:
        pub.start()
    try:
        workers = [{"url": url, "kv_events": pub.endpoint} for url, pub in zip(fleet.urls, publishers, strict=True)]
        app = await harness.proxy([], **{"workers.static": workers, "routing.policy": "ttft",
                                         "kv_events.confirm_grace_s": GRACE_S})
        deadline = time.monotonic() + 10
        while any(s.stats.batches == 0 for s in app.kv.subscribers()) or len(app.kv.subscribers()) < 2:
            assert time.monotonic() < deadline, "the proxy never joined the streams"
            for pub in publishers:
                await pub.publish_events([["AllBlocksCleared"]])
            await asyncio.sleep(0.02)
        await stream_groups(client, app, seed=1, requests=32)
        await asyncio.sleep(GRACE_S * 1.5)
        states = await described(client, app)
        assert [s["state"] for s in states] == ["unconfirmed"] * 2, states
        assert {s["source"] for s in states} == {"approximate"}
        for s in states:
            assert s["confirmation"]["probes"] >= 8 and s["confirmation"]["confirmed"] == 0, s
        m = await scrape(client, admin(app))
        for url in fleet.urls:
            assert total(m, "radixgate_kv_events_state", worker=url, state="unconfirmed") == 1
            assert total(m, "radixgate_kv_events_state", worker=url, state="live") == 0
            assert total(m, "radixgate_kv_events_probes_total", worker=url, shown="false") >= 8
            assert total(m, "radixgate_kv_events_probes_total", worker=url, shown="true") == 0
        # The diagnosis names them (its missing_signals finding: the tokenizer and publisher levers),
        # from its latest sample of the fleet's snapshots, taken as the registry publishes them: on
        # a loaded machine that sample may predate the streams' verdict by a scrape or two.
        deadline = time.monotonic() + 5
        while True:
            async with client.get(admin(app) + "/diagnosis") as r:
                doubted = (await r.json())["kv_events_doubted"]
            if doubted == sorted(fleet.urls) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        assert doubted == sorted(fleet.urls)
        # From here routing reads the approximate index, whose matches the workers' reports confirm.
        before = total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft", index="approximate")
        await stream_groups(client, app, seed=2, requests=12)
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft", index="approximate") > before
    finally:
        for pub in publishers:
            await pub.close()


async def test_a_stream_that_shows_what_was_prefilled_stays_trusted(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, page_size=16, max_total_tokens=8192,
                                           enable_cache_report=True, kv_events_config=KV) for _ in range(2)])
    workers = event_workers(fleet)
    app = await harness.proxy([], **{"workers.static": workers, "routing.policy": "ttft",
                                     "kv_events.confirm_grace_s": GRACE_S})
    await joined(app, fleet)
    await stream_groups(client, app, seed=1, requests=32)
    await asyncio.sleep(GRACE_S * 1.5)
    states = await described(client, app)
    assert [s["state"] for s in states] == ["live"] * 2 and {s["source"] for s in states} == {"events"}, states
    probes = [s["confirmation"] for s in states]
    assert sum(p["probes"] for p in probes) >= 24, probes
    assert all(p["confirmed"] == p["probes"] and p["trusted"] for p in probes), probes


def other_vocabulary(where: Path) -> Path:
    """A tokenizer of another vocabulary than the engines' BPE: one token per character."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{chr(c): c for c in range(32, 127)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    where.mkdir(parents=True, exist_ok=True)
    tok.save(str(where / "tokenizer.json"))
    return where


async def test_a_proxy_tokenizing_text_unlike_its_engines_sees_their_streams_unconfirmed(
        harness: Harness, client: aiohttp.ClientSession, tmp_path: Path) -> None:
    # The engines tokenize with the BPE and publish their blocks; the proxy's routing.tokenizer is
    # another vocabulary, so the token ids it keys text prompts by never name an engine block.
    # Round robin: each engine gets its 16 prompts to judge (the proxy checks its prediction
    # whatever the policy; ttft would follow the first stream found untrusted, whose approximate
    # index then holds every group, and leave the other too few prompts to judge).
    fleet = await harness.fleet([SimConfig(time_scale=FAST, page_size=16, max_total_tokens=8192,
                                           enable_cache_report=True, kv_events_config=KV, tokenizer=str(TOKENIZER))
                                 for _ in range(2)])
    workers = event_workers(fleet)
    app = await harness.proxy([], **{"workers.static": workers, "routing.policy": "round_robin",
                                     "routing.tokenizer": str(other_vocabulary(tmp_path / "chars")),
                                     "kv_events.confirm_grace_s": GRACE_S})
    await joined(app, fleet)
    rng = random.Random(8)
    systems = [texts.prose(rng, 1500) for _ in range(4)]
    for _ in range(32):
        body = {"text": rng.choice(systems) + "\n\n" + texts.prose(rng, 100), "stream": True,
                "sampling_params": {"max_new_tokens": 2}}
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()
        await asyncio.sleep(GRACE_S / 4)
    await asyncio.sleep(GRACE_S * 1.5)
    states = await described(client, app)
    assert [s["state"] for s in states] == ["unconfirmed"] * 2, states
    assert all(s["confirmation"]["confirmed"] == 0 for s in states), states
