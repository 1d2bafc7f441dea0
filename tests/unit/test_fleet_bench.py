"""The GPU fleet benchmark's pure parts: one trace per seed and rate, fresh text per phase, the knee."""

from __future__ import annotations

import json
import math
from pathlib import Path

from loadtests.gpu.fleet import (
    Record,
    Shape,
    balanced_placement,
    phase_order,
    phase_texts,
    routing_section,
    spec_kv_events,
    spec_peers,
    spec_replicas,
    summarize,
    text_key,
    trace,
)
from loadtests.gpu.fleet_report import knee, repeatability, standing, standing_list


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


def test_same_text_gives_every_router_at_a_rate_the_same_prompts_and_each_rate_its_own() -> None:
    shape = Shape(groups=4, system_chars=800, question_chars=50)
    arrivals = trace(3, 10, shape, seed=1)
    # two routers at 3/s (phases 11 and 12 of a cell based at 10), one at 4.5/s, the warm-up (10)
    first, second = (phase_texts(arrivals, shape, text_key("same", 10, 3, phase)) for phase in (11, 12))
    assert first == second
    other_rate = phase_texts(arrivals, shape, text_key("same", 10, 4.5, 13))
    warmup = phase_texts(arrivals, shape, 10)
    assert {s for s, _ in first}.isdisjoint({s for s, _ in other_rate} | {s for s, _ in warmup})
    assert phase_texts(arrivals, shape, text_key("fresh", 10, 3, 11)) != phase_texts(
        arrivals, shape, text_key("fresh", 10, 3, 12))


def test_rounds_of_every_router_rotate_so_none_always_runs_first() -> None:
    # one round per rate: the order rotates by one per rate (the runs before --repeat)
    assert [n for _, _, n in phase_order(["a", "b", "c"], [3, 4.5])] == ["a", "b", "c", "b", "c", "a"]
    order = phase_order(["a", "b"], [3, 4.5], repeat=2)
    assert [(r, k, n) for r, k, n in order] == [(3, 0, "a"), (3, 0, "b"), (3, 1, "b"), (3, 1, "a"),
                                                (4.5, 0, "a"), (4.5, 0, "b"), (4.5, 1, "b"), (4.5, 1, "a")]


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


def test_a_variant_turns_on_the_engines_events_and_the_runs_tokenizer_for_itself_alone() -> None:
    spec = "ttft/kv_events=auto/tokenizer=bench"
    assert routing_section(spec, Path("/tok")) == {"policy": "ttft", "tokenizer": "/tok", "params": {}}
    assert spec_kv_events(spec) == "auto"
    assert spec_kv_events("ttft", default="") == ""
    assert spec_kv_events("ttft", default="auto") == "auto"


def test_a_cell_cut_short_reports_its_measured_phases_and_marks_the_rest_not_run(tmp_path: Path) -> None:
    from loadtests.gpu.fleet_report import report

    done = summarize([Record("ttft", 3, 1, i, 0, 0.0, ttft=0.2, e2e=1.0, ok=True) for i in range(20)], 0.6)
    cell = {"argv": [], "prompts": "text", "reports": "minimal", "shape": {"workload": "shared"}, "seed": 1,
            "workers": 4, "rates": [3.0, 6.0], "routers": ["oracle", "ttft"], "engine": "gpu", "complete": False,
            "summary": {"oracle": {"3": done}, "ttft": {"3": done}}}
    path = tmp_path / "summary.jsonl"
    path.write_text(json.dumps(cell) + "\n")
    text = report([path])
    assert "cut short" in text
    assert "| ttft | 200 / **200** / -, 60% | not run |" in text
    assert "ttft 1.00x @3, - @6" in text


def test_the_engine_view_names_each_engines_load_reuse_and_least_free_kv(tmp_path: Path) -> None:
    from loadtests.gpu.fleet_report import engines_report

    reqs = [{"at": 10.0, "first": 10.0 + 0.1 * k, "done": 12.0, "prompt": 1000, "cached": 600, "queued": 0.01}
            for k in range(1, 11)]
    row = {"router": "ttft", "rate": 4.5, "phase": 501, "prompts": "text", "reports": "minimal", "engines": [
        {"worker": "http://a", "requests": reqs, "timeline": [[1.0, 3, 0, 0, 900, 100], [1.25, 5, 1, 700, 200, 50]],
         "blocks": 1500},
        {"worker": "http://b", "requests": [], "timeline": []}]}
    path = tmp_path / "engines.jsonl"
    path.write_text(json.dumps(row) + "\n")
    text = engines_report(path)
    assert "http://a: 10 requests, TTFT max 1.00 s p90 0.90 s, reuse 60%, least free KV 250/1500 blocks" in text
    assert "http://b: no requests" in text


