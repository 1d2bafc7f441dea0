"""cache_aware end to end: token-id and chat prompts return to the worker that cached their prefix."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.reliability import scrape, total

PREFIX = 400
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 25


def ids_body(group: int, i: int) -> tuple[str, dict[str, Any]]:
    ids = [*range(1000 + group * PREFIX, 1000 + (group + 1) * PREFIX), *range(50_000 + i * 20, 50_000 + i * 20 + 20)]
    return "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}


def chat_body(group: int, i: int) -> tuple[str, dict[str, Any]]:
    turns: list[dict[str, str]] = [{"role": "system", "content": f"group {group}. {SYSTEM}"}]
    for k in range(i + 1):  # each request is the conversation so far plus one more question
        turns += [{"role": "user", "content": f"question {k}?"}, {"role": "assistant", "content": "yes"}]
    return "/v1/chat/completions", {"messages": turns[:-1], "max_tokens": 2}


def cached_of(answer: dict[str, Any]) -> int:
    if "meta_info" in answer:
        return int(answer["meta_info"]["cached_tokens"])
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


@pytest.mark.parametrize("body", [ids_body, chat_body], ids=["token_ids", "chat"])
async def test_each_group_of_prompts_hits_the_worker_that_cached_its_prefix(
        harness: Harness, client: aiohttp.ClientSession, body: Any) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, enable_cache_report=True)
                                 for _ in range(3)])
    app = await harness.proxy(fleet.urls, **{"routing.policy": "cache_aware"})
    cached: dict[int, list[int]] = {}
    for i in range(3):
        for group in range(2):
            path, payload = body(group, i)
            async with client.post(base(app) + path, json=payload) as r:
                assert r.status == 200, await r.text()
                cached.setdefault(group, []).append(cached_of(await r.json()))
    for group, hits in cached.items():
        assert hits[0] < PREFIX and all(h >= PREFIX for h in hits[1:]), (group, hits)
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_policy_decisions_total", policy="cache_aware", branch="hit") == 4
    assert total(m, "radixgate_policy_decisions_total", policy="cache_aware", branch="miss") == 2
