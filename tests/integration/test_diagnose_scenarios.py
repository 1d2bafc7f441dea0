"""Known ground truth: a real proxy in front of simulated SGLang workers, set up so the right diagnosis
is known by construction, read back from GET /diagnosis on the admin port.

Run ``python -m tests.integration.test_diagnose_scenarios`` to print each scenario's text report.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from proxy import config
from proxy.app import App
from proxy.diagnose.report import main as report_main
from proxy.diagnose.report import render_text
from proxy.sim.config import SimConfig
from proxy.sim.fleet import Fleet
from tests.fixtures.sim_client import poll

# TTFT p95 target: 1 s of simulated time at the workers' time_scale of 4.
SLO_S = 0.25


@dataclass
class Scenario:
    name: str
    policy: str
    workers: list[SimConfig]
    prompt: Callable[[random.Random, int], str]
    requests: int
    concurrency: int
    max_new_tokens: int
    overrides: dict[str, Any] = field(default_factory=dict)
    # Open loop: requests arrive at this rate (per second of wall time) whatever the answers;
    # None = ``concurrency`` closed-loop clients (which never outrun the fleet: each waits).
    rate: float | None = None
    # Open loop: a client that has not had its whole answer this long gives up (closes the
    # connection), as clients past a fleet's capacity do; ``run`` counts them in "given_up".
    client_timeout_s: float | None = None


def shared_prefix(families: int, words: int) -> Callable[[random.Random, int], str]:
    """A random one of ``families`` long shared prefixes, then a short question of the request's own."""
    prefixes = [" ".join(f"f{f}w{i:04d}" for i in range(words)) for f in range(families)]
    return lambda rng, i: f"{prefixes[rng.randrange(families)]} question {i} " + " ".join(
        f"q{i}x{k}" for k in range(10))


def hot_system_prompt(share: float, families: int, words: int, message_words: int
                      ) -> Callable[[random.Random, int], str]:
    """One global system prompt on ``share`` of requests, a random one of ``families`` others on the
    rest, each of ``words`` words; then a long message of the request's own."""
    hot = " ".join(f"hotw{i:04d}" for i in range(words))
    others = [" ".join(f"g{f}w{i:04d}" for i in range(words)) for f in range(families)]
    return lambda rng, i: (hot if rng.random() < share else others[rng.randrange(families)]) + (
        f" message {i} " + " ".join(f"m{i}x{k}" for k in range(message_words)))


def unique(words: int) -> Callable[[random.Random, int], str]:
    return lambda rng, i: " ".join(f"u{i}w{k:04d}{rng.randrange(10)}" for k in range(words))


def sim(**kw: Any) -> SimConfig:
    base: dict[str, Any] = {"time_scale": 4.0, "enable_metrics": True}
    base.update(kw)
    return SimConfig(**base)