def test_standing_ranks_a_router_against_the_better_gateway_of_each_run(tmp_path: Path) -> None:
    def cell(**p95: float) -> str:
        return json.dumps({"prompts": "text", "reports": "minimal", "seed": 1, "rates": [4.5],
                           "summary": {n: {"4.5": {"ttft_p95": v}} for n, v in p95.items()}})
    path = tmp_path / "summary.jsonl"
    path.write_text("\n".join([cell(ttft=0.5, smg=1.0, oracle=1.0), cell(ttft=2.0, smg=1.0, **{"sglang-router": 4.0}),
                                cell(ttft=1.0, oracle=2.0)]) + "\n")  # the last ran no gateway: left out
    out = standing([path])
    assert "| smg 1,000 | 0.50x | 0.50x |" in out and "| smg 1,000 | 2.00x | - |" in out
    assert "2 points: geometric mean 1.00x, 1 at or under 0.7x, 1 under 1.0x, worst 2.00x" in out
    assert "interval" not in out  # two points say nothing of their spread
    assert "at 4.5/s" not in out  # one rate: no breakdown


def test_standing_ranks_against_one_gateway_alone_when_told(tmp_path: Path) -> None:
    # smg as shipped and with its overload protection off, beside the default in one cell
    path = tmp_path / "summary.jsonl"
    path.write_text(json.dumps({"prompts": "ids", "reports": "full", "seed": 121, "rates": [10],
                                "summary": {"ttft": {"10": {"ttft_p95": 3.0}}, "smg": {"10": {"ttft_p95": 6.0}},
                                            "smg-open": {"10": {"ttft_p95": 2.0}}}}) + "\n")
    assert "| smg-open 2,000 | 1.50x |" in standing([path])  # the better of the two
    assert "| smg 6,000 | 0.50x |" in standing([path], peers=("smg",))
    assert "| smg-open 2,000 | 1.50x |" in standing([path], peers=("smg-open",))
    assert "points" not in standing([path], peers=("sglang-router",))  # that gateway never ran here


def test_standing_gives_each_rate_its_own_mean_too(tmp_path: Path) -> None:
    path = tmp_path / "summary.jsonl"
    path.write_text(json.dumps({"prompts": "ids", "reports": "minimal", "seed": 3, "rates": [4.5, 6],
                                "summary": {"ttft": {"4.5": {"ttft_p95": 0.5}, "6": {"ttft_p95": 2.0}},
                                            "smg": {"4.5": {"ttft_p95": 1.0}, "6": {"ttft_p95": 1.0}}}}) + "\n")
    out = standing([path])
    assert "2 points: geometric mean 1.00x" in out
    assert "at 4.5/s: 1 points: geometric mean 0.50x, 1 at or under 0.7x" in out
    assert "at 6/s: 1 points: geometric mean 2.00x, 0 at or under 0.7x, 0 under 1.0x" in out
    assert "ids at 4.5/s" not in out  # one prompt form: no breakdown by form

    def add_text_cell_at_6(reports: str, seed: int, ours: float) -> str:
        path.write_text(path.read_text() + json.dumps({
            "prompts": "text", "reports": reports, "seed": seed, "rates": [6],
            "summary": {"ttft": {"6": {"ttft_p95": ours}}, "smg": {"6": {"ttft_p95": 1.0}}}}) + "\n")
        return standing([path])

    out = add_text_cell_at_6("minimal", 4, 0.5)
    assert "at 6/s: 2 points: geometric mean 1.00x" in out
    assert "ids at 6/s: 1 points: geometric mean 2.00x" in out and "text at 6/s: 1 points: geometric mean 0.50x" in out
    assert "ids at 4.5/s: 1 points: geometric mean 0.50x" in out
    # the two forms side by side in one run at one rate: the machine of the day weighs on both
    assert "ids / text within a run and rate: 1 runs with both, geometric mean 4.00x, ids ahead in 0" in out
    assert "minimal reports" not in out  # one report mode: no breakdown by it
    out = add_text_cell_at_6("full", 5, 0.25)
    assert "full reports: 1 points: geometric mean 0.25x" in out
    assert "minimal reports: 3 points: geometric mean 0.79x" in out  # (0.5 x 2 x 0.5)^(1/3)
    assert "ids / text within a run and rate: 1 runs with both, geometric mean 5.66x" in out  # 2 / (0.5 x 0.25)^(1/2)


