"""deploy/prometheus: every radixgate_* metric the rules read is one a real proxy exports (read from
a real App's /metrics on loopback), every recorded series they read is recorded, the alert SLO is
the diagnosis default, the Operator copy is in sync, and the ServiceMonitors select real Services.
(``promtool check rules`` / ``promtool test rules`` are run by hand; see the README "Deploy".)"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import DiagnoseConfig, load
from proxy.diagnose.rules import VERDICT_KINDS
from tests.unit.test_deploy_k8s import rendered

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yaml"))
_SUFFIXES = {"counter": ("",), "gauge": ("",), "untyped": ("",), "histogram": ("_bucket", "_sum", "_count"),
             "summary": ("", "_sum", "_count")}


async def scrape_real_proxy() -> str:
    """/metrics of a real App (no workers needed: every family prints its HELP / TYPE lines)."""
    cfg = load(env={}, overrides={"server.port": 0, "server.admin_port": 0, "health.interval_s": 0,
                                  "scrape.interval_s": 0, "diagnose.nvml_interval_s": 0})
    app = App(cfg, registry=CollectorRegistry())
    await app.start()
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{app.admin_port}/metrics") as response:
            assert response.status == 200
            return await response.text()
    finally:
        await app.stop(0)


def series_names(exposition: str) -> set[str]:
    """Every series name a query may use: counters with _total, histograms with their suffixes."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, re.M):
        names.update(name + suffix for suffix in _SUFFIXES[kind])
    return names


@pytest.fixture(scope="module")
def exported() -> set[str]:
    import uvloop

    return series_names(uvloop.run(scrape_real_proxy()))  # the loop `radixgate serve` runs on


def referenced(expr: str) -> tuple[set[str], set[str]]:
    """(radixgate_* metric names, recorded level:metric:op names) that a PromQL expression reads."""
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    identifiers = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_strings))
    return ({i for i in identifiers if i.startswith("radixgate_")}, {i for i in identifiers if ":" in i})


def rules() -> list[dict[str, Any]]:
    return [rule for path in RULE_FILES for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def check_exprs(exprs: Iterable[str], exported: set[str], recorded_names: set[str]) -> None:
    for expr in exprs:
        metrics, records = referenced(expr)
        assert metrics <= exported, f"{expr!r} reads metrics the proxy does not export: {metrics - exported}"
        assert records <= recorded_names, f"{expr!r} reads series no rule records: {records - recorded_names}"


def test_the_real_scrape_is_the_inventory_we_check_against(exported: set[str]) -> None:
    # A sanity check on the inventory itself: the families the rules rest on are there.
    assert {"radixgate_ttft_seconds_bucket", "radixgate_requests_accepted_total",
            "radixgate_worker_occupancy_ratio", "radixgate_diagnosis_verdict"} <= exported
    assert "radixgate_ttft_seconds" not in exported  # histograms are read through their suffixes


def test_every_rule_reads_only_exported_metrics_and_recorded_series(exported: set[str]) -> None:
    all_rules = rules()
    assert len(all_rules) >= 20
    check_exprs((r["expr"] for r in all_rules), exported, recorded())


def test_recorded_names_follow_level_metric_operation_and_are_unique() -> None:
    names = [r["record"] for r in rules() if "record" in r]
    assert len(names) == len(set(names))
    for name in names:
        level, metric, operation = name.split(":")
        assert level in {"fleet", "worker", "policy"} and metric.startswith("radixgate_") and operation


def test_the_issue_asks_for_these_recordings_and_alerts() -> None:
    names = recorded()
    stages = ["admission_wait", "upstream_ttfb", "upstream_ttft", "ttft", "inter_token_latency", "e2e"]
    for stage in stages:
        assert {f"fleet:radixgate_{stage}_seconds:p50_5m", f"fleet:radixgate_{stage}_seconds:p95_5m"} <= names
    assert {"fleet:radixgate_cache_hit_ratio:captured_5m", "fleet:radixgate_cache_hit_ratio:available_5m",
            "worker:radixgate_worker_occupancy_ratio:avg"} <= names
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert {"RadixgateTTFTP95OverSLO", "RadixgateWorkerEjected", "RadixgateHitRateCollapsed",
            "RadixgateVerdictAtCeiling"} <= alerts
    for rule in rules():
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert rule["annotations"]["summary"]


def test_the_ttft_alert_threshold_is_the_diagnosis_slo_default() -> None:
    (alert,) = [r for r in rules() if r.get("alert") == "RadixgateTTFTP95OverSLO"]
    threshold = float(re.fullmatch(r"fleet:radixgate_ttft_seconds:p95_5m > ([0-9.]+)", alert["expr"].strip())[1])
    assert threshold == DiagnoseConfig().slo_ttft_p95_s


def test_verdict_kinds_in_rules_are_ones_the_diagnosis_produces() -> None:
    for rule in rules():
        for kind in re.findall(r'radixgate_diagnosis_verdict\{kind="([^"]+)"\}', rule["expr"]):
            assert kind in VERDICT_KINDS


def _load_script(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_prometheus_operator_rule_carries_exactly_the_rule_files() -> None:
    sync = _load_script(PROMETHEUS / "sync_prometheusrule.py")
    assert (PROMETHEUS / "prometheusrule.yaml").read_text() == sync.render(), "run sync_prometheusrule.py"
    doc = yaml.safe_load((PROMETHEUS / "prometheusrule.yaml").read_text())
    groups = [g for path in RULE_FILES for g in yaml.safe_load(path.read_text())["groups"]]
    assert sorted(doc["spec"]["groups"], key=lambda g: g["name"]) == sorted(groups, key=lambda g: g["name"])


@pytest.mark.parametrize(("monitor", "target"), [
    ("radixgate-gateway", "gateway"), ("radixgate-sidecar", "sidecar"), ("sglang", "gateway"),
])
def test_each_service_monitor_selects_a_real_service_port(monitor: str, target: str) -> None:
    monitors = {m["metadata"]["name"]: m for m in yaml.safe_load_all((PROMETHEUS / "servicemonitor.yaml").read_text())}
    spec = monitors[monitor]["spec"]
    services = [o for o in rendered(target) if o["kind"] == "Service"
                and spec["selector"]["matchLabels"].items() <= o["metadata"]["labels"].items()]
    assert len(services) == 1, f"{monitor} selects {len(services)} Services"
    ports = {p["name"] for p in services[0]["spec"]["ports"]}
    for endpoint in spec["endpoints"]:
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"


def test_the_compose_scrape_config_loads_the_rule_directory() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yaml"]
    assert {j["job_name"] for j in config["scrape_configs"]} == {"radixgate", "sglang"}