async def run(s: Scenario, with_admin: Callable[[str], Awaitable[None]] | None = None) -> dict[str, Any]:
    """Drive the scenario's load through a real proxy; return its /diagnosis document.

    ``with_admin(admin_url)`` runs once the window is complete, before the proxy stops."""
    async with Fleet.in_process(s.workers) as fleet:
        overrides: dict[str, Any] = {
            "workers.static": fleet.urls, "server.port": 0, "server.admin_port": 0,
            "routing.policy": s.policy, "scrape.interval_s": 0.05, "health.interval_s": 0.5,
            "telemetry.log_requests": False, "admission.per_worker_limit": 256,
            "diagnose.slo_ttft_p95_s": SLO_S, "diagnose.refresh_s": 0.0, "diagnose.nvml_interval_s": 0.0,
            "diagnose.thresholds": {"min_requests": 40, "min_cache_reports": 20},
        }
        overrides.update(s.overrides)
        app = App(config.load(env={}, overrides=overrides))
        await app.start()
        try:
            async with aiohttp.ClientSession() as session:
                base = f"http://127.0.0.1:{app.http_port}"
                admin = f"http://127.0.0.1:{app.admin_port}"
                rng = random.Random(7)
                prompts = [s.prompt(rng, i) for i in range(s.requests)]
                next_index = iter(range(s.requests))
                given_up: list[int] = []

                async def client() -> None:
                    for i in next_index:
                        body = {"text": prompts[i], "stream": True,
                                "sampling_params": {"max_new_tokens": s.max_new_tokens, "ignore_eos": True}}
                        async with session.post(f"{base}/generate", json=body) as resp:
                            assert resp.status == 200, await resp.text()
                            await resp.read()

                if s.rate is None:
                    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(s.concurrency))), 90)
                else:
                    rate = s.rate

                    async def one(i: int) -> None:
                        await asyncio.sleep(i / rate)
                        body = {"text": prompts[i], "stream": True,
                                "sampling_params": {"max_new_tokens": s.max_new_tokens, "ignore_eos": True}}
                        try:
                            async with asyncio.timeout(s.client_timeout_s), \
                                    session.post(f"{base}/generate", json=body) as resp:
                                assert resp.status == 200, await resp.text()
                                await resp.read()
                        except TimeoutError:
                            given_up.append(i)

                    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(s.requests))), 90)

                async def scraped_once_more() -> bool:
                    async with session.get(f"{admin}/diagnosis") as resp:
                        doc = await resp.json()
                    return bool(doc["window"]["requests"] == s.requests and doc["window"]["snapshot_samples"] > 0)

                await poll(scraped_once_more, limit_s=10.0)
                if with_admin is not None:
                    await with_admin(admin)
                async with session.get(f"{admin}/diagnosis") as resp:
                    assert resp.status == 200
                    result: dict[str, Any] = await resp.json()
                # The ground truth the engines kept, whether or not they report it.
                live = [w.worker for w in fleet.workers if w.worker is not None]
                result["given_up"] = len(given_up)
                result["engine_truth"] = {"prompt_tokens": sum(w.finished_prompt_tokens for w in live),
                                          "cached_tokens": sum(w.finished_cached_tokens for w in live),
                                          # real seconds the host CPU fell behind the simulated GPUs
                                          "lag_s": sum(w.engine.lag_seconds for w in live)}
                return result
        finally:
            await app.stop(grace_s=1.0)


def findings(doc: dict[str, Any]) -> dict[str, str]:
    return {f["rule"]: f["cause"] for f in doc["verdict"]["findings"]}


# Two workers whose KV pools hold 5 of 8 shared 2,400-token prefixes each; the fleet holds all 8.
ROUND_ROBIN = Scenario("round robin on a shared-prefix workload", "round_robin",
                       [sim(max_total_tokens=12_000), sim(max_total_tokens=12_000)],
                       shared_prefix(8, 1200), requests=120, concurrency=4, max_new_tokens=4)
AFFINITY = Scenario("cache-aware routing, ample KV", "cache_aware",
                    [sim(max_total_tokens=60_000), sim(max_total_tokens=60_000)],
                    shared_prefix(8, 1200), requests=120, concurrency=4, max_new_tokens=4)
# The fleet's KV (2 x 6,000) holds 2.5 of the 8 prefixes (19,200 tokens) whatever the routing.
SMALL_KV = Scenario("a KV pool too small for the working set", "cache_aware",
                    [sim(max_total_tokens=6_000), sim(max_total_tokens=6_000)],
                    shared_prefix(8, 1200), requests=120, concurrency=4, max_new_tokens=4)
# One running request per worker while 16 clients wait and the KV pool sits nearly empty.
LOW_MAX_RUNNING = Scenario("max_running_requests far too low", "cache_aware",
                           [sim(max_running_requests=1, max_total_tokens=200_000) for _ in range(2)],
                           unique(300), requests=80, concurrency=16, max_new_tokens=32)
# Unique long prompts; the batch cap matches the KV pool (a good config); more clients than slots.
CEILING = Scenario("unique long prompts at saturation, good config", "cache_aware",
                   [sim(max_running_requests=4, max_total_tokens=12_000) for _ in range(2)],
                   unique(900), requests=96, concurrency=32, max_new_tokens=32)
# Long unique prompts (~6,000 tokens) arriving while others decode. Without mixed chunks every
# arrival's prefill holds up the running decodes for its whole length (SGLang runs prefill first);
# with --enable-mixed-chunk and small chunks the decodes ride along, each step a little longer. Stall threshold scaled by the
# time scale, as the SLO is. At time_scale 2, not 4: at 4 a loaded host (the suite beside other
# work) stretched the mixed-chunk run's token gaps past the threshold, so the lever pulled looked
# like the stall it removes. The threshold sits between the two: the median worst token gap read
# ~78 ms without the lever and 20-24 ms with it (4 runs, 2026-12-05); at 25 ms the lever-pulled run
# crossed it in 2 of 5 runs on this 2-core sandbox, so 40 ms.
_STALL_LOAD: dict[str, Any] = {"diagnose.thresholds": {"min_requests": 40, "min_cache_reports": 20,
                                                       "prefill_stall_s": 0.04}}
