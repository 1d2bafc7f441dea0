"""The batch-by-batch comparison: the replay logs its steps as the GPU shim logs the engine's."""

from __future__ import annotations

import dataclasses
import math

from loadtests import fidelity
from loadtests.fidelity_batches import F, summarize
from loadtests.gpu.batch_log import FIELDS
from proxy.sim import perf
from proxy.sim.config import SimConfig


def batch(t: float, end: float, decodes: int, prefills: int, first: int, free: int, waiting: int) -> list[float]:
    row = [0.0] * len(FIELDS)
    row[F["t"]], row[F["end"]], row[F["decodes"]], row[F["prefills"]] = t, end, decodes, prefills
    row[F["first_tokens"]], row[F["free_blocks"]], row[F["waiting"]] = first, free, waiting
    return row


def test_a_step_without_a_prompt_while_prompts_wait_is_blocked() -> None:
    got = summarize([
        batch(0.0, 0.3, 2, 1, 1, 500, 0),   # takes in a prompt
        batch(0.3, 0.4, 3, 0, 0, 100, 2),   # two waiting, none taken: blocked, 100 blocks free
        batch(0.4, 0.5, 3, 0, 0, 300, 0),   # nothing waiting: a decode step, not blocked
        batch(0.5, 1.0, 3, 1, 1, 200, 1),
    ])
    assert got["steps/s"] == 4 / 1.0 and got["prompts/s"] == 2 / 1.0
    assert got["blocked share"] == 0.25 and got["free blocks blocked"] == 100
    assert math.isclose(got["decode ms"], 100) and math.isclose(got["prefill ms"], 400)
    assert got["prefill share"] == 0.5 and got["decodes/step"] == 11 / 4


def test_the_replay_logs_every_step_it_ran_with_the_prompts_each_finished() -> None:
    profile = perf.PROFILES["h200-transformers-7b"]
    prompts = [[k * 1000 + j for j in range(300)] for k in range(4)]
    got: list[tuple[int, list[float]]] = []
    out = fidelity.replay(prompts, [0.0, 0.0, 0.5, 0.6], [0, 0, 0, 0], 1, 8, profile,
                          SimConfig(profile=profile.name, max_total_tokens=48_000, page_size=32), 30.0,
                          batches_into=got)
    assert math.isfinite(out["ttft_p95"])
    rows = [b for _, b in got]
    assert sum(b[F["first_tokens"]] for b in rows) == 4  # every prompt finished once
    assert all(b[F["end"]] > b[F["t"]] for b in rows)  # every step ended after it began
    assert rows[0][F["prefills"]] == 2 and rows[0][F["q_tokens"]] == 600  # both first prompts in one step
    assert max(b[F["decodes"]] for b in rows) >= 2


def test_a_prompt_matched_but_over_the_read_budget_is_logged_as_waiting() -> None:
    # As the engine's log has it: a prompt stays in the waiting queue until a step takes a chunk of
    # it, even once matched to the cache. Here the first request's decodes read ~300 tokens of the
    # 400-token read budget, so the second (256 of its tokens cached) waits until the first ends.
    profile = dataclasses.replace(perf.PROFILES["h200-transformers-7b"], kv_read_budget=400)
    shared = list(range(256))
    prompts = [shared + [1000 + j for j in range(44)], shared + [2000 + j for j in range(44)]]
    got: list[tuple[int, list[float]]] = []
    fidelity.replay(prompts, [0.0, 0.5], [0, 0], 1, 16, profile,
                    SimConfig(profile=profile.name, max_total_tokens=48_000, page_size=32), 30.0, batches_into=got)
    rows = [b for _, b in got]
    blocked = [b for b in rows if b[F["waiting"]] > 0 and b[F["prefills"]] == 0]
    assert blocked and all(b[F["decodes"]] == 1 for b in blocked)
    assert summarize(rows)["blocked share"] > 0
    assert sum(b[F["first_tokens"]] for b in rows) == 2  # the second ran once the first was done
