"""Render a ``Diagnosis``: a JSON document (GET /diagnosis) and a text block (demo, `radixgate report`),
and the slowest requests (GET /diagnosis/tail) as lines.

The text block is rendered *from the JSON document*, so a live proxy and a remote one (fetched over
the admin port by `radixgate report --url URL`) print the same thing. Each signal in the JSON has
its value, how many observations it rests on (``n``) and the window it covers (``window_s``).

    radixgate report --url http://127.0.0.1:8001     # text block of a running proxy (alias --admin)
    radixgate report --file diagnosis.json [--json]   # a saved /diagnosis document
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from proxy.diagnose.cost import CostReport
from proxy.diagnose.rules import Evidence, Finding, Lever, Verdict
from proxy.diagnose.service import Diagnosis
from proxy.diagnose.signals import Distribution, Signals


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


def _dist(d: Distribution) -> dict[str, Any]:
    return {"p50": _round(d.p50), "p95": _round(d.p95), "spread": _round(d.spread, 3), "n": d.n}


def _signal(value: float | None, n: int, window_s: float, unit: str = "", *, estimated: bool = False) -> dict[str, Any]:
    out = {"value": _round(value), "n": n, "window_s": round(window_s, 3), "unit": unit}
    return {**out, "estimated": True} if estimated else out


def _signals(s: Signals) -> dict[str, Any]:
    w = s.window.span_s
    c, o, lat, hot = s.cache, s.occupancy, s.latency, s.hot_prefix
    return {
        "cache_hit_rate_captured": _signal(c.captured, c.reporting_requests, w, "ratio"),
        "cache_hit_rate_available": _signal(c.available, c.reporting_requests, w, "ratio"),
        "cache_reuse_ceiling": _signal(c.reuse_ceiling, c.reporting_requests, w, "ratio"),
        "occupancy": _signal(o.occupancy_mean, o.samples, w, "ratio"),
        "kv_token_usage": _signal(o.token_usage_mean, o.samples, w, "ratio"),
        "worker_queued_mean": _signal(o.queued_mean, o.samples, w, "requests"),
        "queueing_share": _signal(o.queueing_share, o.samples, w, "ratio"),
        "ttft_p50": _signal(lat.ttft.p50, lat.ttft.n, w, "seconds"),
        "ttft_p95": _signal(lat.ttft.p95, lat.ttft.n, w, "seconds"),
        "ttft_spread": _signal(lat.ttft.spread, lat.ttft.n, w, "ratio"),
        "worker_queue_p50": _signal(lat.worker_queue.p50, lat.worker_queue.n, w, "seconds"),
        "worker_queue_p95": _signal(lat.worker_queue.p95, lat.worker_queue.n, w, "seconds"),
        "itl_p50": _signal(lat.itl.p50, lat.itl.n, w, "seconds"),
        "itl_p95": _signal(lat.itl.p95, lat.itl.n, w, "seconds"),
        "itl_jitter": _signal(lat.itl_jitter, lat.itl.n, w, "ratio"),
        "itl_p10": _signal(lat.itl_floor, lat.itl.n, w, "seconds"),
        "itl_max_p50": _signal(lat.itl_max.p50, lat.itl_max.n, w, "seconds"),
        "uncached_tokens_p95": _signal(lat.uncached_tokens_p95, lat.ttft.n, w, "tokens"),
        "ttft_big_p10": _signal(lat.ttft_big_p10, lat.ttft.n // 10, w, "seconds"),
        # Median TTFT of the first and last third of the window's requests (rules_latency.rule_overload).
        "ttft_early_p50": _signal(lat.ttft_early_p50, lat.ttft.n // 3, w, "seconds"),
        "ttft_mid_p50": _signal(lat.ttft_mid_p50, lat.ttft.n - 2 * (lat.ttft.n // 3), w, "seconds"),
        "ttft_late_p50": _signal(lat.ttft_late_p50, lat.ttft.n // 3, w, "seconds"),
        # Estimated: the shadow replay's TTFT model at no load for the window's prompts (shadow.Replay).
        "ttft_unloaded_p95": _signal(s.unloaded_ttft_p95, sum(r.requests for r in s.shadow[:1]), w, "seconds",
                                     estimated=True),
        "gpu_idle_share": _signal(s.gpu.idle_share, sum(g.samples for g in s.gpu.gpus), s.gpu.window_s, "ratio"),
        "proxy_overhead_share": _signal(lat.proxy_overhead_share, lat.proxy_overhead.n, w, "ratio"),
        # The most requested shared prefix (signals.hot_prefix): its share, how many workers served
        # it and its own TTFT p95; n = its requests.
        "hot_prefix_share": _signal(hot.share if hot else None, hot.requests if hot else 0, w, "ratio"),
        "hot_prefix_workers": _signal(float(hot.workers) if hot else None, hot.requests if hot else 0, w, "workers"),
        "hot_prefix_ttft_p95": _signal(hot.ttft_p95 if hot else None, hot.requests if hot else 0, w, "seconds"),
    }


def _evidence(e: Evidence) -> dict[str, Any]:
    return {"signal": e.signal, "value": _round(e.value), "op": e.op, "threshold": _round(e.threshold),
            "holds": e.holds, "note": e.note}


def _lever(lv: Lever) -> dict[str, str]:
    return {"setting": lv.setting, "where": lv.where, "change": lv.change}


def _finding(f: Finding) -> dict[str, Any]:
    return {"rule": f.rule, "kind": f.kind, "cause": f.cause, "summary": f.summary,
            "confidence": round(f.confidence, 3), "confidence_label": f.confidence_label,
            "evidence": [_evidence(e) for e in f.evidence], "levers": [_lever(lv) for lv in f.levers]}


def _verdict(v: Verdict) -> dict[str, Any]:
    return {"kind": v.kind, "summary": v.summary, "confidence": v.confidence,
            "confidence_label": v.confidence_label, "slo_ttft_p95_s": v.slo_ttft_p95_s,
            "ttft_p95_s": _round(v.ttft_p95_s), "slo_met": v.slo_met,
            "levers": [_lever(lv) for lv in v.levers], "findings": [_finding(f) for f in v.findings]}


def _cost(c: CostReport) -> dict[str, Any]:
    return {
        "price_per_gpu_hour": c.price_per_gpu_hour, "gpus_per_worker": c.gpus_per_worker,
        "requests": c.requests, "total_gpu_seconds": _round(c.total_gpu_seconds),
        "total_cost": _round(c.total_cost, 8), "cost_per_request": _round(c.cost_per_request, 8),
        "driver": c.driver, "busy_gaps_known": c.busy_gaps_known,
        "stages": {
            s.stage: {"gpu_seconds": _round(s.gpu_seconds), "share": _round(s.share, 4),
                      "gpu_seconds_per_request": {**_dist(s.per_request), "mean": _round(s.mean_per_request)},
                      "cost_per_request": _round(s.cost_per_request, 8)}
            for s in c.stages
        },
    }


def to_json(d: Diagnosis) -> dict[str, Any]:
    s = d.signals
    return {
        "generated_at": d.generated_at,
        "window": {**dataclasses.asdict(s.window), "max_requests": d.max_requests, "max_age_s": d.max_age_s},
        "four_numbers": {
            "cache": {"captured": _round(s.cache.captured), "available": _round(s.cache.available),
                      "reuse_ceiling": _round(s.cache.reuse_ceiling), "capacity_tokens": s.cache.capacity_tokens,
                      "n": s.cache.reporting_requests,
                      # True: no worker reported cached tokens; these are the proxy's estimate
                      "estimated": s.cache.estimated,
                      # other policies replayed on the window's traffic (diagnose/shadow.py)
                      # ttft_p95: predicted (diagnose/shadow_ttft.py); as_placed_ttft_p95: the same model
                      # on the window's own placements
                      "shadow": [{"policy": r.policy, "captured": _round(r.captured), "imbalance": _round(r.imbalance),
                                  "ttft_p95": _round(r.ttft_p95), "as_placed_ttft_p95": _round(r.as_placed_ttft_p95),
                                  "requests": r.requests} for r in s.shadow]},
            "occupancy": {"running_over_max": _round(s.occupancy.occupancy_mean),
                          "kv_token_usage": _round(s.occupancy.token_usage_mean),
                          "queued_mean": _round(s.occupancy.queued_mean), "samples": s.occupancy.samples},
            "prefill_decode": {"ttft": _dist(s.latency.ttft), "worker_queue": _dist(s.latency.worker_queue),
                               "itl": _dist(s.latency.itl)},
            "gpu_idle": {"share": _round(s.gpu.idle_share), "available": s.gpu.available,
                         "reason": s.gpu.reason,
                         "gpus": [dataclasses.asdict(g) for g in s.gpu.gpus]},
        },
        "signals": _signals(s),
        "stages": {name: _dist(dist) for name, dist in s.latency.stages},
        "workers": [dataclasses.asdict(w) for w in s.occupancy.workers],
        # workers whose KV event stream routing does not read (unconfirmed / failed)
        "kv_events_doubted": list(s.kv_doubted),
        # requests the peer replicas routed over the window: this one's figures cover the rest
        "peer_requests": s.peer_requests,
        "policies": list(s.policies),
        "verdict": _verdict(d.verdict),
        "cost": _cost(d.cost),
        "params": dataclasses.asdict(d.params),
    }


# -- text --------------------------------------------------------------------------------------


def _pct(x: Any) -> str:
    return "unknown" if x is None else f"{100 * float(x):.0f}%"


def _secs(x: Any) -> str:
    if x is None:
        return "-"
    x = float(x)
    return f"{x * 1000:.1f} ms" if x < 1.0 else f"{x:.2f} s"


def _num(x: Any, fmt: str = ".2f") -> str:
    return "unknown" if x is None else format(float(x), fmt)


def render_text(doc: Mapping[str, Any]) -> str:
    """The human summary of a /diagnosis JSON document."""
    w, four, v, cost = doc["window"], doc["four_numbers"], doc["verdict"], doc["cost"]
    cache, occ, pd, gpu = four["cache"], four["occupancy"], four["prefill_decode"], four["gpu_idle"]
    lines = [
        f"radixgate diagnosis - window: {w['requests']} requests ({w['ok']} ok, {w['errors']} failed"
        + (f"; {w['cut_short']} of them in the TTFT, at their wait where no token came: a lower bound"
           if w.get("cut_short") else "")
        + f") over {float(w['span_s']):.1f} s, {w['snapshot_samples']} worker snapshots",
        "",
        "The four numbers",
        f"  prefix cache    captured {_pct(cache['captured'])}  available {_pct(cache['available'])}  "
        + ("(estimated by the proxy: workers report no cached tokens) " if cache.get("estimated") else "")
        + f"(workload reuse ceiling {_pct(cache['reuse_ceiling'])}, fleet KV "
        f"{cache['capacity_tokens'] if cache['capacity_tokens'] is not None else 'unknown'} tokens)",
        *([("  shadow replay   " + "  ".join(
            f"{r['policy']} {_pct(r['captured'])}"
            + (f" p95 {float(r['ttft_p95']):.3f}s" if r.get("ttft_p95") is not None else "") for r in cache["shadow"])
            + f"  (predicted for the same {cache['shadow'][0]['requests']} requests"
            + (f"; the model on their own placements: p95 {float(cache['shadow'][0]['as_placed_ttft_p95']):.3f}s"
               if cache["shadow"][0].get("as_placed_ttft_p95") is not None else "") + ")")]
          if cache.get("shadow") else []),
        f"  occupancy       running/max {_num(occ['running_over_max'])}  KV usage {_num(occ['kv_token_usage'])}  "
        f"queued per worker {_num(occ['queued_mean'], '.1f')}",
        f"  prefill/decode  TTFT p50 {_secs(pd['ttft']['p50'])}  p95 {_secs(pd['ttft']['p95'])}  "
        f"worker queue p95 {_secs(pd['worker_queue']['p95'])}  ITL p50 {_secs(pd['itl']['p50'])}  "
        f"p95 {_secs(pd['itl']['p95'])}",
        "  GPU idle        " + (_pct(gpu["share"]) if gpu["available"] and gpu["share"] is not None
                                else f"unknown ({gpu['reason'] or 'no samples yet'})"),
        f"  proxy overhead  {_pct(doc['signals']['proxy_overhead_share']['value'])} of TTFT",
        "",
        "Stage breakdown (p50 / p95)",
    ]
    for name, dist in doc["stages"].items():
        lines.append(f"  {name:<15} {_secs(dist['p50']):>10} / {_secs(dist['p95']):<10} (n={dist['n']})")
    lines += ["", f"Verdict: {v['kind'].upper()} (confidence {v['confidence_label']}, {v['confidence']:.2f}) - "
              f"{v['summary']}"]
    for f in v["findings"]:
        lines.append(f"  [{f['rule']}] {f['cause']} ({f['confidence_label']})")
        for e in f["evidence"]:
            mark = "yes" if e["holds"] else "no "
            note = f"  ({e['note']})" if e["note"] else ""
            lines.append(f"      {mark} {e['signal']} = {_num(e['value'], '.3g')} {e['op']} "
                         f"{_num(e['threshold'], '.3g')}{note}")
    if v["levers"]:
        lines.append("  change:")
        lines += [f"    - {lv['setting']} [{lv['where']}]: {lv['change']}" for lv in v["levers"]]
    lines += ["", f"Cost per request by stage (${cost['price_per_gpu_hour']:g}/GPU-hour, "
              f"{cost['gpus_per_worker']} GPU/worker, {cost['requests']} requests)"]
    if cost["driver"] is None:
        lines.append("  no dispatched requests in the window")
    else:
        lines.append(f"  {'stage':<8} {'GPU-s p50':>10} {'GPU-s p95':>10} {'share':>7} {'$/request':>11}")
        for name, st in cost["stages"].items():
            per = st["gpu_seconds_per_request"]
            lines.append(f"  {name:<8} {_num(per['p50'], '.4f'):>10} {_num(per['p95'], '.4f'):>10} "
                         f"{_pct(st['share']):>7} {_num(st['cost_per_request'], '.6f'):>11}")
        lines.append(f"  total ${_num(cost['cost_per_request'], '.6f')}/request; the bill is driven by "
                     f"{cost['driver']} ({_pct(cost['stages'][cost['driver']]['share'])})"
                     + ("" if cost["busy_gaps_known"] else "; idle gaps inside busy periods unknown (no NVML)"))
    return "\n".join(lines)


def render_tail(doc: Mapping[str, Any]) -> str:
    """The human summary of a GET /diagnosis/tail document: one line per request, slowest first."""
    by = str(doc["by"])
    rows = doc["requests"]
    lines = [f"The slowest {len(rows)} of {doc['timed']} requests by {by.upper()} (GET /diagnosis/tail)",
             f"  {'rid':<24} {by:>9}  {'dominant':<12} {'admission':>9} {'routing':>8} {'w.queue':>8} "
             f"{'prefill':>8} {'decode':>8}  cached/prompt"]
    for r in rows:
        parts = r["parts_s"]

        def ms(name: str, parts: Mapping[str, float] = parts) -> str:
            return f"{parts[name] * 1000:.1f}" if name in parts else "-"
        tokens = (f"{r['cached_tokens']}/{r['prompt_tokens']}" if r.get("prompt_tokens") is not None else "-")
        lines.append(f"  {str(r['rid'])[:24]:<24} {r[by + '_s'] * 1000:>7.1f}ms  {r['dominant']!s:<12} "
                     f"{ms('admission'):>9} {ms('routing'):>8} {ms('worker_queue'):>8} {ms('prefill'):>8} "
                     f"{ms('decode'):>8}  {tokens}")
    if doc["dominant"]:
        lines.append("  dominated by: " + ", ".join(f"{k} {v}" for k, v in doc["dominant"].items())
                     + "  (parts in ms)")
    return "\n".join(lines)


# -- `radixgate report` ------------------------------------------------------------------------


def fetch(admin_url: str, timeout_s: float, path: str = "/diagnosis") -> dict[str, Any]:
    """GET /diagnosis (or another admin path) from a running proxy's admin port."""
    with urllib.request.urlopen(admin_url.rstrip("/") + path, timeout=timeout_s) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
        return doc


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="radixgate report",
                                 description="Print the diagnosis of a running radixgate or of a saved document.")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--url", "--admin", dest="url", help="admin base URL, e.g. http://127.0.0.1:8001")
    source.add_argument("--file", help="a saved GET /diagnosis JSON document")
    ap.add_argument("--json", action="store_true", help="print the JSON document, not the text block")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the proxy")
    ap.add_argument("--tail", type=int, default=0, metavar="N",
                    help="with --url: also the N slowest recent requests, each cut into its stages")
    args = ap.parse_args(argv)
    try:
        doc = fetch(args.url, args.timeout) if args.url else json.loads(Path(args.file).read_text())
        out = json.dumps(doc, indent=2) if args.json else render_text(doc)
        if args.tail > 0 and args.url:
            tail = fetch(args.url, args.timeout, f"/diagnosis/tail?n={args.tail}")
            out += "\n\n" + (json.dumps(tail, indent=2) if args.json else render_tail(tail))
    except (OSError, ValueError) as e:  # URLError / HTTPError are OSErrors; bad JSON is a ValueError
        print(f"radixgate report: {e}", file=sys.stderr)
        return 1
    except (KeyError, TypeError) as e:
        print(f"radixgate report: not a /diagnosis document (missing {e})", file=sys.stderr)
        return 1
    print(out)
    return 0
