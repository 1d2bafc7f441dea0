"""routing.dp_ranks: requests pinned to a data-parallel rank of a worker that reports dp_size > 1,
by their prompt's head (proxy/routing/dp_rank.py), on a recording worker on 127.0.0.1."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.fixtures.broken_worker import GOOD_BODY, GOOD_OPENAI_BODY, BrokenWorker, http
from tests.integration.conftest import Harness, base, eventually

QUIET = {"health.interval_s": 0, "scrape.interval_s": 0.05}
LOADS = {"loads": [{"dp_rank": i, "num_running_reqs": 0, "num_waiting_reqs": 0, "max_running_requests": 64}
                   for i in range(4)]}


def dp_worker(w: BrokenWorker, bodies: list[dict[str, Any]]) -> None:
    w.on("/get_server_info", http(200, json.dumps({"dp_size": 4, "page_size": 16}).encode()))
    w.on("/v1/loads", http(200, json.dumps(LOADS).encode()))

    def record(answer: Any) -> Any:
        def seen(body: bytes) -> Any:
            bodies.append({**json.loads(body), "_raw": body})
            return answer
        return seen
    w.on("/generate", record(GOOD_BODY))
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
    ranks = [b["data_parallel_rank"] for b in bodies[:36]]
    per_group = [set(ranks[3 * g:3 * g + 3]) for g in range(12)]
    assert all(len(s) == 1 for s in per_group)  # every group on one rank
    assert len({r for s in per_group for r in s}) >= 3  # 12 groups over 4 ranks: spread
    assert isinstance(bodies[36]["data_parallel_rank"], int)  # chat too
    assert bodies[37]["data_parallel_rank"] == 3 and bodies[37]["_raw"].count(b"data_parallel_rank") == 1


async def test_off_by_default_and_for_workers_without_ranks(harness: Harness, client: aiohttp.ClientSession) -> None:
    bodies: list[dict[str, Any]] = []
    async with BrokenWorker.running() as w, BrokenWorker.running() as plain:
        dp_worker(w, bodies)
        app = await harness.proxy([w.url], **QUIET)  # routing.dp_ranks off
        async with client.post(f"{base(app)}/generate", json={"text": "x " * 400}) as r:
            assert r.status == 200
        assert "data_parallel_rank" not in bodies[-1]
        seen: list[dict[str, Any]] = []
        plain.on("/generate", lambda body: (seen.append(json.loads(body)), GOOD_BODY)[1])
        app2 = await harness.proxy([plain.url], **QUIET, **{"routing.dp_ranks": True})  # dp_size not reported
        async with client.post(f"{base(app2)}/generate", json={"text": "x " * 400}) as r:
            assert r.status == 200
        assert seen and "data_parallel_rank" not in seen[-1]
