"""The fleet benchmark's cells in virtual time (loadtests/gpu/fleet_sim.py): same traces, same prompts."""

from __future__ import annotations

import pytest

from loadtests import fidelity
from loadtests.gpu import fleet_sim
from loadtests.gpu.fleet import TOKENIZER, Shape
from proxy.config import ConfigError
from proxy.sim.tokenizer import Encoder

pytest.importorskip("tokenizers")


def reuse(router: str) -> float:
    outcomes, _ = fleet_sim.cell(router, 3.0, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                                       encoder=Encoder(str(TOKENIZER)), minimal=True)
    assert outcomes and all(o.first is not None for o in outcomes)
    return sum(o.cached_tokens for o in outcomes) / sum(o.prompt_tokens for o in outcomes)


def test_the_oracle_keeps_each_group_on_one_worker_and_reuses_what_round_robin_recomputes() -> None:
    outcomes, _ = fleet_sim.cell("oracle", 3.0, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                                 encoder=Encoder(str(TOKENIZER)), minimal=True)
    homes: dict[str, set[str]] = {}
    for o in outcomes:
        homes.setdefault(o.group, set()).add(o.worker)
    assert homes and all(w == {f"http://w{int(g[1:]) % 4}"} for g, w in homes.items())
    assert reuse("oracle") > reuse("round_robin") + 0.2


def test_a_unique_prompt_cell_shares_nothing_that_the_shared_cell_reuses() -> None:
    """``--workload unique`` (the GPU cell's): every request its own prompt, so even the oracle
    finds nothing cached beyond the engine's page-sized accidents; shared prompts reuse most."""
    def reuse_of(workload: str) -> float:
        outcomes, _ = fleet_sim.cell("oracle", 3.0, Shape(groups=8, workload=workload), seed=1, phase=7,
                                     phase_s=8.0, workers=4, encoder=Encoder(str(TOKENIZER)), minimal=True)
        assert len(outcomes) >= 20 and all(o.first is not None for o in outcomes)
        if workload == "unique":
            assert len({o.group for o in outcomes}) == len(outcomes)
        return sum(o.cached_tokens for o in outcomes) / sum(o.prompt_tokens for o in outcomes)

    assert reuse_of("unique") < 0.02 < 0.5 < reuse_of("shared")


def test_the_balanced_reference_keeps_groups_whole_and_evens_the_workers_requests() -> None:
    outcomes, _ = fleet_sim.cell("balanced", 3.0, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                                 encoder=Encoder(str(TOKENIZER)), minimal=True)
    homes: dict[str, set[str]] = {}
    per_worker: dict[str, int] = {}
    for o in outcomes:
        homes.setdefault(o.group, set()).add(o.worker)
        per_worker[o.worker] = per_worker.get(o.worker, 0) + 1
    assert homes and all(len(w) == 1 for w in homes.values())
    # no worker gets more than the biggest group beyond the least loaded
    biggest = max(sum(1 for o in outcomes if o.group == g) for g in homes)
    assert max(per_worker.values()) - min(per_worker.values()) <= biggest


def test_a_policy_variant_reaches_the_policy_as_its_params() -> None:
    # A parameter the policy does not have is refused by the policy's own validation, naming it.
    with pytest.raises(ConfigError, match=r"routing\.params"):
        fleet_sim.cell("ttft/no_such_param=1", 4.5, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                       encoder=Encoder(str(TOKENIZER)), minimal=True)
    outcomes, _ = fleet_sim.cell("ttft/work_weight=0", 4.5, Shape(groups=8), seed=1, phase=7, phase_s=8.0,
                                 workers=4, encoder=Encoder(str(TOKENIZER)), minimal=True)
    assert outcomes and all(o.first is not None for o in outcomes)


def test_the_simulated_engines_are_warm_as_the_measured_ones_are() -> None:
    # The transformers profile charges 1.5 s for an engine's very first step; the engines a
    # benchmark measures have all served before, so none of a phase's first answers may carry it.
    from proxy.sim.perf import PROFILES

    warmup = PROFILES["h200-transformers-7b"].warmup_s
    assert warmup > 1.0
    outcomes, _ = fleet_sim.cell("round_robin", 0.5, Shape(groups=4), seed=1, phase=7, phase_s=6.0, workers=4,
                                 encoder=Encoder(str(TOKENIZER)), minimal=True)
    first = sorted(outcomes, key=lambda o: o.arrival)[:3]  # one per idle engine, nothing queued ahead
    assert first and all(o.first is not None and o.first - o.arrival < warmup for o in first)


