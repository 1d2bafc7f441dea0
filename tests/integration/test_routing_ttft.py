"""The default policy (ttft) end to end: prompt groups stay with the worker that cached them."""

from __future__ import annotations

import aiohttp

from proxy.loadgen.workloads import shared_prefix
from proxy.sim.config import SimConfig
from tests.integration.conftest import FAST, Harness, admin, base
from tests.integration.reliability import scrape, total


async def test_each_prompt_group_returns_to_its_worker_and_hits_its_cache(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True) for _ in range(2)])
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft"})
    specs = shared_prefix(groups=2, prompts_per_group=3, system_tokens=300, question_tokens=20, output_tokens=2,
                          shuffle=False)
    cached: dict[str, list[int]] = {}
    for spec in specs:  # one at a time: the choice is affinity, not load
        body = {"text": spec.text, "sampling_params": {"max_new_tokens": spec.max_new_tokens}}
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            cached.setdefault(spec.group, []).append((await r.json())["meta_info"]["cached_tokens"])
    for group, hits in cached.items():
        assert hits[0] < 300 and all(h >= 300 for h in hits[1:]), (group, hits)
    m = await scrape(client, admin(app))
    assert total(m, "radixgate_policy_decisions_total", policy="ttft", branch="affinity") == 4
    assert total(m, "radixgate_policy_decisions_total", policy="ttft", branch="balance") == 2
    # Each group stayed whole on one worker (both may share one: at this load that costs nothing,
    # and cold_slack keeps a new group on its first hash choice, where other proxies put it too).
    per_worker = [total(m, "radixgate_e2e_seconds_count", worker=u, outcome="ok") for u in fleet.urls]
    assert sum(per_worker) == 6 and all(n % 3 == 0 for n in per_worker), per_worker
    assert total(m, "radixgate_routing_reported_cached_tokens_total", policy="ttft") >= 4 * 300
    assert total(m, "radixgate_routing_predicted_cached_tokens_total", policy="ttft") > 0
