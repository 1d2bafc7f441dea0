"""Write radixgate.json, the Grafana dashboard, from the panel list below (JSON by hand drifts).

    python deploy/grafana/build_dashboard.py          # rewrite radixgate.json
    python deploy/grafana/build_dashboard.py --check  # exit 1 if radixgate.json is out of date

Queries read the recording rules of deploy/prometheus/rules/ where one exists (cheap, and the
same numbers the alerts use) and raw radixgate_* metrics otherwise. A test checks that every
metric and recorded series named here is defined.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
STAGES = [
    ("admission wait", "radixgate_admission_wait_seconds"),
    ("proxy overhead", "radixgate_proxy_overhead_seconds"),
    ("upstream first byte", "radixgate_upstream_ttfb_seconds"),
    ("worker queue", "radixgate_worker_queue_seconds"),
    ("upstream TTFT", "radixgate_upstream_ttft_seconds"),
    ("TTFT (client)", "radixgate_ttft_seconds"),
    ("inter-token", "radixgate_inter_token_latency_seconds"),
    ("decode", "radixgate_decode_seconds"),
    ("end to end", "radixgate_e2e_seconds"),
]


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(kind: str, title: str, targets: list[tuple[str, str]], *, unit: str = "short",
          w: int = 12, h: int = 8, description: str = "", **options: Any) -> dict[str, Any]:
    refs = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    p: dict[str, Any] = {
        "type": kind, "title": title, "description": description, "datasource": DS,
        "targets": [target(e, legend, refs[i]) for i, (e, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "gridPos": {"w": w, "h": h},
    }
    p.update(options)
    return p


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def panels() -> list[dict[str, Any]]:
    return [
        row("Overview"),
        panel("stat", "Requests / s", [("fleet:radixgate_requests_accepted:rate5m", "accepted")], unit="reqps", w=6, h=4),
        panel("stat", "Failed share", [("fleet:radixgate_requests_failed:ratio_5m", "failed")], unit="percentunit",
              w=6, h=4),
        panel("stat", "TTFT p95", [("fleet:radixgate_ttft_seconds:p95_5m", "p95")], unit="s", w=6, h=4,
              description="Alert RadixgateTTFTP95OverSLO fires above 2 s for 10 minutes."),
        panel("stat", "Verdict", [("fleet:radixgate_diagnosis_verdict:max == 1", "{{kind}}")], w=6, h=4,
              description="tune: a config lever would help; at_ceiling: the fleet is at its limit.",
              options={"textMode": "name", "colorMode": "none",
                       "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        row("Latency by stage"),
        panel("timeseries", "Stage latency p50", [(f"fleet:{m}:p50_5m", name) for name, m in STAGES], unit="s"),
        panel("timeseries", "Stage latency p95", [(f"fleet:{m}:p95_5m", name) for name, m in STAGES], unit="s"),
        panel("timeseries", "TTFT p95 by worker", [("worker:radixgate_ttft_seconds:p95_5m", "{{worker}}")], unit="s"),
        panel("timeseries", "Worker share of TTFT p95 by worker (dispatch → first token)",
              [("worker:radixgate_upstream_ttft_seconds:p95_5m", "{{worker}}")], unit="s"),
        row("Prefix cache"),
        panel("timeseries", "Hit rate: captured vs available", [
            ("fleet:radixgate_cache_hit_ratio:captured_5m", "captured (workers reported)"),
            ("fleet:radixgate_cache_hit_ratio:available_5m", "available (one fleet-wide cache, same KV)"),
            ("fleet:radixgate_cache_hit_ratio:reuse_ceiling", "reuse ceiling (unbounded cache)"),
        ], unit="percentunit",
              description="Captured far under available: routing scatters prefixes (see the verdict)."),
        panel("timeseries", "Captured hit rate by worker", [
            ("worker:radixgate_cache_hit_ratio:captured_5m", "{{worker}}"),
        ], unit="percentunit"),
        panel("timeseries", "Routing's cache prediction: predicted / reported cached tokens", [
            ("policy:radixgate_routing_cache_prediction:ratio_5m", "{{policy}}"),
        ], description="1 = the policy's prefix index matches what the workers really hold."),
        panel("timeseries", "Prefix match length at the chosen worker (tokens)", [
            ("histogram_quantile(0.5, sum by (le, policy) (rate(radixgate_routing_match_tokens_bucket[5m])))",
             "p50 {{policy}}"),
            ("histogram_quantile(0.95, sum by (le, policy) (rate(radixgate_routing_match_tokens_bucket[5m])))",
             "p95 {{policy}}"),
        ]),
        row("Load"),
        panel("timeseries", "Occupancy by worker (running / max_running_requests)", [
            ("worker:radixgate_worker_occupancy_ratio:avg", "{{worker}}"),
            ("fleet:radixgate_worker_occupancy_ratio:avg", "fleet"),
        ], unit="percentunit"),
        panel("timeseries", "KV token usage by worker", [
            ("worker:radixgate_worker_token_usage_ratio:avg", "{{worker}}"),
        ], unit="percentunit"),
        panel("timeseries", "Queues", [
            ("fleet:radixgate_admission_queue_depth:sum", "radixgate admission queue"),
            ("worker:radixgate_worker_queued_requests:avg", "engine queue {{worker}}"),
        ]),
        panel("timeseries", "In flight by worker", [
            ("sum by (worker) (radixgate_worker_in_flight_requests)", "{{worker}}"),
        ]),
        panel("timeseries", "GPU idle share (NVML)", [
            ("avg(radixgate_diagnosis_gpu_idle_ratio)", "idle"),
        ], unit="percentunit", description="Idle gaps on the sampled GPUs; absent without NVML."),
        panel("timeseries", "Workers", [
            ('max(radixgate_workers{state="healthy"})', "healthy"),
            ('max(radixgate_workers{state="unhealthy"})', "unhealthy"),
            ("sum by (worker) (max by (worker) (radixgate_worker_ejected))", "ejected {{worker}}"),
        ]),
        row("Routing and errors"),
        panel("timeseries", "Routing branches", [
            ("sum by (policy, branch) (rate(radixgate_policy_decisions_total[5m]))", "{{policy}} {{branch}}"),
        ], unit="reqps"),
        panel("timeseries", "Errors by cause", [("fleet:radixgate_errors:rate5m", "{{cause}}")], unit="reqps"),
        panel("timeseries", "Retries and upstream failures", [
            ("sum by (cause) (rate(radixgate_retries_total[5m]))", "retry {{cause}}"),
            ("sum by (cause) (rate(radixgate_upstream_failures_total[5m]))", "failure {{cause}}"),
        ], unit="reqps"),
        panel("timeseries", "Ejections and restarts", [
            ("sum by (worker) (increase(radixgate_worker_ejections_total[5m]))", "ejected {{worker}}"),
            ("sum by (worker) (increase(radixgate_worker_restarts_total[5m]))", "restart {{worker}}"),
        ]),
        panel("timeseries", "Prefix holds", [
            ("sum by (outcome) (rate(radixgate_prefix_hold_seconds_count[5m]))", "{{outcome}}"),
        ], unit="reqps", description="Requests held at the proxy while the prefix they reuse was still being "
                                     "prefilled on their worker (ttft's hold branch); timed_out = that prefill "
                                     "took longer than routing.hold_max_s."),
        panel("timeseries", "Prefix hold p95", [
            ("histogram_quantile(0.95, sum by (le) (rate(radixgate_prefix_hold_seconds_bucket[5m])))", "p95"),
        ], unit="s", description="How long held requests waited (their prefix_hold stage)."),
        row("Diagnosis"),
        panel("state-timeline", "Verdict over time", [
            ("fleet:radixgate_diagnosis_verdict:max == 1", "{{kind}}"),
        ], w=12),
        panel("table", "Findings", [
            ("max by (rule, cause) (radixgate_diagnosis_finding)", ""),
        ], w=12, description="One row per rule that fired; `radixgate report` prints the evidence."),
        panel("timeseries", "GPU cost share by stage", [
            ("avg by (stage) (radixgate_diagnosis_stage_cost_share_ratio)", "{{stage}}"),
        ], unit="percentunit"),
        panel("timeseries", "Verdict confidence", [
            ("avg(radixgate_diagnosis_verdict_confidence_ratio)", "confidence"),
        ], unit="percentunit"),
    ]


def layout(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Place panels left to right, wrapping at Grafana's 24 columns; rows start a new line."""
    x = y = line_h = 0
    for i, p in enumerate(items):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if p["type"] == "row" or x + w > 24:
            x, y, line_h = 0, y + line_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i + 1
        x += w
        line_h = max(line_h, h)
        if p["type"] == "row":
            x, y, line_h = 0, y + h, 0
    return items


def dashboard() -> dict[str, Any]:
    return {
        "uid": "radixgate",
        "title": "radixgate",
        "description": "Stage latency, prefix-cache capture, occupancy, routing and the tune-or-swap verdict.",
        "tags": ["radixgate", "sglang", "llm"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{
            "name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0,
        }]},
        "annotations": {"list": []},
        "panels": layout(panels()),
    }


def main(argv: list[str]) -> int:
    path = HERE / "radixgate.json"
    text = json.dumps(dashboard(), indent=2) + "\n"
    if "--check" in argv:
        if path.read_text() != text:
            print(f"{path} is out of date; run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