def test_chat_cells_route_rendered_turns_and_keep_groups_as_text_cells_do() -> None:
    # OpenAI chat (the GPU cells' "chat"): the engines tokenize the chat template, so prompts are
    # a few tokens longer than the same text; the oracle still finds its groups, and ttft keeps
    # each group on one worker as it does for text.
    encoder = Encoder(str(TOKENIZER))
    common = dict(seed=1, phase=7, phase_s=8.0, workers=4, encoder=encoder, minimal=True)
    chat, _ = fleet_sim.cell("oracle", 3.0, Shape(groups=8), chat=True, **common)  # type: ignore[arg-type]
    text, _ = fleet_sim.cell("oracle", 3.0, Shape(groups=8), **common)  # type: ignore[arg-type]
    assert chat and all(o.worker == f"http://w{int(o.group[1:]) % 4}" for o in chat)
    assert [o.prompt_tokens > t.prompt_tokens for o, t in zip(chat, text, strict=True)] == [True] * len(chat)
    # ...exactly the prompts the GPU engines tokenize: the tokenizer's chat template
    from loadtests.gpu.fleet import phase_texts, trace
    from proxy.sim.protocol import chat_prompt_ids

    arrivals = trace(3.0, 8.0, Shape(groups=8), 1)
    engine_ids = [chat_prompt_ids([{"role": "system", "content": s}, {"role": "user", "content": q}],
                                  encoder.encode, encoder.encode_chat)
                  for s, q in phase_texts(arrivals, Shape(groups=8), 7)]
    assert sorted(o.prompt_tokens for o in chat) == sorted(len(ids) for ids in engine_ids)
    routed, _ = fleet_sim.cell("ttft", 3.0, Shape(groups=8), chat=True, **common)  # type: ignore[arg-type]
    homes: dict[str, set[str]] = {}
    for o in routed:
        homes.setdefault(o.group, set()).add(o.worker)
    assert sum(len(w) == 1 for w in homes.values()) >= len(homes) - 1


def test_the_oracle_finds_its_groups_when_the_proxies_route_token_ids() -> None:
    outcomes, _ = fleet_sim.cell("oracle", 3.0, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                                 encoder=Encoder(str(TOKENIZER)), minimal=True, ids=True)
    assert outcomes and all(o.worker == f"http://w{int(o.group[1:]) % 4}" for o in outcomes)


def test_a_proxy_setting_the_simulator_does_not_model_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="chars_per_token not simulated"):
        fleet_sim.cell("ttft/chars_per_token=3.5", 4.5, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                       encoder=Encoder(str(TOKENIZER)), minimal=True)


def test_rounds_keep_the_proxies_policies_and_what_they_learned() -> None:
    # fleet.py --repeat keeps each router's proxy processes through its rounds: the policies (and
    # their fitted TTFT model) must be the same objects in the next round, on fresh engines.
    carried: list = []
    kwargs = dict(phase_s=8.0, workers=4, encoder=Encoder(str(TOKENIZER)), minimal=True, carried=carried)
    fleet_sim.cell("ttft/replicas=2", 4.5, Shape(groups=8), seed=1, phase=7, **kwargs)
    kept = list(carried)
    assert len(kept) == 2
    learned = [p.model.coefficients() for p in kept]
    outcomes, _ = fleet_sim.cell("ttft/replicas=2", 4.5, Shape(groups=8), seed=1, phase=7, start=60.0, **kwargs)
    assert carried == kept and all(a is b for a, b in zip(carried, kept, strict=True))
    assert outcomes and all(o.first is not None and o.arrival >= 60.0 for o in outcomes)
    assert [p.model.coefficients() for p in kept] != learned  # the second round taught them more


