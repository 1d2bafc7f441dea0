"""/metrics over HTTP after real traffic: names, labels, buckets, invariants, and the table in docs/metrics.md."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from proxy.sim.config import SimConfig
from proxy.telemetry.metrics import BUCKETS
from tests.integration.conftest import FAST, Harness, admin, base

README = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


async def test_metrics_after_traffic(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST, enable_metrics=True, max_running_requests=16)])
    worker = fleet.urls[0]
    app = await harness.proxy(fleet.urls)
    ok_stream = {"text": "hello there " * 30, "stream": True, "sampling_params": {"max_new_tokens": 6}}
    ok_plain = {"text": "hello there " * 30, "sampling_params": {"max_new_tokens": 3}}
    for body in (ok_stream, ok_stream, ok_plain):
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()
    async with client.post(base(app) + "/generate", data=b"not json") as r:
        assert r.status == 400
    async with client.get(admin(app) + "/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        text = await r.text()
    families = {f.name: f for f in text_string_to_metric_families(text)
                if f.name.startswith("radixgate_") and not f.name.endswith("_created")}

    def value(name: str, **labels: str) -> float:
        return sum(s.value for f in families.values() for s in f.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    # Every request is accounted exactly once.
    accepted = value("radixgate_requests_accepted_total", frontend="http")
    assert accepted == 4
    assert accepted == value("radixgate_requests_succeeded_total") + value("radixgate_requests_failed_total")
    assert value("radixgate_requests_failed_total") == value("radixgate_errors_total") == 1
    assert value("radixgate_errors_total", frontend="http", cause="bad_request") == 1
    # Stage histograms, by worker, with the named bucket sets.
    assert value("radixgate_ttft_seconds_count", worker=worker, frontend="http") == 2  # streamed only
    assert value("radixgate_e2e_seconds_count", worker=worker, frontend="http", outcome="ok") == 3
    # One gap per pair of consecutive token-bearing reads; events that arrive in one read share a mark.
    assert 1 <= value("radixgate_inter_token_latency_seconds_count", worker=worker) <= 2 * 5
    assert value("radixgate_admission_wait_seconds_count", frontend="http", outcome="admitted") == 3
    assert value("radixgate_worker_queue_seconds_count", worker=worker) == 3  # --enable-metrics meta_info
    ttft_bounds = sorted({float(s.labels["le"]) for s in families["radixgate_ttft_seconds"].samples
                          if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"})
    assert tuple(ttft_bounds) == BUCKETS["ttft"]
    # Tokens as the worker reported them.
    assert value("radixgate_completion_tokens_total", worker=worker) == 6 + 6 + 3
    assert value("radixgate_prompt_tokens_total", worker=worker) > 0
    # Scrape-time gauges of the worker.
    assert value("radixgate_worker_healthy", worker=worker) == 1
    assert value("radixgate_worker_in_flight_requests", worker=worker) == 0
    assert value("radixgate_worker_max_running_requests", worker=worker) == 16
    assert value("radixgate_worker_admission_limit", worker=worker) == 16
    assert "radixgate_worker_running_requests" in families
    assert value("radixgate_policy_decisions_total", policy="round_robin", branch="rr") == 3
    assert "radixgate_routing_ttft_model" not in families  # round robin learns no model
    # docs/metrics.md documents every metric this proxy exposes.
    readme = README.read_text()
    documented = set(re.findall(r"`(radixgate_[a-z0-9_]+)`", readme))
    exposed = {f.name + ("_total" if f.type == "counter" else "") for f in families.values()}
    assert exposed - documented == set(), "metrics missing from the table in docs/metrics.md"


async def test_the_ttft_policys_learned_model_is_on_metrics(harness: Harness, client: aiohttp.ClientSession) -> None:
    fleet = await harness.fleet([SimConfig(time_scale=FAST) for _ in range(2)])
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft"})
    for i in range(3):
        async with client.post(base(app) + "/generate", json={"text": f"prompt {i} " * 40,
                                                              "sampling_params": {"max_new_tokens": 2}}) as r:
            assert r.status == 200
            await r.read()
    async with client.get(admin(app) + "/metrics") as r:
        text = await r.text()
    terms = {s.labels["term"]: s.value for f in text_string_to_metric_families(text)
             if f.name == "radixgate_routing_ttft_model" for s in f.samples}
    assert set(terms) == {"base", "uncached_token", "unseen_token", "queued_token", "running", "waiting",
                          "kv_wait", "uncached_token_fit"}
    assert terms["uncached_token"] > 0  # an uncached token is never free (its floor)
    assert documented_in_metrics_md("radixgate_routing_ttft_model")


def documented_in_metrics_md(name: str) -> bool:
    return f"`{name}`" in README.read_text()


async def test_with_kv_wait_the_fit_learns_the_wait_term_from_streamed_answers(
        harness: Harness, client: aiohttp.ClientSession) -> None:
    # Two workers with small KV pools, eight long streamed answers at once per round: by the
    # second round the proxy has learned a decode's length from finished answers (the pipeline's
    # completion tokens and decode time), the requests in flight overfill the pools by its books,
    # and the fit's kv_wait coefficient moves off its prior of 1.
    fleet = await harness.fleet([SimConfig(time_scale=FAST, max_total_tokens=2_000) for _ in range(2)])
    app = await harness.proxy(fleet.urls, **{"routing.policy": "ttft", "routing.params": {"kv_wait": True}})

    async def one(i: int) -> None:
        body = {"text": f"request {i} " + "shared words " * 120, "stream": True,
                "sampling_params": {"max_new_tokens": 24}}
        async with client.post(base(app) + "/generate", json=body) as r:
            assert r.status == 200
            await r.read()

    async def kv_wait_term() -> float:
        async with client.get(admin(app) + "/metrics") as r:
            text = await r.text()
        return next(s.value for f in text_string_to_metric_families(text)
                    if f.name == "radixgate_routing_ttft_model" for s in f.samples if s.labels["term"] == "kv_wait")

    for k in range(3):
        await asyncio.gather(*(one(8 * k + i) for i in range(8)))
    assert await kv_wait_term() != 1.0