def test_standing_keeps_unique_prompt_cells_a_form_of_their_own(tmp_path: Path) -> None:
    """Unique prompts (nothing to reuse) rank load balancing alone: their points are counted, but
    the per-form lines never pool them with the same prompts' shared-prefix cells."""
    path = tmp_path / "summary.jsonl"
    path.write_text("".join(json.dumps({
        "prompts": "ids", "reports": "full", "seed": seed, "rates": [6], "shape": {"workload": workload},
        "summary": {"ttft": {"6": {"ttft_p95": ours}}, "smg": {"6": {"ttft_p95": 1.0}}}}) + "\n"
        for seed, workload, ours in ((1, "shared", 0.5), (2, "unique", 2.0))))
    out = standing([path])
    assert "2 points: geometric mean 1.00x" in out
    assert "ids at 6/s: 1 points: geometric mean 0.50x" in out
    assert "ids unique at 6/s: 1 points: geometric mean 2.00x" in out
    assert "| ids unique, full, 2," in out


def test_standing_says_how_well_its_points_pin_the_mean_down(tmp_path: Path) -> None:
    # ratios 0.5, 1, 2: log mean 0, sample sd ln 2, so the 95% half-width is 1.96 ln2 / sqrt(3)
    path = tmp_path / "summary.jsonl"
    path.write_text("\n".join(json.dumps({"prompts": "ids", "reports": "full", "seed": 2, "rates": [6],
                                          "summary": {"ttft": {"6": {"ttft_p95": r}}, "smg": {"6": {"ttft_p95": 1.0}}}})
                              for r in (0.5, 1.0, 2.0)) + "\n")
    half = 1.96 * math.log(2) / math.sqrt(3)
    assert (f"3 points: geometric mean 1.00x, 1 at or under 0.7x, 1 under 1.0x, worst 2.00x "
            f"(95% interval of the mean {math.exp(-half):.2f}-{math.exp(half):.2f}x)") in standing([path])


def test_repeatability_sets_a_fixed_router_on_the_same_phases_of_several_runs_side_by_side(tmp_path: Path) -> None:
    def run(name: str, smg: float, ttft: float, base: str = "1900", text: str = "same") -> Path:
        cell = {"prompts": "ids", "reports": "minimal", "seed": 9, "rates": [6.0], "text": text,
                "argv": ["--phase-base", base],
                "summary": {"smg": {"6": {"ttft_p50": smg / 4, "ttft_p95": smg}},
                            "ttft": {"6": {"ttft_p50": 0.5, "ttft_p95": ttft}}}}
        path = tmp_path / name / "summary.jsonl"
        path.parent.mkdir()
        path.write_text(json.dumps(cell) + "\n")
        return path

    out = repeatability([run("day-1", 2.0, 1.0), run("day-2", 3.0, 9.0), run("other-phases", 5.0, 1.0, base="2600"),
                         run("fresh-text", 7.0, 1.0, text="fresh")])
    # smg on phase base 1900 twice: 2,000 and 3,000 ms, 1.5x; nothing else ran the same phases twice,
    # fresh text never counts, and ttft (which learns) is not a fixed router
    assert "| smg | ids, minimal, 9, 1900 | 6 | day-1 2,000; day-2 3,000 | 1.50 | 1.50 |" in out
    assert "2600" not in out and "fresh-text" not in out and "| ttft |" not in out


def test_a_variant_runs_several_proxies_that_share_nothing() -> None:
    spec = "ttft/replicas=4/kv_events=auto"
    assert spec_replicas(spec) == 4 and spec_replicas("ttft") == 1
    assert routing_section(spec) == {"policy": "ttft", "params": {}}
    import pytest
    with pytest.raises(ValueError, match="replicas"):
        spec_replicas("ttft/replicas=0")


def test_replicas_share_their_decisions_only_when_the_spec_says_peers() -> None:
    import pytest
    assert spec_peers("ttft/replicas=4/peers=on") and not spec_peers("ttft/replicas=4")
    assert not spec_peers("ttft/replicas=4/peers=off")
    assert routing_section("ttft/replicas=4/peers=on") == {"policy": "ttft", "params": {}}
    with pytest.raises(ValueError, match="peers needs replicas"):
        spec_peers("ttft/peers=on")


def test_a_fresh_variant_is_no_routing_key() -> None:
    from loadtests.gpu.fleet import spec_fresh

    assert spec_fresh("ttft/fresh=on/popularity=false") and not spec_fresh("ttft") and not spec_fresh("ttft/fresh=off")
    assert routing_section("ttft/fresh=on/popularity=false") == {"policy": "ttft", "params": {"popularity": False}}