@pytest.mark.parametrize(("generation", "first_requests_placed_anew"), [(1, True), (0, False)])
def test_a_round_on_engines_the_proxy_was_told_are_new_places_the_groups_anew(
        generation: int, first_requests_placed_anew: bool) -> None:
    # fleet.py tells each proxy of the flush between rounds (a new generation per worker): the
    # kept policy forgets what it believed the old engines held; --warm-index does not tell it.
    carried: list = []
    kwargs = dict(phase_s=8.0, workers=4, encoder=Encoder(str(TOKENIZER)), minimal=True, carried=carried)
    first, _ = fleet_sim.cell("ttft", 4.5, Shape(groups=8), seed=1, phase=7, **kwargs)
    again, _ = fleet_sim.cell("ttft", 4.5, Shape(groups=8), seed=1, phase=7, start=60.0, generation=generation,
                              **kwargs)
    balance = [sum(o.branch == "balance" for o in outs) for outs in (first, again)]
    assert balance[0] > 0
    assert (balance[1] == balance[0]) is first_requests_placed_anew
    if not first_requests_placed_anew:
        assert balance[1] == 0  # every group's first request went where the last round put it


def test_the_routing_simulator_shares_one_gpu_as_the_profile_says() -> None:
    """Two engines on one GPU, one identical request each at the same instant: time slices give
    both their first token together, whole steps one after the other; a request alone takes the
    same time either way (the two profiles differ only in how the GPU is shared)."""
    from loadtests.routing_sim import simulate
    from proxy.loadgen.workloads import RequestSpec
    from proxy.sim.config import SimConfig

    text = "the same long prompt " * 200
    firsts = {}
    for profile in ("h200-transformers-7b", "h200-transformers-7b-slices"):
        sim = SimConfig(profile=profile, max_total_tokens=48_000, page_size=32)
        both, _ = simulate("round_robin", [RequestSpec("a", 4, text=text), RequestSpec("b", 4, text=text)],
                           [0.0, 0.0], workers=2, sim=sim, shared_gpu=True)
        alone, _ = simulate("round_robin", [RequestSpec("a", 4, text=text)], [0.0], workers=2, sim=sim,
                            shared_gpu=True)
        assert {o.worker for o in both} == {"http://w0", "http://w1"}
        firsts[profile] = (sorted(o.first for o in both if o.first is not None), alone[0].first)
    (a, b), lone = firsts["h200-transformers-7b-slices"]
    assert a == pytest.approx(b) and a > lone  # shared alike, each slower than alone
    (a, b), lone_whole = firsts["h200-transformers-7b"]
    assert b > a * 1.2 and a == pytest.approx(lone_whole, rel=0.05)  # the first whole, then the other
    assert lone == pytest.approx(lone_whole, rel=1e-6)


def test_the_cells_tally_counts_phases_within_30_percent_and_orders_kept() -> None:
    rows = [
        ("a", {"ttft": (1.0, 1.2), "smg": (2.0, 1.5)}),  # both within; ttft ahead on both sides
        ("b", {"ttft": (3.0, 2.0), "smg": (2.0, 2.5)}),  # ttft 0.67x: out; order flipped
        ("c", {"ttft": (1.0, float("inf")), "smg": (1.0, 1.0)}),  # an unanswered phase is not scored
    ]
    line = fleet_sim.cells_tally(rows)
    assert "smg 3 of 3" in line and "ttft 1 of 2" in line
    assert "ordered as on the GPU in 2 of 3 cells" in line  # b flips; c's tie stays a tie
    # the standing over the cells both finished (a, b): GPU sqrt(0.5 * 1.5), simulated sqrt(0.8 * 0.8)
    assert "geometric mean over 2 cells: GPU 0.866x, simulated 0.800x" in line



