"""The GPU fleet benchmark's pure parts: one trace per seed and rate, fresh text per phase, the knee."""

from __future__ import annotations

import json
import math
from pathlib import Path

from loadtests.gpu.fleet import Record, Shape, knee, phase_texts, routing_section, summarize, trace


def test_every_router_gets_the_same_arrivals_at_a_rate_and_a_new_seed_gives_new_ones() -> None:
    shape = Shape()
    assert trace(4.5, 20, shape, seed=1) == trace(4.5, 20, shape, seed=1)
    assert trace(4.5, 20, shape, seed=1) != trace(4.5, 20, shape, seed=2)
    arrivals = trace(4.5, 20, shape, seed=1)
    assert len(arrivals) == 90 and all(0 <= g < shape.groups for _, g in arrivals)
    assert [t for t, _ in arrivals] == sorted(t for t, _ in arrivals)


def test_each_phase_has_fresh_text_and_a_group_shares_its_system_prompt_within_a_phase() -> None:
    shape = Shape(groups=4, system_chars=800, question_chars=50)
    arrivals = trace(3, 10, shape, seed=1)
    a, b = phase_texts(arrivals, shape, phase=1), phase_texts(arrivals, shape, phase=2)
    assert a == phase_texts(arrivals, shape, phase=1)
    assert {s for s, _ in a}.isdisjoint({s for s, _ in b})
    by_group: dict[int, set[str]] = {}
    for (system, _), (_, g) in zip(a, arrivals, strict=True):
        by_group.setdefault(g, set()).add(system)
    assert all(len(systems) == 1 for systems in by_group.values())
    unique = phase_texts(arrivals, Shape(groups=4, system_chars=800, question_chars=50, workload="unique"), 1)
    assert len({s for s, _ in unique}) == len(arrivals)


def test_a_failed_request_counts_as_infinitely_slow_in_the_percentiles() -> None:
    records = [Record("r", 1, 1, i, 0, 0.0, ttft=0.1, e2e=1.0, ok=True) for i in range(18)]
    records += [Record("r", 1, 1, 18 + i, 0, 0.0) for i in range(2)]
    s = summarize(records, None)
    assert s["failed"] == 2 and s["ttft_p50"] == 0.1 and math.isinf(s["ttft_p95"])


def test_the_knee_is_the_highest_rate_where_the_oracle_meets_the_bound(tmp_path: Path) -> None:
    def cell(p95s: dict[float, float]) -> str:
        return json.dumps({"rates": list(p95s), "routers": ["oracle"],
                           "summary": {"oracle": {f"{r:g}": {"ttft_p95": v} for r, v in p95s.items()}}})

    path = tmp_path / "summary.jsonl"
    path.write_text(cell({3.0: 0.7, 6.0: 6.1, 10.0: math.inf}) + "\n")
    assert knee(path, 2.0) == "3,6"
    path.write_text(cell({3.0: 0.7, 6.0: 1.9, 10.0: 1.95}) + "\n")
    assert knee(path, 2.0) == "10,15"


def test_a_policy_variant_names_routing_settings_and_policy_params() -> None:
    assert routing_section("ttft") == {"policy": "ttft", "params": {}}
    assert routing_section("ttft/hold_max_s=0/work_weight=10") == {
        "policy": "ttft", "hold_max_s": 0, "params": {"work_weight": 10}}