PREFILL_STALL = Scenario("big prefills stalling decode", "least_load",
                         [sim(time_scale=2.0, chunked_prefill_size=2048, max_total_tokens=200_000) for _ in range(2)],
                         unique(2000), requests=48, concurrency=8, max_new_tokens=64, overrides=_STALL_LOAD)
MIXED_CHUNKS = Scenario("the same load, both levers pulled: mixed 512-token chunks", "least_load",
                        [sim(time_scale=2.0, chunked_prefill_size=512, max_total_tokens=200_000, enable_mixed_chunk=True)
                         for _ in range(2)],
                        unique(2000), requests=48, concurrency=8, max_new_tokens=64, overrides=_STALL_LOAD)
# Also runs the background refresh (a diagnosis computed in a thread every 0.1 s).
LOW_LOAD = Scenario("a fleet at low load", "cache_aware", [sim(time_scale=1.0), sim(time_scale=1.0)],
                    shared_prefix(4, 800), requests=48, concurrency=1, max_new_tokens=4,
                    overrides={"diagnose.refresh_s": 0.2})


async def test_round_robin_on_shared_prefixes_is_diagnosed_as_routing() -> None:
    exposition: list[str] = []

    async def scrape(admin_url: str) -> None:
        async with aiohttp.ClientSession() as session, session.get(f"{admin_url}/metrics") as resp:
            exposition.append(await resp.text())

    doc = await run(ROUND_ROBIN, scrape)
    assert 'radixgate_diagnosis_verdict{kind="tune"} 1.0' in exposition[0]
    assert 'radixgate_diagnosis_finding{cause="routing",rule="cache_routing"} 1.0' in exposition[0]
    assert doc["verdict"]["kind"] == "tune"
    assert findings(doc).get("cache_routing") == "routing"
    assert doc["verdict"]["levers"][0]["setting"] == "routing.policy"
    cache = doc["four_numbers"]["cache"]
    assert cache["available"] - cache["captured"] >= doc["params"]["capture_gap"]
    # The shadow replay names the alternative: ttft on the same traffic captures what round robin left.
    shadow = {r["policy"]: r["captured"] for r in cache["shadow"]}
    assert shadow["ttft"] >= shadow["round_robin"] + doc["params"]["capture_gap"]
    assert "ttft" in doc["verdict"]["levers"][0]["change"]
    # The lever, pulled on the same traffic: the engines' own count of cached tokens rises by more
    # than the gap the finding needs, and the finding is gone.
    pulled = await run(dataclasses.replace(ROUND_ROBIN, policy="ttft"))
    measured = [d["four_numbers"]["cache"]["captured"] for d in (doc, pulled)]
    assert measured[1] >= measured[0] + doc["params"]["capture_gap"], measured
    assert "cache_routing" not in findings(pulled)


# The same fleet and traffic, engines reporting only token counts (no cached_tokens, no /metrics).
BLIND_ROUND_ROBIN = Scenario("round robin on shared prefixes, engines without cache or metrics reports",
                             "round_robin", [sim(max_total_tokens=12_000, minimal_reports=True) for _ in range(2)],
                             shared_prefix(8, 1200), requests=120, concurrency=4, max_new_tokens=4)


async def test_without_engine_reports_round_robin_is_still_diagnosed_as_routing() -> None:
    doc = await run(BLIND_ROUND_ROBIN)
    cache = doc["four_numbers"]["cache"]
    assert cache["estimated"] is True and cache["available"] - cache["captured"] >= doc["params"]["capture_gap"]
    assert doc["verdict"]["kind"] == "tune" and findings(doc).get("cache_routing") == "routing"
    assert findings(doc).get("missing_signals") == "missing_signals"
    settings = {lv["setting"] for lv in doc["verdict"]["levers"]}
    assert {"routing.policy", "--enable-cache-report", "--enable-metrics"} <= settings
    # The lever, pulled on the same traffic: a prefix-affinity policy captures what round robin
    # left, by the engines' own count (which they do not report).
    pulled = await run(dataclasses.replace(BLIND_ROUND_ROBIN, policy="ttft"))

    def truth(d: dict[str, Any]) -> float:
        return float(d["engine_truth"]["cached_tokens"] / d["engine_truth"]["prompt_tokens"])

    assert truth(pulled) >= truth(doc) + doc["params"]["capture_gap"], (truth(doc), truth(pulled))
    assert "cache_routing" not in findings(pulled)