def test_the_what_if_proxy_queue_keeps_each_worker_within_its_tokens_and_idle_workers_steal() -> None:
    # ttft/worker_tokens=N/steal_after_s=S (simulated only): a worker's prompt tokens in flight stay
    # within N (a lone request may exceed it), the rest wait at the proxy for the worker chosen;
    # a request stolen by an idle worker waited at least S there first.
    common = dict(seed=1, phase=7, phase_s=8.0, workers=4, encoder=Encoder(str(TOKENIZER)), minimal=True, ids=True)
    budget = 8000
    for spec in (f"ttft/worker_tokens={budget}", f"ttft/worker_tokens={budget}/steal_after_s=0.5"):
        outcomes, _ = fleet_sim.cell(spec, 6.0, Shape(groups=8), **common)  # type: ignore[arg-type]
        assert outcomes and all(o.done is not None for o in outcomes)
        for o in outcomes:
            sent = o.arrival + o.held_s
            beside = [p for p in outcomes if p is not o and p.worker == o.worker
                      and p.arrival + p.held_s <= sent < (p.done or 0) - 1e-9]  # (float sums)
            assert not beside or sum(p.est_prompt_tokens for p in beside) + o.est_prompt_tokens <= budget
        stolen = [o for o in outcomes if o.branch == "steal"]
        if "steal_after_s" in spec:
            assert stolen and all(o.held_s >= 0.5 for o in stolen)
        else:
            assert not stolen and max(o.held_s for o in outcomes) > 0.5  # they queued, none moved
    with pytest.raises(ValueError, match="one replica"):
        fleet_sim.cell("ttft/replicas=2/worker_tokens=8000", 6.0, Shape(groups=8), **common)  # type: ignore[arg-type]


def test_the_geometric_mean_ratio_skips_phases_that_did_not_finish() -> None:
    assert fleet_sim.geomean_ratio([2.0, 0.5], [1.0, 1.0]) == pytest.approx(1.0)
    assert fleet_sim.geomean_ratio([2.0, float("inf")], [1.0, 3.0]) == pytest.approx(2.0)
    assert fleet_sim.geomean_ratio([float("inf")], [1.0]) != fleet_sim.geomean_ratio([float("inf")], [1.0])  # nan


def test_workers_of_dp_ranks_lose_reuse_between_their_ranks_unless_the_proxy_names_them() -> None:
    """``dp``: 4 engines as 2 workers of 2 ranks; round robin inside a worker (its controller) spreads
    a group over both ranks' caches, ``dp_ranks`` keeps it on one."""
    def run(router: str) -> tuple[float, list]:  # type: ignore[type-arg]
        outcomes, engines = fleet_sim.cell(router, 3.0, Shape(groups=8), seed=1, phase=7, phase_s=8.0, workers=4,
                                           encoder=Encoder(str(TOKENIZER)), minimal=True, ids=True, dp=2)
        assert outcomes and all(o.first is not None for o in outcomes)
        assert {o.worker for o in outcomes} <= {"http://w0", "http://w1"}  # the policy sees 2 workers
        return sum(o.cached_tokens for o in outcomes) / sum(o.prompt_tokens for o in outcomes), engines
    spread, engines = run("ttft/dp_ranks=false")
    pinned, _ = run("ttft")  # dp_ranks on by default
    assert [e.url for e in engines] == ["http://w0/dp0", "http://w0/dp1", "http://w1/dp0", "http://w1/dp1"]
    assert all(e.requests > 0 for e in engines)  # round robin reaches every rank
    assert pinned > spread + 0.1


def test_jittered_arrivals_move_within_the_jitter_and_keep_each_request_its_group_and_index() -> None:
    common = dict(rate=6.0, shape=Shape(groups=8), seed=3, phase=7, phase_s=6.0, workers=4,
                  encoder=Encoder(str(TOKENIZER)), minimal=True)
    plain, _ = fleet_sim.cell("oracle", **common)  # type: ignore[arg-type]
    moved, _ = fleet_sim.cell("oracle", jitter=(0.05, 2), **common)  # type: ignore[arg-type]
    assert len(moved) == len(plain) > 20
    plain_sorted = sorted(plain, key=lambda o: o.arrival)
    moved_sorted = sorted(moved, key=lambda o: o.arrival)
    # the same multiset of groups, each arrival within 50 ms of a plain one of its group
    assert sorted(o.group for o in plain) == sorted(o.group for o in moved)
    for o in moved:
        assert any(p.group == o.group and abs(p.arrival - o.arrival) <= 0.05 + 1e-9 for p in plain)
    assert [o.arrival for o in plain_sorted] != [o.arrival for o in moved_sorted]
    # the outcomes name their place in the (moved) trace, as fidelity_routing pairs them by it
    assert sorted(o.index for o in moved) == list(range(len(moved)))
    again, _ = fleet_sim.cell("oracle", jitter=(0.05, 2), **common)  # type: ignore[arg-type]
    assert [(o.arrival, o.first) for o in again] == [(o.arrival, o.first) for o in moved]  # seeded


