"""Bytes per token learned from what engines report, through a real proxy and simulated workers.

The simulated worker's tokenizer makes one token of each short word and none of whitespace, so
one-letter words are 2 bytes per token where the proxy's prior assumes 4: at first every text
prompt's token estimate is half what the engine counts. The ``prompt_tokens`` that answers report
(native ``meta_info`` and OpenAI ``usage`` alike) teach the proxy the ratio, per model.
"""

from __future__ import annotations

import random

import aiohttp

from proxy.records import CompletedRequest
from tests.integration.conftest import Harness, admin, base
from tests.integration.reliability import scrape, total


def one_letter_words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice("abcdefghij") for _ in range(n))


async def test_text_prompt_tokens_are_learned_from_the_engines_reports(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft"})
    done: list[CompletedRequest] = []
    app.pipeline.observers.append(done.append)
    rng = random.Random(3)
    for i in range(6):
        path, body = ("/generate", {"text": one_letter_words(rng, 400), "stream": i % 2 == 0,
                                    "sampling_params": {"max_new_tokens": 2}})
        if i == 3:  # an OpenAI answer's usage teaches it too
            path, body = "/v1/completions", {"prompt": one_letter_words(rng, 400), "max_tokens": 2}
        async with client.post(base(app) + path, json=body) as r:
            assert r.status == 200
            await r.read()
    first, last = done[0], done[-1]
    assert first.route is not None and last.route is not None
    reported_first, reported_last = first.timing.prompt_tokens, last.timing.prompt_tokens
    assert reported_first and reported_last
    # Before any report: the prior's 4 bytes per token, half the engine's count.
    assert first.route.prompt_tokens < 0.6 * reported_first
    # After five reports: within 2% of what the engine counts.
    assert abs(last.route.prompt_tokens - reported_last) <= 0.02 * reported_last
    m = await scrape(client, admin(app))
    learned = total(m, "radixgate_prompt_bytes_per_token", model="")
    assert 1.9 < learned < 2.1
    async with client.get(admin(app) + "/workers") as r:
        estimate = (await r.json())["prompt_bytes_per_token"]
    assert estimate["prior"] == 4.0
    assert estimate["models"][""]["reports"] == 6
    assert estimate["models"][""]["bytes_per_token"] == round(learned, 4)


async def test_token_id_prompts_teach_nothing(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet()
    app = await harness.proxy(fleet.urls)
    body = {"input_ids": list(range(1, 500)), "sampling_params": {"max_new_tokens": 2}}
    async with client.post(base(app) + "/generate", json=body) as r:
        assert r.status == 200
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_prompt_bytes_per_token") == 0
    assert app.pipeline.token_estimate.snapshot() == {}
