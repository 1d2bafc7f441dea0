"""Figures of one routing-benchmark run, and the Markdown table they are printed in."""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.loadgen.workloads import RequestSpec
from proxy.request import Dialect, GenerateRequest
from proxy.routing.prefix_index import FleetCache
from proxy.routing.prefix_key import build_route_request

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def available_ratio(specs: Sequence[RequestSpec], capacity_tokens: int) -> float:
    """Prefix hit rate of one LRU cache of ``capacity_tokens`` fed the trace in order."""
    cache = FleetCache(capacity_tokens)
    hit = total = 0
    for spec in specs:
        req = GenerateRequest(dialect=Dialect.CHAT if spec.messages else Dialect.SGLANG, payload={}, model=MODEL,
                              text=spec.text, messages=spec.messages)
        route = build_route_request(req, block_tokens=16, chars_per_token=4.0, max_blocks=2048)
        hit += cache.observe(route.block_hashes, route.block_tokens, route.prompt_tokens)
        total += route.prompt_tokens
    return hit / total if total else 0.0


def summarize(router: str, *, sent: int, ttft: Sequence[float], e2e: Sequence[float], gaps: Sequence[float],
              span: float, cached: int, prompt: int, per_worker: Sequence[float],
              touched: Mapping[str, set[str]], slo: float, predicted_exact: float | None = None) -> dict[str, Any]:
    mean_load = statistics.fmean(per_worker) if per_worker else 0.0
    return {
        "router": router, "ok": len(ttft), "sent": sent,
        "ttft_p50": pct(ttft, 0.5), "ttft_p95": pct(ttft, 0.95), "ttft_p99": pct(ttft, 0.99),
        "itl_p95": pct(gaps, 0.95), "e2e_p95": pct(e2e, 0.95),
        "throughput": len(ttft) / span if span else float("nan"),
        "goodput": sum(1 for t in ttft if t <= slo) / span if span else float("nan"),
        "captured": cached / max(1, prompt),
        "imbalance": max(per_worker) / mean_load if mean_load else float("nan"),
        "groups_on_one_worker": (sum(1 for w in touched.values() if len(w) == 1) / len(touched)) if touched else None,
        "load": os.getloadavg()[0],
        # Share of requests whose predicted cached tokens (the policy's, on its chosen worker)
        # were within one page of what the worker reported; None = not measured.
        "predicted_exact": predicted_exact,
    }


def print_table(title: str, rows: Sequence[Mapping[str, Any]], available: float, *, box_load: bool) -> None:
    print(f"\n{title}\navailable hit rate {available:.1%}; times in simulated seconds\n")
    exact = any(r.get("predicted_exact") is not None for r in rows)
    head = ("| router | ok | TTFT p50 | TTFT p95 | TTFT p99 | ITL p95 | e2e p95 | req/s | goodput req/s | captured "
            "| imbalance | groups on 1 worker |" + (" prediction exact |" if exact else "")
            + (" box load |" if box_load else ""))
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for r in rows:
        g = "-" if r["groups_on_one_worker"] is None else f"{r['groups_on_one_worker']:.0%}"
        line = (f"| {r['router']} | {r['ok']}/{r['sent']} | {r['ttft_p50']:.3f} | {r['ttft_p95']:.3f} "
                f"| {r['ttft_p99']:.3f} | {r['itl_p95'] * 1e3:.1f} ms | {r['e2e_p95']:.2f} | {r['throughput']:.1f} "
                f"| {r['goodput']:.1f} | {r['captured']:.1%} | {r['imbalance']:.2f} | {g} |")
        if exact:
            line += " - |" if r.get("predicted_exact") is None else f" {r['predicted_exact']:.1%} |"
        print(line + (f" {r['load']:.1f} |" if box_load else ""))
    sys.stdout.flush()