def test_simulated_engines_report_their_load_as_the_gpu_shim_or_as_sglang_does() -> None:
    """The GPU fleet's engine shim counts a request as waiting, with its whole prompt, until its
    first token; SGLang's queue is what is not yet scheduled (its uncached tokens), its batch what
    is. ``fleet_sim`` models the shim, ``bench_routing`` SGLang."""
    from loadtests.routing_sim import VirtualWorker
    from proxy.sim.config import SimConfig
    from proxy.sim.scheduler import SimRequest

    def after_one_step(shim: bool) -> tuple[int | None, int | None, int | None]:
        sim = SimConfig(profile="h200-transformers-7b-dense", max_total_tokens=48_000, page_size=32)
        worker = VirtualWorker("http://w0", sim, shim_reports=shim)
        for k in range(3):  # more prompt than one step takes: one prefilling, the rest waiting
            worker.scheduler.submit(SimRequest(f"r{k}", list(range(k * 10_000, k * 10_000 + 3_000)), 4), 0.0)
        assert worker.start_step(0.0) is not None
        s = worker.snapshot()
        return s.running, s.queued, s.waiting_uncached_tokens

    sched_running, sched_queued, sched_tokens = after_one_step(shim=False)
    shim_running, shim_queued, shim_tokens = after_one_step(shim=True)
    assert (shim_running, shim_queued, shim_tokens) == (0, 3, 9_000)  # no first token yet: all wait
    assert sched_running is not None and sched_running >= 1 and sched_queued == 3 - sched_running
    assert sched_tokens is not None and sched_tokens < shim_tokens


def test_smgs_stand_in_leaves_loaded_workers_out_only_where_the_engines_report_their_load() -> None:
    # smg 1.13.0's worker-overload protection on its 10-s poll (fleet_sim.AS_SIMULATED): at the
    # H100 fleet's knee it sends followers away from their prefix where the engines report load;
    # where they report nothing it is smg without it, decision for decision.
    common = dict(rate=10.0, shape=Shape(), seed=96, phase=7, phase_s=25.0, workers=4,
                  encoder=Encoder(str(TOKENIZER)), ids=True, profile="h100-transformers-16l-dense-fit")

    def run(spec: str, minimal: bool) -> list:
        outcomes, _ = fleet_sim.cell(spec, minimal=minimal, **common)  # type: ignore[arg-type]
        assert outcomes and all(o.done is not None for o in outcomes)
        return outcomes

    smg, smg_open = fleet_sim.AS_SIMULATED["smg"], fleet_sim.AS_SIMULATED["smg-open"]
    assert [o.worker for o in run(smg, True)] == [o.worker for o in run(smg_open, True)]
    protected, plain = run(smg, False), run(smg_open, False)
    misses = [sum(o.branch == "miss" for o in outs) for outs in (protected, plain)]
    assert misses[0] > misses[1]  # followers whose holder was left out start their prefix elsewhere
    assert sum(o.cached_tokens for o in protected) < sum(o.cached_tokens for o in plain)
    # scrape_s reaches the simulator: the same rule on a 0.5-s read decides otherwise
    fresh = run(smg.replace("scrape_s=10", "scrape_s=0.5"), False)
    assert [o.worker for o in fresh] != [o.worker for o in protected]


def test_a_gpu_cell_replays_on_its_own_machines_step_cost_when_asked() -> None:
    """``fleet_sim --cells --calibrate``: run 92's H100 stepped slower than the profile's machine;
    its one-proxy phase replayed with the fitted fixed step cost takes longer to first tokens, and
    without the setting replays as the profile has it. Its batch log (``--calibrate batches``)
    finds the same machine as its step clock, within 10%."""
    results = fidelity.RESULTS.parent / "gpu-fleet-h100-21"
    profile = "h100-transformers-16l-dense-fit"
    _, router, rate, got = next(p for p in fleet_sim.gpu_phases(results) if p[1] == "ttft")
    encoder = Encoder(str(TOKENIZER))
    plain = fleet_sim.phase_p95s(got["_cell"], router, rate, encoder, profile, router)[0]
    assert fleet_sim.machine(results, profile, calibrate=None) == ()
    slow = fleet_sim.machine(results, profile, calibrate="steps")
    assert slow and slow[0].startswith("step_overhead_s=0.0")
    by_batches = fleet_sim.machine(results, profile, calibrate="batches")
    steps_s, batches_s = (float(x[0].partition("=")[2]) for x in (slow, by_batches))
    assert abs(batches_s / steps_s - 1) < 0.1, (steps_s, batches_s)
    calibrated = fleet_sim.phase_p95s(got["_cell"], router, rate, encoder, profile, router, profile_set=slow)[0]
    assert calibrated > 1.2 * plain, (plain, calibrated)