MIXED_PAGES = Scenario("one pool, two KV page sizes", "ttft",
                       [sim(max_total_tokens=60_000, page_size=16), sim(max_total_tokens=60_000, page_size=64)],
                       shared_prefix(4, 800), requests=60, concurrency=2, max_new_tokens=4)


async def test_workers_with_different_page_sizes_are_named_and_one_page_size_clears_it() -> None:
    doc = await run(MIXED_PAGES)
    assert findings(doc).get("mixed_page_sizes") == "page_size_mismatch"
    assert "--page-size" in {lv["setting"] for lv in doc["verdict"]["levers"]}
    same = await run(dataclasses.replace(MIXED_PAGES, workers=[sim(max_total_tokens=60_000, page_size=64)
                                                              for _ in range(2)]))
    assert "mixed_page_sizes" not in findings(same)


async def test_affinity_routing_with_ample_cache_is_not_a_routing_or_cache_problem() -> None:
    doc = await run(AFFINITY)
    assert not {"cache_routing", "cache_capacity"} & set(findings(doc))
    cache = doc["four_numbers"]["cache"]
    assert cache["available"] - cache["captured"] < doc["params"]["capture_gap"]
    assert cache["captured"] > 0.5  # the workload is addressable and the fleet captures it


async def test_a_kv_pool_smaller_than_the_working_set_is_diagnosed_as_cache_capacity() -> None:
    doc = await run(SMALL_KV)
    assert doc["verdict"]["kind"] == "tune"
    assert "cache_capacity" in findings(doc)
    settings = {lv["setting"] for lv in doc["verdict"]["levers"]}
    assert "--mem-fraction-static" in settings
    # The lever, pulled: ten times the KV pool per worker (the whole working set fits) and the
    # same traffic captures more, by the engines' count; the finding is gone.
    pulled = await run(dataclasses.replace(SMALL_KV, workers=[sim(max_total_tokens=60_000) for _ in range(2)]))
    measured = [d["four_numbers"]["cache"]["captured"] for d in (doc, pulled)]
    assert measured[1] >= measured[0] + doc["params"]["capture_gap"], measured
    assert "cache_capacity" not in findings(pulled)


async def test_max_running_requests_far_too_low_is_diagnosed_as_admission() -> None:
    doc = await run(LOW_MAX_RUNNING)
    assert doc["verdict"]["kind"] == "tune"
    assert findings(doc).get("admission") == "max_running_requests"
    # The lever, pulled: a 16-request batch on the same traffic. (The median: a p95 of 80 requests
    # is a few of them, which a busy host's stall can hold up; 0.31 s once in CI against ~0.06.)
    pulled = await run(dataclasses.replace(
        LOW_MAX_RUNNING, workers=[sim(max_running_requests=16, max_total_tokens=200_000) for _ in range(2)]))
    p50 = [float(d["four_numbers"]["prefill_decode"]["ttft"]["p50"]) for d in (doc, pulled)]
    assert p50[1] <= 0.5 * p50[0], p50
    # the cap's finding is gone (a start-up burst of 16 clients still queues briefly: 2 runs in 6
    # read a schedule_conservativeness finding there, with the SLO met 4x)
    assert findings(pulled).get("admission") != "max_running_requests"


async def test_without_enable_metrics_the_batch_cap_is_still_found_and_raising_it_pays() -> None:
    # Engines without --enable-metrics: no queue time in meta_info, no /metrics; their /get_load
    # still says how many run and wait (as SGLang's does), so the cap is still seen, not guessed.
    blind = [sim(max_running_requests=1, max_total_tokens=200_000, enable_metrics=False) for _ in range(2)]
    doc = await run(dataclasses.replace(LOW_MAX_RUNNING, workers=blind))
    assert doc["verdict"]["kind"] == "tune" and findings(doc).get("admission") == "max_running_requests"
    assert doc["signals"]["worker_queue_p95"]["n"] == 0  # the engine's own queue time: not reported
    # The lever, pulled on the same traffic: a 16-request batch takes the median TTFT from ~0.43 s
    # to ~0.06 s (the median, as above).
    raised = [dataclasses.replace(w, max_running_requests=16) for w in blind]
    pulled = await run(dataclasses.replace(LOW_MAX_RUNNING, workers=raised))
    p50 = [float(d["four_numbers"]["prefill_decode"]["ttft"]["p50"]) for d in (doc, pulled)]
    assert p50[1] <= 0.5 * p50[0], p50
    assert findings(pulled).get("admission") != "max_running_requests"  # (as above)