def test_forgetting_between_rounds_drops_the_fit_or_the_counts_and_nothing_else() -> None:
    from loadtests.gpu.fleet_sim import forget
    from proxy.routing.ttft_cost import TtftCost, TtftParams
    from tests.unit.test_ttft import finish, fleet, prompt

    def trained() -> TtftCost:
        policy = TtftCost(TtftParams())
        for k in range(40):
            r = prompt(k, 200, shared=150, shared_tag=k % 3)
            finish(policy, r, policy.select(r, fleet()).worker, ttft=2.0)  # far slower than the prior says
        return policy

    prior = TtftCost(TtftParams()).model.terms()
    learned = trained()
    assert learned.model.terms() != prior and learned.popularity.load(fleet()[0].url) + learned.popularity.load(
        fleet()[1].url) + learned.popularity.load(fleet()[2].url) > 0
    for what, model_reset, counts_reset in (("model", True, False), ("popularity", False, True), ("all", True, True)):
        policy = trained()
        terms, loads = policy.model.terms(), [policy.popularity.load(w.url) for w in fleet()]
        forget([policy], what)
        assert (policy.model.terms() == prior) is model_reset and (policy.model.terms() == terms) is not model_reset
        after = [policy.popularity.load(w.url) for w in fleet()]
        assert (after == [0.0] * len(after)) is counts_reset and (after == loads) is not counts_reset


def test_standing_takes_the_first_of_several_router_names_a_cell_ran(tmp_path: Path) -> None:
    path = tmp_path / "summary.jsonl"
    path.write_text("\n".join(json.dumps({"prompts": "text", "reports": "full", "seed": 9, "rates": [6],
                                          "summary": {**mine, "smg": {"6": {"ttft_p95": 1.0}}}})
                              for mine in ({"ttft": {"6": {"ttft_p95": 0.5}}},
                                           {"ttft/popularity=false": {"6": {"ttft_p95": 2.0}},
                                            "ttft/popularity=true": {"6": {"ttft_p95": 9.0}}})) + "\n")
    assert "1 points" in standing([path])
    both = standing([path], "ttft,ttft/popularity=false")
    assert "| 2,000 | smg 1,000 | 2.00x |" in both and "2 points: geometric mean 1.00x" in both


def test_the_tail_report_says_whether_the_slowest_are_cold_firsts_or_late_followers(tmp_path: Path) -> None:
    from loadtests.gpu.fleet_report import tail_report

    rows = []
    for i in range(40):  # 4.5/s: groups 0-3 start cold, their first requests are the slowest
        group, first = i % 4, i < 4
        rows.append({"router": "ttft", "phase": 1, "rate": 4.5, "group": group, "at": float(i),
                     "ttft": 3.0 - 0.1 * i if first else 0.2, "ok": True})
    for i in range(40):  # 6/s: a queue that grows, the last arrivals the slowest; one never answered
        rows.append({"router": "ttft", "phase": 2, "rate": 6.0, "group": i % 4, "at": float(i),
                     "ttft": 0.1 * i, "ok": i != 39})
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = tail_report([path]).splitlines()
    assert lines[0].startswith("4.5/s, 1 phases: of the slowest 5% (2 requests) 2 their group's first (100%)")
    assert lines[1].startswith("6/s, 1 phases: of the slowest 5% (2 requests) 0 their group's first (0%)")
    assert "arrived at 99%-99%" in lines[1]  # arrivals 38 and 39 (mean 38.5) of a phase whose last is at 39


def test_the_standing_list_names_runs_by_directory_and_skips_comments(tmp_path: Path) -> None:
    listing = tmp_path / "STANDING.txt"
    listing.write_text("# header\ngpu-fleet-a\n\n  gpu-fleet-b  # the second\n")
    assert standing_list(listing) == [tmp_path / "gpu-fleet-a" / "summary.jsonl", tmp_path / "gpu-fleet-b" / "summary.jsonl"]


def test_every_run_the_committed_standing_counts_has_its_summary() -> None:
    paths = standing_list()
    assert len(paths) >= 40 and all(p.is_file() for p in paths)
    assert "points: geometric mean" in standing(paths, "ttft,ttft/popularity=false")


def test_the_balanced_placement_spreads_groups_by_the_requests_they_will_bring() -> None:
    # group 0 brings 5 requests, 1 brings 3, 2 and 3 two each, 4 one: most first, each to the
    # worker with the fewest requests so far
    arrivals = [(float(i), g) for i, g in enumerate([0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4])]
    placed = balanced_placement(arrivals, 2)
    assert placed == {0: 0, 1: 1, 2: 1, 3: 0, 4: 1}
    load = [0, 0]
    for _, g in arrivals:
        load[placed[g]] += 1
    assert load == [7, 6]
    # every group of a real trace is placed, on a worker that exists
    trace_ = trace(4.5, 25.0, Shape(), seed=3)
    placed = balanced_placement(trace_, 4)
    assert set(placed) == {g for _, g in trace_} and set(placed.values()) <= {0, 1, 2, 3}


