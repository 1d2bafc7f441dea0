"""A fleet's machine read from its warm-up's step clock: the warm-up rebuilt as fleet.py drew it and
replayed, so the machine is known before any judged round."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loadtests import fleet_windows
from loadtests.fidelity_machine import previous_profiles
from loadtests.fidelity_replay import judge, placed_phases, simulate, warmup_phases
from loadtests.fidelity_steps import calibrate_host
from loadtests.gpu.fleet import TOKENIZER
from proxy.sim import perf
from proxy.sim.scheduler import SimRequest
from proxy.sim.tokenizer import Encoder

RESULTS = Path(__file__).resolve().parents[2] / "loadtests" / "results"
H100 = perf.PROFILES["h100-transformers-16l-dense-fit"]


def test_a_warm_up_is_rebuilt_request_for_request() -> None:
    """Run 121's two 8-s warm-ups at 6/s (seed 151 and 152 for traces 150 and 151): each of the 48
    requests the trace holds is found among the engines' requests, by its prompt's length, and the
    replay's prompts have those lengths; the engines' other requests are the proxies' probes."""
    encoder = Encoder(str(TOKENIZER))
    warm = warmup_phases(RESULTS / "gpu-fleet-evict-1", encoder)
    assert [(p.phase, p.rate, p.warmup_s, len(p.at)) for p in warm] == [(14300, 6.0, 8.0, 48), (14400, 6.0, 8.0, 48)]
    for p in warm:
        assert sorted(p.index) == list(range(48))
        assert p.pool_tokens == 24_000 and len(p.batches) == 4 and all(p.steps)
        into: list[tuple[int, SimRequest]] = []
        simulate(p, H100, encoder, {}, into=into)
        replayed = sorted(len(r.input_ids) for _, r in into)
        assert replayed == sorted(row[0] for row in p.engine_rows)
    assert warmup_phases(RESULTS / "gpu-fleet-h100-21", encoder) == []  # a run without a warm-up log


def test_the_warm_ups_step_clock_reads_the_machine_its_windows_misread() -> None:
    """Runs 121-122 (24k-token pools, 5 decodes a step against the usual 11-12): with small steps
    the GPU idles even where all four engines step, so the warm-up's windows read a slow machine
    (71 and 75 ms; the replay then 1 of 22 rounds within ±30%), while its step clock reads the
    profile's own 60 ms, as the judged rounds' step clock does (59.5 and 61.4)."""
    for run in ("gpu-fleet-evict-1", "gpu-fleet-evict-2"):
        windows = fleet_windows.calibrate(RESULTS / run, H100, warmup=True)
        clock = calibrate_host(RESULTS / run, H100, warmup=True)
        assert windows is not None and windows > 0.068, (run, windows)
        assert clock is not None and abs(clock / H100.step_overhead_s - 1) < 0.05, (run, clock)
    encoder = Encoder(str(TOKENIZER))
    rounds = placed_phases(RESULTS / "gpu-fleet-evict-2")
    clock = calibrate_host(RESULTS / "gpu-fleet-evict-2", H100, warmup=True)
    windows = fleet_windows.calibrate(RESULTS / "gpu-fleet-evict-2", H100, warmup=True)
    assert clock is not None and windows is not None

    def held(profile: perf.Profile) -> int:
        return sum(judge(p, simulate(p, profile, encoder, {}), [])[0] for p in rounds)

    assert held(dataclasses.replace(H100, step_overhead_s=clock)) >= 7
    assert held(dataclasses.replace(H100, step_overhead_s=windows)) <= 1


def test_each_round_on_the_phase_before_it_follows_a_drifting_machine() -> None:
    """Run 120's lone H100 drifted within the call: 67 ms a step in the first cell's warm-up, 81 in
    its first judged phase, 45-49 in the second cell. Each round read from the phase just before it
    (the warm-up for a cell's first) follows that, every reading held out: 10 of 14 rounds within
    ±30% against the pooled warm-ups' 8 (each round's own batches, a fit: 12)."""
    run = RESULTS / "gpu-fleet-alone-4"
    before = previous_profiles(run, H100)
    rounds = placed_phases(run)
    assert sorted(before) == sorted(p.phase for p in rounds)  # every round has a phase before it
    # the first judged phase is read from its warm-up, the second from the slow first phase
    assert before[14101].step_overhead_s < before[14102].step_overhead_s
    assert before[14102].step_overhead_s > 0.075 and before[14201].step_overhead_s < 0.055
    encoder = Encoder(str(TOKENIZER))
    held = sum(judge(p, simulate(p, before[p.phase], encoder, {}), [])[0] for p in rounds)
    pooled = fleet_windows.calibrate(run, H100, warmup=True, lone=True)
    assert pooled is not None
    on_warmups = sum(judge(p, simulate(p, dataclasses.replace(H100, step_overhead_s=pooled), encoder, {}), [])[0]
                     for p in rounds)
    assert held >= 10 and held > on_warmups, (held, on_warmups)