@pytest.mark.parametrize("policy", ["cache_aware", "ttft"])
async def test_unique_long_prompts_at_saturation_are_at_the_ceiling(policy: str) -> None:
    # With the default policy too: no prefix to keep, so no routing lever; the shadow replay agrees.
    doc = await run(dataclasses.replace(CEILING, policy=policy))
    assert doc["verdict"]["kind"] == "at_ceiling", doc["verdict"]
    assert findings(doc) == {"ceiling": "saturated"}
    shadow = [r["captured"] for r in doc["four_numbers"]["cache"]["shadow"]]
    assert shadow and max(shadow) - min(shadow) < doc["params"]["capture_gap"]
    if policy != "ttft":
        return
    # The verdict's own lever, pulled on the same traffic: twice the replicas (the "hardware"
    # lever; no setting of these workers was named) takes the median TTFT from ~0.42 s to ~0.16 s.
    # (Its p95, 0.18 s most runs, is the 32 clients' first burst now and then: 0.26-0.42 s.) The
    # simulated workers share one event loop in real time on the test machine's two cores, so the
    # doubled fleet adds less than twice the capacity and the host's stalls land in both: over 18
    # pairs on this project's sandbox (2026-12-05, 6 at one commit, 12 at a later one, alike) the
    # doubled fleet's median read 0.39-0.93x the single one's. The lever must help; by how much is
    # the host's to say.
    doubled = await run(dataclasses.replace(CEILING, policy=policy, workers=CEILING.workers * 2))

    def ttft(d: dict[str, Any], q: str) -> float:
        return float(d["four_numbers"]["prefill_decode"]["ttft"][q])

    assert ttft(doubled, "p50") < ttft(doc, "p50"), (ttft(doc, "p50"), ttft(doubled, "p50"))


async def test_decode_stalled_by_big_prefills_names_the_mixed_chunk_lever() -> None:
    big, small = await run(PREFILL_STALL), await run(MIXED_CHUNKS)
    assert findings(big).get("prefill_stall") == "prefill_interference", big["verdict"]
    levers = {lv["setting"] for lv in big["verdict"]["levers"]}
    assert "--enable-mixed-chunk" in levers
    assert "prefill_stall" not in findings(small), small["verdict"]
    assert big["signals"]["itl_max_p50"]["value"] > small["signals"]["itl_max_p50"]["value"]


# Open-loop arrivals at 120 req/s of simulated time of unique ~2,600-token prompts: more prefill
# than 2 workers do (their queue grows through the run: median TTFT ~0.5 s simulated in its first
# third, ~3 s in its last), well within 4. A good engine config (no batch cap, ample KV): only
# capacity is short. At time_scale 2 (30 req/s of wall time), not 4: at 4 a suite run beside a
# simulator sweep (both cores busy) stretched the engines' token gaps until the prefill stall,
# true here too, outranked the overload. Thresholds in seconds of wall time: simulated / 2.
_OVERLOAD_LOAD: dict[str, Any] = {"diagnose.slo_ttft_p95_s": 2 * SLO_S,
                                  "diagnose.thresholds": {"min_requests": 40, "min_cache_reports": 20,
                                                          "overload_min_s": 0.25, "prefill_stall_s": 0.1}}
OVERLOAD = Scenario("arrivals faster than the fleet serves", "ttft",
                    [sim(time_scale=2.0, max_total_tokens=400_000) for _ in range(2)],
                    unique(2000), requests=200, concurrency=0, max_new_tokens=16, rate=30.0, overrides=_OVERLOAD_LOAD)


