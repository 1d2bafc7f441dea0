"""Fitting the engine's step costs to its batch log: the constants that made the log come back."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from loadtests.fit_steps import (
    F,
    decode_by_workload,
    decode_residual,
    fit_steps,
    lone_overhead,
    lone_workloads,
    work_of,
)
from loadtests.gpu.batch_log import FIELDS
from proxy.sim import perf

PROFILE = perf.PROFILES["h200-transformers-7b-slices"]


def logged(decodes: int, prefills: int, new_tokens: int, kv_read: int, seconds: float, t: float) -> list[float]:
    row = [0.0] * len(FIELDS)
    row[F["t"]], row[F["end"]] = t, t + seconds
    row[F["decodes"]], row[F["prefills"]] = decodes, prefills
    row[F["q_tokens"]], row[F["kv_read"]] = decodes + new_tokens, kv_read
    return row


def log_of(true: perf.Profile) -> list[list[float]]:
    rows, t = [], 0.0
    for decodes in (0, 1, 3, 8, 14):
        for prefills, new in ((0, 0), (1, 900), (2, 5000)):
            for per_ctx in (500, 3000):
                if decodes + prefills == 0:
                    continue
                row = logged(decodes, prefills, new, decodes * per_ctx, 0.0, t)
                row[F["end"]] = t + perf.step_seconds(true, work_of(row))
                rows.append(row)
                t = row[F["end"]]
    return rows


def test_the_fit_gives_back_the_constants_the_steps_were_timed_with() -> None:
    true = dataclasses.replace(PROFILE, mfu=0.3, step_overhead_s=0.045, seq_overhead_s=0.003, ctx_overhead_s=2e-6,
                               warmup_s=0.0)
    fit = fit_steps(log_of(true), PROFILE)
    assert fit.mfu == 0.3 and fit.rms_s < 1e-6
    assert math.isclose(fit.step_overhead_s, 0.045, rel_tol=1e-3)
    assert math.isclose(fit.seq_overhead_s, 0.003, rel_tol=1e-3)
    assert math.isclose(fit.ctx_overhead_s, 2e-6, rel_tol=1e-3)
    assert "--set mfu=0.3 --set step_overhead_s=0.045" in fit.options()


def test_no_cost_comes_out_negative() -> None:
    # Steps that cost less with more sequences: the unconstrained fit would price a sequence below
    # zero; the fit holds that cost at 0 instead.
    rows = [logged(d, 0, 0, 1000 * d, 0.2 - 0.01 * d, 1.0 * d) for d in range(1, 12)]
    fit = fit_steps(rows, PROFILE)
    assert min(fit.step_overhead_s, fit.seq_overhead_s, fit.ctx_overhead_s) >= 0
    assert fit.seq_overhead_s == 0 and fit.ctx_overhead_s == 0


def test_a_log_too_short_is_refused() -> None:
    with pytest.raises(ValueError, match="too few"):
        fit_steps([logged(1, 0, 0, 100, 0.1, 0.0)], PROFILE)


def test_with_dense_attention_the_fit_gives_back_its_efficiency_too() -> None:
    dense = perf.PROFILES["h200-transformers-7b-dense"]
    true = dataclasses.replace(dense, mfu=0.5, attn_eff=0.33, step_overhead_s=0.058, seq_overhead_s=0.0015,
                               ctx_overhead_s=7e-7, warmup_s=0.0)
    fit = fit_steps(log_of(true), dense)
    assert (fit.mfu, fit.attn_eff) == (0.5, 0.33) and fit.rms_s < 1e-6
    assert math.isclose(fit.step_overhead_s, 0.058, rel_tol=1e-3)
    assert "--set attn_eff=0.33" in fit.options()


def test_one_engines_fixed_cost_is_read_from_its_steps_the_other_costs_kept() -> None:
    # A machine whose host is slower by 20 ms a step: the profile's other constants stand, and
    # the fixed cost that gives its steps back is the machine's, whatever mix the steps held.
    dense = perf.PROFILES["h200-transformers-7b-dense"]
    slow = dataclasses.replace(dense, step_overhead_s=dense.step_overhead_s + 0.02, warmup_s=0.0)
    assert lone_overhead(log_of(slow), dense) == pytest.approx(slow.step_overhead_s, abs=1e-4)
    light = [row for row in log_of(slow) if row[F["decodes"]] <= 1]
    assert lone_overhead(light, dense) == pytest.approx(slow.step_overhead_s, abs=1e-4)
    # a few wild steps (a stall) do not move it: it is the median's
    stalled = log_of(slow)
    for row in stalled[:5]:
        row[F["end"]] += 2.0
    assert lone_overhead(stalled, dense) == pytest.approx(slow.step_overhead_s, abs=0.005)
    assert lone_overhead(stalled[:9], dense) is None  # too few steps to say


def test_decode_beside_shared_prefixes_is_told_apart_from_the_machines_speed(tmp_path: Path) -> None:
    # One engine alone on a host 20 ms a step slower than the profile, decoding 5 ms a step slower
    # in its shared-prompt phases: the run's own fixed cost takes the host out, and what is left
    # is the shared phases' 5 ms. A phase of four engines is not one engine alone's.
    dense = perf.PROFILES["h200-transformers-7b-dense"]
    slow = dataclasses.replace(dense, step_overhead_s=dense.step_overhead_s + 0.02, warmup_s=0.0)

    def phase(extra_s: float) -> list[list[float]]:
        rows = log_of(slow)
        for row in rows:
            if row[F["prefills"]] == 0:
                row[F["end"]] += extra_s
        return rows

    cells = [{"argv": ["--phase-base", "100"], "workers": 1, "rates": [1, 2], "shape": {"workload": "shared"}},
             {"argv": ["--phase-base", "200"], "workers": 1, "rates": [1], "repeat": 2, "shape": {"workload": "unique"}},
             {"argv": ["--phase-base", "300"], "workers": 4, "rates": [6], "shape": {"workload": "unique"}}]
    (tmp_path / "summary.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    lines = [{"phase": 101, "engines": [{"batches": phase(0.005)}]}, {"phase": 102, "engines": [{"batches": phase(0.005)}]},
             {"phase": 201, "engines": [{"batches": phase(0.0)}]}, {"phase": 202, "engines": [{"batches": phase(0.0)}]},
             {"phase": 301, "engines": [{"batches": phase(0.5)}] * 4}]
    (tmp_path / "engines.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lines))
    assert lone_workloads(tmp_path) == {101: ("shared", 1.0), 102: ("shared", 2.0), 201: ("unique", 1.0),
                                        202: ("unique", 1.0)}
    assert decode_residual(phase(0.0), slow) == (8, pytest.approx(0.0, abs=1e-9))
    assert decode_residual([r for r in phase(0.0) if r[F["prefills"]]], slow) is None
    out = decode_by_workload(tmp_path, dense)
    assert "shared less unique +5.0 ms" in out and "301" not in out
    assert "101 shared 1/s +5 ms (8)" in out and "202 unique 1/s +0 ms (8)" in out