def test_matched_by_its_mean_step_the_replay_drains_a_tight_pools_queues_as_the_engines_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run 124 (gpu-fleet-evict-4: 24k-token pools, 6 and 8/s, twelve rounds), each round on the
    phase before it, on the radix tree the profile had then. Matched by the median busy step, the
    replay's steps came out slower on average than the engines' (fuller steps cost it more), its
    queues long, its TTFTs high: 5 of 12 within ±30%. Matched by the mean, which sets the steps a
    second, 9 of 12 (over the 271 H100 fleet rounds 205 against 184, `fidelity_placed --calibrate
    --calibrate-by previous --step-statistic`). With the engine's own block cache (the profile
    since) the median's reading holds 9 and the mean's 10: what the tree evicted was part of the
    slowness the mean made up for."""
    from loadtests import fidelity_steps

    run = RESULTS / "gpu-fleet-evict-4"
    rounds = placed_phases(run)
    encoder = Encoder(str(TOKENIZER))
    tree = dataclasses.replace(H100, kv_blocks=False, cache_chunks=False)
    held, fixed = {}, {}
    for statistic in ("median", "mean"):
        monkeypatch.setattr(fidelity_steps, "STEP_STATISTIC", statistic)
        before = previous_profiles(run, tree)
        assert sorted(before) == sorted(p.phase for p in rounds)
        held[statistic] = sum(judge(p, simulate(p, before[p.phase], encoder, {}), [])[0] for p in rounds)
        fixed[statistic] = [before[p.phase].step_overhead_s for p in rounds]
    # the mean reads a machine as fast or faster from the same phases: the median's left the replay slow
    pairs = list(zip(fixed["mean"], fixed["median"], strict=True))
    assert all(m <= d for m, d in pairs) and sum(m < d for m, d in pairs) >= len(pairs) - 2, fixed
    assert held["median"] <= 5 and held["mean"] >= 9, held


def test_the_engines_own_block_cache_keeps_what_each_engine_kept_where_a_radix_tree_keeps_less() -> None:
    """Run 132's oracle round 15403 (gpu-fleet-evict-9: 24k-token pools at 8/s, each group on one
    engine, so what an engine reuses is its cache's doing alone), replayed as fitted. transformers'
    block manager (proxy/sim/blocks.py) keeps on three engines of four within a point of the share
    of prompt tokens the GPU's engines found cached; a radix tree evicting the newest leaves keeps
    less on every engine (0.8-3.3 points). The fourth, the most loaded, keeps 5 points less in both."""
    run = RESULTS / "gpu-fleet-evict-9"
    phase = next(p for p in placed_phases(run) if p.phase == 15403)
    order = sorted(range(len(phase.at)), key=lambda k: phase.at[k])
    encoder = Encoder(str(TOKENIZER))

    def reuse(profile: perf.Profile) -> list[tuple[float, float]]:
        into: list[tuple[int, SimRequest]] = []
        simulate(phase, profile, encoder, {}, into=into)
        out = []
        for engine in sorted(set(phase.engine)):
            mine = [(k, sim) for k, (n, sim) in zip(order, into, strict=True) if n == engine]
            real = sum(phase.engine_rows[k][1] for k, _ in mine) / sum(phase.engine_rows[k][0] for k, _ in mine)
            out.append((real, sum(s.cached_tokens for _, s in mine) / sum(len(s.input_ids) for _, s in mine)))
        return out

    assert H100.kv_blocks
    blocks = reuse(H100)
    tree = reuse(dataclasses.replace(H100, kv_blocks=False, cache_chunks=False))
    assert len(blocks) == 4
    assert sum(abs(sim - real) <= 0.01 for real, sim in blocks) >= 3, blocks
    assert all(sim < real - 0.005 for real, sim in tree), tree
    assert all(b[1] > t[1] for b, t in zip(blocks, tree, strict=True)), (blocks, tree)