async def test_arrivals_outrunning_the_fleet_are_overload_and_more_replicas_clear_it() -> None:
    doc = await run(OVERLOAD)
    v = doc["verdict"]
    assert v["kind"] == "tune" and v["findings"][0]["rule"] == "overload", v
    assert "replicas" in {lv["setting"] for lv in v["findings"][0]["levers"]}
    early, late = doc["signals"]["ttft_early_p50"]["value"], doc["signals"]["ttft_late_p50"]["value"]
    assert late >= 2 * early
    # The lever pulled on the same arrivals: twice the workers, and the queue no longer grows
    # (wall-time p95 1.26-1.37 s -> 0.086-0.099 s over four runs, two beside two CPU hogs; overload
    # first in each at confidence 1.0, the prefill stall second at 0.75). Two workers serve ~86 req/s
    # of simulated time here: at 160/s four sat at their knee and a slow CI host tipped them over it.
    doubled = await run(dataclasses.replace(OVERLOAD, workers=OVERLOAD.workers * 2))

    def p95(d: dict[str, Any]) -> float:
        return float(d["four_numbers"]["prefill_decode"]["ttft"]["p95"])

    assert p95(doubled) <= 0.3 * p95(doc), (p95(doc), p95(doubled))
    assert "overload" not in findings(doubled)


# Round robin past its capacity on 8 shared 2,400-token prefixes (engines at half real speed, 40
# req/s, where it recomputes half of every prompt), clients giving up after 1 s: most requests end
# with the client gone, and the answered ones alone are under the data floor (100 here). On the GPU
# fleet the same shape read "insufficient_data" (89 of 135 ended by the client); they are evidence:
# the verdict names routing, and the lever pulled on the same arrivals keeps the clients. At 40/s
# (10 runs each, 2026-12-05): round robin lost 125-150 of 200, ttft none (TTFT p95 0.13-0.19 s).
# At 50/s the levers sat at a tipping point: ttft lost 0-77 (a spill's extra prefix overflowing a
# full pool, then evictions feeding on themselves; 4 runs of 8) until its spill gate learned to
# check for room (none lost in 6 of 6 since), cache_aware 0 or 77 (1 of 5); a bound on the pulled
# run failed in CI. At full speed and 100 req/s the host's one core fell behind.
GIVING_UP = Scenario("round robin past capacity, clients giving up", "round_robin",
                     [sim(max_total_tokens=12_000, time_scale=0.5) for _ in range(2)], shared_prefix(8, 1200),
                     requests=200, concurrency=0, max_new_tokens=4, rate=40.0, client_timeout_s=1.0,
                     overrides={"diagnose.thresholds": {"min_requests": 100, "min_cache_reports": 20}})


async def test_clients_giving_up_past_capacity_are_evidence_and_the_routing_lever_keeps_them() -> None:
    doc = await run(GIVING_UP)
    w = doc["window"]
    assert doc["given_up"] >= GIVING_UP.requests // 2 and w["ok"] < 100, (doc["given_up"], w)
    assert w["cut_short"] >= doc["given_up"] // 2, w
    v = doc["verdict"]
    assert v["kind"] == "tune" and findings(doc).get("cache_routing") == "routing", v
    # the TTFT p95 is at least the clients' patience, not the survivors' figure
    assert doc["four_numbers"]["prefill_decode"]["ttft"]["p95"] >= 0.8
    # the shadow replay predicts the switch's TTFT too (a model fitted on this window)
    shadow = {r["policy"]: r for r in doc["four_numbers"]["cache"]["shadow"]}
    predicted = shadow["ttft"]["ttft_p95"]
    # not worse than the window's own placements, within the fit's noise: most of this window's
    # requests were cut short by the clients, so the fit sees few TTFTs. At 40/s 0.48-0.85x as
    # placed over 10 runs; at 50/s 0.71-0.84x here, in CI 1.06x and 1.14x once each (a slower
    # host: more cut short, a thinner fit).
    assert predicted is not None and predicted <= 1.25 * shadow["ttft"]["as_placed_ttft_p95"]
    assert "TTFT p95 predicted" in v["levers"][0]["change"], v["levers"][0]
    pulled = await run(dataclasses.replace(GIVING_UP, policy="ttft"))
    # none of 200 in 10 runs here (see the scenario); the bound is half round robin's losses, far
    # from the tipping point of 50/s
    assert pulled["given_up"] <= doc["given_up"] // 2, (doc["given_up"], pulled["given_up"])
    # The lever pulled is never named again. A switch can still lose reuse (at 50/s, 4 runs of 8: a
    # holder looked busy in the start-up burst, the policy spilled, and the spilled prefix overflowed
    # a 12k-token pool holding four others: captured 67-75% of 94%). Then the finding names what
    # did it (balancing away from the holder, or the evictions), not a blind policy and a switch to
    # the policy already running.
    again = [f for f in pulled["verdict"]["findings"] if f["rule"] == "cache_routing"]
    for f in again:
        assert "with affinity routing" in f["summary"], f["summary"]
        assert not any("switch to a prefix-affinity" in lv["change"] for lv in f["levers"]), f["levers"]
    # (what it predicts against what the switch measured: docs/diagnosis.md, "Shadow policies")