def test_a_replay_leaves_out_the_runs_whose_engines_ran_on_another_gpu(tmp_path: Path, capsys) -> None:
    from loadtests.gpu.fleet_report import on_profile_gpu
    from proxy.sim import perf

    h100, h200, unnamed, planned = tmp_path / "h100", tmp_path / "h200", tmp_path / "old", tmp_path / "planned"
    for run in (h100, h200, unnamed):
        run.mkdir()
        (run / "requests.jsonl").write_text("")
    planned.mkdir()
    (planned / "PREDICTED.md").write_text("# Predicted before the call\n")
    # gpu.txt as run_fleet.sh writes it: nvidia-smi's CSV header, then the card
    (h100 / "gpu.txt").write_text("name, memory.total [MiB], driver_version\nNVIDIA H100 80GB HBM3, 81559 MiB, 580\n")
    (h200 / "gpu.txt").write_text("name, memory.total [MiB], driver_version\nNVIDIA H200, 143771 MiB, 570\n")
    runs = [h100, h200, unnamed, planned]
    assert on_profile_gpu(runs, perf.PROFILES[perf.GPU_FLEET_PROFILE].gpu.name) == [h200, unnamed]
    assert on_profile_gpu(runs, perf.PROFILES["h100-transformers-16l-dense-fit"].gpu.name) == [h100]
    err = capsys.readouterr().err
    assert "h100: left out, its engines ran on an H100" in err
    # a planned run's directory (PREDICTED.md alone) is named as not run, not as another GPU's
    assert "planned: left out, no requests recorded (not run yet)" in err and "planned: left out, its engines" not in err


def test_every_committed_run_names_the_gpu_its_engines_ran_on_or_ran_before_the_h100() -> None:
    """The replays' filter reads gpu.txt; a run without one is taken for an H200 run, which every
    such run is (the H100 runs started on 2026-12-06, each with its gpu.txt)."""
    from loadtests.gpu.fleet_report import run_gpu

    results = Path(__file__).resolve().parents[2] / "loadtests" / "results"
    named = {run.name: run_gpu(run) for run in results.glob("gpu-fleet*") if run.is_dir()}
    assert {"H100", "H200"} <= set(named.values())
    assert all(gpu == "H100" for name, gpu in named.items() if name.startswith("gpu-fleet-h100"))


def test_standing_names_the_cells_where_a_side_lost_requests_instead_of_dropping_them(tmp_path: Path) -> None:
    inf = math.inf

    def cell(ttft: float, smg: float) -> str:
        return json.dumps({"prompts": "ids", "reports": "full", "seed": 98, "rates": [10],
                           "summary": {"ttft": {"10": {"ttft_p95": ttft}}, "smg": {"10": {"ttft_p95": smg}}}})
    path = tmp_path / "summary.jsonl"
    path.write_text("\n".join([cell(0.5, 1.0), cell(5.75, inf), cell(inf, 2.0), cell(inf, inf)]) + "\n")
    out = standing([path])
    assert "| 10 | 5,750 | smg failed | smg failed | - |" in out
    assert "| 10 | failed | smg 2,000 | ttft failed | - |" in out
    assert "| both failed |" in out
    assert "1 points: geometric mean 0.50x" in out  # only the finite ratio is averaged
    assert "besides, cells where requests failed: the better peer alone in 1, ttft alone in 1, both in 1" in out
    path.write_text(cell(0.5, 1.0) + "\n")
    assert "besides" not in standing([path])


def test_standing_pairs_prompt_forms_only_within_a_run(tmp_path: Path) -> None:
    def run(name: str, **form_p95: float) -> Path:
        path = tmp_path / name / "summary.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps({"prompts": form, "reports": "minimal", "seed": 1, "rates": [6],
                                            "summary": {"ttft": {"6": {"ttft_p95": p95}}, "smg": {"6": {"ttft_p95": 1.0}}}})
                                + "\n" for form, p95 in form_p95.items()))
        return path

    # pooled, ids 2.0x against text 0.5x (the mean of 1.0 and 0.25) reads 4x; within run a, 2x
    out = standing([run("a", ids=2.0, text=1.0), run("b", text=0.25)])
    assert "text at 6/s: 2 points: geometric mean 0.50x" in out
    assert "ids / text within a run and rate: 1 runs with both, geometric mean 2.00x, ids ahead in 0" in out
