"""The replay runs each GPU round on its engines' own KV pool, as their logs give it."""

from __future__ import annotations

from pathlib import Path

from loadtests.fidelity_replay import POOL_TOKENS, placed_phases, pool_of, run_pool

RESULTS = Path(__file__).resolve().parents[2] / "loadtests" / "results"


def test_a_round_is_replayed_on_the_pool_its_engines_logged() -> None:
    """Run 121's engines had 24,000 tokens each (KV=24000): replayed on the usual 48,000 the
    simulated engines evicted nothing and read the GPU's TTFT p95 at 0.15-0.5x."""
    tight = placed_phases(RESULTS / "gpu-fleet-evict-1")
    usual = placed_phases(RESULTS / "gpu-fleet-events-peers-1")
    assert tight and {p.pool_tokens for p in tight} == {24_000}
    assert usual and {p.pool_tokens for p in usual} == {48_000}


def test_a_log_without_the_pool_reads_the_fleets_default() -> None:
    assert pool_of([{"requests": []}]) == POOL_TOKENS
    assert pool_of([]) == POOL_TOKENS
    assert pool_of([{"blocks": 750, "block_size": 32}]) == 24_000


def test_a_runs_pool_is_its_first_logged_phases() -> None:
    """``fleet_sim --cells`` routes a run's cells again on its engines' pool (``run_pool``)."""
    assert run_pool(RESULTS / "gpu-fleet-evict-2") == 24_000
    assert run_pool(RESULTS / "gpu-fleet-alone-3") == 48_000  # 1,500 blocks of 32
    assert run_pool(RESULTS / "no-such-run") == POOL_TOKENS
