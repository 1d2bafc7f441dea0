from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from proxy.clock import ManualClock
from proxy.telemetry.metrics import attach_diagnosis
from tests.unit.test_diagnose_report import round_robin_fleet


def scrape(registry: CollectorRegistry) -> dict[str, float]:
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_diagnosis_gauges_show_the_numbers_and_the_verdict_as_an_enum() -> None:
    registry = CollectorRegistry()
    attach_diagnosis(registry, round_robin_fleet(ManualClock()).current)
    m = scrape(registry)
    assert m['radixgate_diagnosis_cache_hit_ratio{kind="captured"}'] == 0.0
    assert m['radixgate_diagnosis_cache_hit_ratio{kind="available"}'] > 0.9
    assert m['radixgate_diagnosis_verdict{kind="tune"}'] == 1.0
    assert m['radixgate_diagnosis_verdict{kind="healthy"}'] == 0.0
    assert m['radixgate_diagnosis_finding{cause="routing",rule="cache_routing"}'] == 1.0
    assert m["radixgate_diagnosis_window_requests"] == 120
    assert m['radixgate_diagnosis_ttft_seconds{q="0.95"}'] > 0
    assert sum(v for k, v in m.items() if k.startswith("radixgate_diagnosis_stage_cost_share_ratio")) > 0.99


def test_an_unknown_gpu_idle_share_is_omitted_not_zero() -> None:
    registry = CollectorRegistry()
    attach_diagnosis(registry, round_robin_fleet(ManualClock()).current)
    assert not any(k.startswith("radixgate_diagnosis_gpu_idle_ratio") for k in scrape(registry))
