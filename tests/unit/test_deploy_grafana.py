"""deploy/grafana: every panel query names metrics a real proxy exports (or series the recording
rules record), the JSON is what build_dashboard.py writes, and the layout and datasource are sane."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_deploy_prometheus import _load_script, check_exprs, exported, recorded

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
__all__ = ["exported"]  # the module-scoped fixture, shared with the Prometheus tests


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GRAFANA / "radixgate.json").read_text())
    return doc


def queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_json_is_what_the_builder_writes(dashboard: dict[str, Any]) -> None:
    builder = _load_script(GRAFANA / "build_dashboard.py")
    assert dashboard == builder.dashboard(), "run deploy/grafana/build_dashboard.py"


def test_every_query_reads_exported_metrics_or_recorded_series(dashboard: dict[str, Any], exported: set[str]) -> None:
    exprs = queries(dashboard)
    assert len(exprs) >= 20
    check_exprs(exprs, exported, recorded())


def test_the_panels_the_issue_asks_for_are_there(dashboard: dict[str, Any]) -> None:
    text = " ".join(queries(dashboard))
    for needle in ("fleet:radixgate_ttft_seconds:p95_5m", "worker:radixgate_ttft_seconds:p95_5m",
                   "fleet:radixgate_cache_hit_ratio:captured_5m", "fleet:radixgate_cache_hit_ratio:available_5m",
                   "worker:radixgate_worker_occupancy_ratio:avg", "radixgate_admission_queue_depth",
                   "fleet:radixgate_errors:rate5m", "radixgate_policy_decisions_total",
                   "fleet:radixgate_diagnosis_verdict:max", "radixgate_diagnosis_gpu_idle_ratio"):
        assert needle in text, needle
    stage_panels = [p for p in dashboard["panels"] if p["title"].startswith("Stage latency")]
    assert {p["title"] for p in stage_panels} == {"Stage latency p50", "Stage latency p95"}
    assert all(len(p["targets"]) >= 8 for p in stage_panels)


def test_every_panel_uses_the_datasource_variable_and_fits_the_grid_without_overlap(
    dashboard: dict[str, Any],
) -> None:
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert all(t["datasource"] == p["datasource"] and t["refId"] for t in p["targets"])
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_provisioning_points_grafana_at_the_dashboard_folder() -> None:
    (provider,) = yaml.safe_load((GRAFANA / "provisioning/dashboards/radixgate.yaml").read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == "/var/lib/grafana/dashboards"
    (source,) = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