def test_a_unique_prompt_gpu_cell_replays_with_nothing_shared() -> None:
    """Run 106 (gpu-fleet-h100-32) routed unique prompts: ``--cells`` labels its phases so and
    replays them on their own prompts, which share nothing, as the GPU's reuse of 0% says."""
    results = fidelity.RESULTS.parent / "gpu-fleet-h100-32"
    phases = list(fleet_sim.gpu_phases(results))
    assert len(phases) == 6 and all(" ids unique full seed " in label for label, *_ in phases)
    _, router, rate, got = phases[0]
    assert got["reuse"] == 0
    outs = fleet_sim.replay_phase(got["_cell"], router, rate, Encoder(str(TOKENIZER)),
                                  "h100-transformers-16l-dense-fit", router)
    assert len(outs) == 150 and sum(o.cached_tokens for o in outs) < 0.02 * sum(o.prompt_tokens for o in outs)


def test_what_if_keys_leave_the_spec_the_proxies_are_built_from() -> None:
    spec, what_if = fleet_sim.sim_only("ttft/replicas=4/kv_events=auto/kv_at_schedule=1/scrape_s=0.1")
    assert spec == "ttft/replicas=4/kv_events=auto"
    assert what_if == {"kv_at_schedule": 1.0, "scrape_s": 0.1}


def test_a_peers_name_with_options_is_simulated_as_its_stand_in_with_those_options() -> None:
    # `--routers smg/kv_tokens=24000` had been an unknown policy: the stand-in was looked up by the
    # whole spec. Now the name is, and the what-ifs after it stay (here: 24k-token pools).
    smg = fleet_sim.AS_SIMULATED["smg"]
    assert fleet_sim.stand_in("smg") == smg
    assert fleet_sim.stand_in("smg/kv_tokens=24000") == f"{smg}/kv_tokens=24000"
    assert fleet_sim.stand_in("ttft/kv_events=auto") == "ttft/kv_events=auto"
    assert fleet_sim.stand_in("smg", {"smg": "cache_aware"}) == "cache_aware"
    common = dict(rate=8.0, shape=Shape(), seed=157, phase=15400, phase_s=10.0, workers=4,
                  encoder=Encoder(str(TOKENIZER)), minimal=False, ids=True, profile="h100-transformers-16l-dense-fit")
    small, _ = fleet_sim.cell(fleet_sim.stand_in("smg/kv_tokens=6000"), **common)  # type: ignore[arg-type]
    large, _ = fleet_sim.cell(fleet_sim.stand_in("smg"), **common)  # type: ignore[arg-type]
    # pools that cannot hold the groups' prefixes give back less of them than the default pools
    assert sum(o.cached_tokens for o in small) < sum(o.cached_tokens for o in large)


def test_a_gpu_cell_replays_with_the_profile_settings_asked_for() -> None:
    """``fleet_sim --cells --set F=V`` replays the cells with F=V (before 2026-12-07 it was
    dropped there); ``--calibrate`` adds the machine's step cost after it."""
    import argparse

    results = fidelity.RESULTS.parent / "gpu-fleet-h100-21"
    a = argparse.Namespace(set=["kv_blocks=False", "cache_chunks=False"], profile="h100-transformers-16l-dense-fit",
                           calibrate=None)
    assert fleet_sim.cell_settings(a, results) == ("kv_blocks=False", "cache_chunks=False")
    a.calibrate = "steps"
    settings = fleet_sim.cell_settings(a, results)
    assert settings[:2] == ("kv_blocks=False", "cache_chunks=False") and settings[2].startswith("step_overhead_s=")