# 80% of requests share one 800-token system prompt (6 other prefixes share the rest), each with a
# 1,200-token message of its own to prefill. cache_aware sends a hit to the prefix's holder unless
# it runs 64 more requests than the idlest worker (balance_abs_threshold); 48 clients never get
# there, so one of 4 workers prefills 80% of the traffic while three sit idle. In real time
# (time_scale 1, the SLO 1 s): at 4, four busy workers outran one host core (engine lag 0.2-0.3 s a
# run unloaded, 1-1.5 s beside two CPU hogs) and the spread runs measured the host; at 2, beside
# two CPU hogs, a spread run lagged 2.5 s and its p95 came to 0.68x the pinned one's, against 0.7.
HOT_PREFIX = Scenario("a hot global system prompt pinned to one worker", "cache_aware",
                      [sim(time_scale=1.0, max_total_tokens=200_000) for _ in range(4)],
                      hot_system_prompt(0.8, 6, 400, 600), requests=240, concurrency=48, max_new_tokens=4,
                      overrides={"diagnose.slo_ttft_p95_s": 4 * SLO_S})


async def test_a_hot_system_prompt_pinned_to_one_worker_is_diagnosed_and_spreading_it_helps() -> None:
    doc = await run(HOT_PREFIX)
    v = doc["verdict"]
    assert v["kind"] == "tune" and v["findings"][0]["rule"] == "hot_prefix", v
    assert not {"ceiling", "latency_floor"} & set(findings(doc))  # not read as the hardware's limit
    hot = doc["signals"]
    assert hot["hot_prefix_share"]["value"] >= 0.7 and hot["hot_prefix_workers"]["value"] == 1
    levers = [lv["setting"] for lv in v["findings"][0]["levers"]]
    assert levers[0] == "routing.params.balance_abs_threshold (cache_aware)" and "routing.policy" in levers

    def ttft_p95(d: dict[str, Any]) -> float:
        return float(d["four_numbers"]["prefill_decode"]["ttft"]["p95"])

    # Both routing levers it names, pulled on the same traffic: the hot prefix spreads, the finding
    # clears and TTFT p95 drops: 1.29-1.34 s pinned against 0.28-0.38x that spread, beside two CPU
    # hogs (engine lag 0.2-0.3 s), so a margin of 30% holds with room.
    spill = {**HOT_PREFIX.overrides, "routing.params": {"balance_abs_threshold": 8}}
    for pulled in (dataclasses.replace(HOT_PREFIX, overrides=spill), dataclasses.replace(HOT_PREFIX, policy="ttft")):
        after = await run(pulled)
        assert "hot_prefix" not in findings(after), (pulled.policy, after["verdict"])
        assert after["signals"]["hot_prefix_workers"]["value"] >= 3
        assert ttft_p95(after) <= 0.7 * ttft_p95(doc), (pulled.policy, ttft_p95(doc), ttft_p95(after),
                                                        after["engine_truth"]["lag_s"])


async def test_a_fleet_at_low_load_is_healthy_and_the_report_command_says_so(capsys) -> None:
    printed: list[int] = []

    async def report(admin_url: str) -> None:
        # `radixgate report --url` is synchronous: run it off the loop that serves the admin port.
        printed.append(await asyncio.to_thread(report_main, ["--url", admin_url, "--tail", "3"]))

    doc = await run(LOW_LOAD, report)
    assert doc["verdict"]["kind"] == "healthy", doc["verdict"]
    assert doc["verdict"]["slo_met"] is True
    assert printed == [0]
    out = capsys.readouterr().out
    assert "Verdict: HEALTHY" in out
    assert "The slowest 3 of 48 requests by TTFT (GET /diagnosis/tail)" in out


if __name__ == "__main__":  # print every scenario's report
    for scenario in (ROUND_ROBIN, AFFINITY, SMALL_KV, LOW_MAX_RUNNING, CEILING, PREFILL_STALL, MIXED_CHUNKS,
                     HOT_PREFIX, LOW_LOAD):
        print(f"==== {scenario.name} ({scenario.policy})")
        print(render_text(asyncio.run(run(scenario))), end="\n\n")
