"""Bytes per token learned from what engines report, through a real proxy and simulated workers.

The simulated worker's tokenizer makes one token of each short word and none of whitespace, so
one-letter words are 2 bytes per token where the proxy's prior assumes 4: at first every text
prompt's token estimate is half what the engine counts. The ``prompt_tokens`` that answers report
(native ``meta_info`` and OpenAI ``usage`` alike) teach the proxy the ratio, per model.
"""

from __future__ import annotations

import json
import random
from typing import Any

import aiohttp

from proxy.records import CompletedRequest
from tests.fixtures.broken_worker import BrokenWorker, http
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



def _meta(prompt: int, cached: int) -> dict[str, Any]:
    return {"text": "ok", "meta_info": {"prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": 2,
                                        "finish_reason": {"type": "length", "length": 2}}}


async def test_batches_and_parallel_samples_teach_routing_nothing_and_are_counted_whole(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    """A batch is keyed on its first prompt, but its answer counts every prompt's tokens: learned
    from, the first prompt's bytes over four prompts' tokens read a quarter of the bytes a token
    (2.5 here, where each prompt's own 60 tokens say 10, both inside the estimate's bounds), and
    the index would hear the batch's cached tokens as the first prompt's. So a batch (SGLang's list of
    texts, a completions prompt list, an embeddings input list) and n samples of one prompt (an
    SGLang list answer) teach routing nothing; the token counters still count all of it."""
    rng = random.Random(5)
    texts = [one_letter_words(rng, 300) for _ in range(4)]
    usage = {"prompt_tokens": 240, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 200}}
    async with BrokenWorker.running() as worker:
        app = await harness.proxy([worker.url], **{"routing.policy": "ttft"})
        done: list[CompletedRequest] = []
        app.pipeline.observers.append(done.append)
        heard: list[tuple[int | None, int | None]] = []
        complete = app.pipeline.policy.on_complete

        def listen(c: Any) -> None:
            heard.append((c.prompt_tokens, c.cached_tokens))
            complete(c)
        app.pipeline.policy.on_complete = listen  # type: ignore[method-assign]
        answers = {
            "/generate": json.dumps([_meta(60, 50)] * 4).encode(),
            "/v1/completions": json.dumps({"choices": [{"text": "ok", "index": i, "finish_reason": "length"}
                                                       for i in range(4)], "usage": usage}).encode(),
            "/v1/embeddings": json.dumps({"object": "list", "data": [{"object": "embedding", "embedding": [0.5],
                                                                      "index": i} for i in range(4)],
                                          "usage": {"prompt_tokens": 240, "total_tokens": 240}}).encode()}
        for path, body in (("/generate", {"text": texts, "sampling_params": {"max_new_tokens": 2}}),
                           ("/v1/completions", {"prompt": texts, "max_tokens": 2}),
                           ("/v1/embeddings", {"input": texts}),
                           ("/generate", {"text": texts[0], "sampling_params": {"max_new_tokens": 2, "n": 4}})):
            worker.on(path, http(200, answers[path]))
            async with client.post(base(app) + path, json=body) as r:
                assert r.status == 200, (path, await r.text())
                await r.read()
        assert app.pipeline.token_estimate.snapshot() == {}
        assert heard == [(None, None)] * 4
        assert [d.timing.prompt_tokens for d in done] == [240] * 4  # the counters: every prompt
        assert [d.timing.cached_tokens for d in done] == [200, 200, None, 200]
        assert all(d.summed for d in done)
        m = await scrape(client, admin(app))  # the prediction's accuracy: only what describes its prompt
        assert total(m, "radixgate_routing_reported_cached_tokens_total") == 0
        worker.on("/generate", http(200, json.dumps(_meta(300, 200)).encode()))
        async with client.post(base(app) + "/generate", json={"text": texts[1]}) as r:
            assert r.status == 200
        assert app.pipeline.token_estimate.snapshot()[""].reports == 1  # one prompt teaches
        assert heard[-1] == (300, 200) and not done[-1].summed
        m = await scrape(client, admin(app))
        assert total(m, "radixgate_routing_reported_cached_tokens_total") == 200
