"""The fleet benchmark's reports, read from committed results (``loadtests/gpu/fleet.py`` writes
them): the per-cell tables, the standing of a router against the SGLang gateways, the phases past
capacity, the per-engine view and the routers' own verdicts. Pure functions of the files."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from loadtests.jsonl import read_jsonl, read_text


def argv_value(argv: list[str], flag: str, default: str) -> str:
    """``flag``'s value as argparse read it: the last one given (run_fleet.sh's one-engine cells
    pass ``--phase-s`` twice, the common one first)."""
    at = [i for i, a in enumerate(argv[:-1]) if a == flag]
    return argv[at[-1] + 1] if at else default


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def gpu_model(name: str) -> str | None:
    """The GPU's model in a name as nvidia-smi or a profile writes it ("NVIDIA H100 80GB HBM3",
    "NVIDIA H200 SXM 141GB" -> "H100", "H200"); None where none is named."""
    m = re.search(r"\b([A-Z]\d{2,3})\b", name)
    return m.group(1) if m else None


def run_gpu(results: Path) -> str | None:
    """The GPU model a run's engines ran on, from its ``gpu.txt`` (run_fleet.sh writes nvidia-smi's
    line there); None for a run without one (the first few, all on an H200)."""
    path = results / "gpu.txt"
    if not path.exists():
        return None
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("NVIDIA"):
            return gpu_model(line)
    return None


def on_profile_gpu(runs: list[Path], profile_gpu: str, default: str = "H200") -> list[Path]:
    """The runs whose engines ran on the profile's GPU model (a run that names none counts as
    ``default``); each other one is named on stderr and left out, so a glob over every committed
    run replays no H100 run with an H200 profile, nor the reverse."""
    want = gpu_model(profile_gpu)
    kept = []
    for run in runs:
        if not any((run / name).exists() for name in ("requests.jsonl", "requests.jsonl.gz")):
            # A run planned and predicted but not made yet: its directory holds PREDICTED.md alone.
            print(f"{run}: left out, no requests recorded (not run yet)", file=sys.stderr)
            continue
        got = run_gpu(run) or default
        if want is None or got == want:
            kept.append(run)
        else:
            print(f"{run}: left out, its engines ran on an {got}, the profile models an {want} (--profile)",
                  file=sys.stderr)
    return kept


def table(summary: dict[str, dict[str, dict[str, Any]]], rates: list[float], routers: list[str]) -> str:
    def ms(v: float) -> str:
        return "fail" if v == math.inf else ("-" if math.isnan(v) else f"{v * 1e3:,.0f}")

    head = "| router | " + " | ".join(f"{r:g}/s p50 / p95 / ITL ms, reuse" for r in rates) + " |"
    lines = [head, "|---" * (len(rates) + 1) + "|"]
    for name in routers:
        cells = []
        for rate in rates:
            s = summary[name].get(f"{rate:g}")
            if s is None:
                cells.append("not run")
                continue
            reuse = "-" if s["reuse"] is None else f"{s['reuse']:.0%}"
            fail = f" ({s['failed']} failed)" if s["failed"] else ""
            spread = ""
            if s.get("p95_repeats"):
                each = s["p95_repeats"]
                spread = f" (p95 of {len(each)} rounds {ms(min(each))}-{ms(max(each))})"
            if s.get("unclean_start"):  # begun on a backlog the flush could not clear: not comparable
                spread += f" (started on busy engines {s['unclean_start']}x)"
            cells.append(f"{ms(s['ttft_p50'])} / **{ms(s['ttft_p95'])}** / {ms(s['itl_p50'])}, {reuse}{fail}{spread}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(paths: list[Path]) -> str:
    """Every cell of these ``summary.jsonl`` files: its table, then each router's TTFT p95 over
    the oracle's and over smg's (the reference peer) at each rate of that cell."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            cell = json.loads(line)
            rates, names, summary = cell["rates"], cell["routers"], cell["summary"]
            cut = "" if cell.get("complete", True) else " (cut short by its time limit)"
            out.append(f"\n{path.parent.name}: {cell['engine']}, {cell['workers']} workers, prompts={cell['prompts']}, "
                       f"reports={cell['reports']}, workload={cell['shape']['workload']}, seed {cell['seed']}{cut}")
            out.append(table(summary, rates, names))
            for ref in ("oracle", "smg", "sglang-router"):
                if ref not in names or len(names) < 2:
                    continue
                ratios = []
                for name in names:
                    if name == ref:
                        continue
                    cells = []
                    for rate in rates:
                        nan = {"ttft_p95": math.nan}
                        a = summary[name].get(f"{rate:g}", nan)["ttft_p95"]
                        b = summary[ref].get(f"{rate:g}", nan)["ttft_p95"]
                        cells.append(f"{a / b:.2f}x @{rate:g}" if math.isfinite(a) and math.isfinite(b) and b else f"- @{rate:g}")
                    ratios.append(f"{name} {', '.join(cells)}")
                out.append(f"p95 / {ref}: " + "; ".join(ratios))
    return "\n".join(out)


STANDING_LIST = Path(__file__).resolve().parents[1] / "results" / "STANDING.txt"


def standing_list(path: Path = STANDING_LIST) -> list[Path]:
    """The ``summary.jsonl`` of every run the standing counts: one results directory a line of
    ``path`` (``#`` comments), next to it."""
    names = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [path.parent / name / "summary.jsonl" for name in names if name]


def prompt_form(cell: dict[str, Any]) -> str:
    """A cell's prompt form as the reports name it: text, ids or chat, and "ids unique" where
    nothing is shared (``--workload unique``): load balancing alone, never pooled with the same
    prompts' shared-prefix cells."""
    prompts: str = cell["prompts"]
    return prompts + (" unique" if cell.get("shape", {}).get("workload") == "unique" else "")


class Point(NamedTuple):
    """One cell at one rate of the standing: our p95 over the better peer's, and where it ran."""

    ratio: float
    rate: float
    form: str  # ``prompt_form``: text, ids or chat, "ids unique" where nothing is shared
    reports: str  # what the engines report: full or minimal
    run: str  # the results directory


# The SGLang gateways the standing ranks against: smg 1.13.0 as shipped, smg with its worker-overload
# protection off (runs 91 on) and sglang-router 0.3.2.
STANDING_PEERS = ("smg", "smg-open", "sglang-router")


def standing(paths: list[Path], router: str = "ttft", peers: tuple[str, ...] = STANDING_PEERS) -> str:
    """``router`` against the better SGLang gateway in the same run, cell by cell and rate by rate
    over these ``summary.jsonl`` files (the routing issue's goal: p95 TTFT <= 0.7x the better of
    smg and sglang-router), with the oracle where the run had one; then the geometric mean.
    ``peers``: the gateways that count (one of them alone: the router against that one)."""
    rows = ["| run | prompts, reports, seed, text | rate | p95 ms | better peer | ratio | to the oracle |",
            "|---|---|---|---|---|---|---|"]
    ratios: list[Point] = []
    # A side whose phase lost requests has an infinite p95 and no ratio: such cells are named
    # and counted apart, never dropped in silence (run 90: smg lost 58 of 250, the default none)
    failed = {"ours": 0, "peer": 0, "both": 0}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            cell = json.loads(line)
            summary = cell["summary"]
            # "ttft,ttft/popularity=false": the first of these names the cell ran (a run that
            # compared a default with its change names the rule of its day otherwise)
            name_here = next((r for r in router.split(",") if r in summary), None)
            if name_here is None:
                continue
            for rate in cell["rates"]:
                key = f"{rate:g}"
                mine = summary[name_here].get(key, {}).get("ttft_p95")
                there = [(summary[n][key]["ttft_p95"], n) for n in peers if key in summary.get(n, {})]
                if mine is None or not there:
                    continue
                best, name = min(there)
                ratio = mine / best if math.isfinite(mine) and math.isfinite(best) else math.nan
                oracle = summary.get("oracle", {}).get(key, {}).get("ttft_p95")
                to_oracle = f"{mine / oracle:.2f}x" if oracle and math.isfinite(oracle) and math.isfinite(mine) else "-"
                form = prompt_form(cell)
                if math.isfinite(ratio):
                    ratios.append(Point(ratio, rate, form, cell["reports"], path.parent.name))
                    shown = f"{ratio:.2f}x"
                else:
                    side = "both" if not (math.isfinite(mine) or math.isfinite(best)) else (
                        "peer" if math.isfinite(mine) else "ours")
                    failed[side] += 1
                    shown = {"both": "both failed", "peer": f"{name} failed", "ours": f"{name_here} failed"}[side]
                rows.append(f"| {path.parent.name} | {form}, {cell['reports']}, {cell['seed']}, "
                            f"{cell.get('text', 'fresh')} | {rate:g} | {ms(mine)} | {name} {ms(best)} | "
                            f"{shown} | {to_oracle} |")
    if ratios:
        rows.append("\n" + points_line([r.ratio for r in ratios]))
        by_rate = sorted({r.rate for r in ratios})
        if len(by_rate) > 1:  # the knee and past it apart: a router can win one and not the other
            rows.extend(f"at {rate:g}/s: " + points_line([r.ratio for r in ratios if r.rate == rate]) for rate in by_rate)
        forms = sorted({(r.rate, r.form) for r in ratios})
        if len({form for _, form in forms}) > 1:  # and each prompt form at each rate
            rows.extend(f"{form} at {rate:g}/s: " + points_line([r.ratio for r in ratios if (r.rate, r.form) == (rate, form)])
                        for rate, form in forms)
            rows.extend(paired_forms(ratios))
        modes = sorted({r.reports for r in ratios})
        if len(modes) > 1:  # engines reporting their load or not: smg reads the reports (runs 86-91)
            rows.extend(f"{mode} reports: " + points_line([r.ratio for r in ratios if r.reports == mode]) for mode in modes)
    if any(failed.values()):
        rows.append(f"besides, cells where requests failed: the better peer alone in {failed['peer']}, "
                    f"{router.split(',')[0]} alone in {failed['ours']}, both in {failed['both']}")
    return "\n".join(rows)


def paired_forms(ratios: list[Point]) -> list[str]:
    """Two prompt forms against each other within one run and rate: the geometric mean of one
    form's ratios over the other's, per run, then over the runs. The machine of the day (one H200
    stepped 1.7x another) and the run's rate weigh on both forms alike there, so what is left
    between them is the form's own."""
    logs: dict[tuple[str, float], dict[str, list[float]]] = {}
    for r in ratios:
        logs.setdefault((r.run, r.rate), {}).setdefault(r.form, []).append(math.log(r.ratio))
    out = []
    for a, b in itertools.combinations(sorted({r.form for r in ratios}), 2):
        pairs = [math.exp(sum(got[a]) / len(got[a]) - sum(got[b]) / len(got[b]))
                 for got in logs.values() if a in got and b in got]
        if pairs:
            out.append(f"{a} / {b} within a run and rate: {len(pairs)} runs with both, geometric mean "
                       f"{geometric_mean(pairs)}, {a} ahead in {sum(r < 1.0 for r in pairs)}{interval(pairs)}")
    return out


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f}" if math.isfinite(seconds) else "failed"


def points_line(ratios: list[float]) -> str:
    """How many ratios, their geometric mean, how many at or under 0.7x and under 1.0x, the worst,
    and (from three on) the 95% interval of the mean."""
    line = (f"{len(ratios)} points: geometric mean {geometric_mean(ratios)}, {sum(r <= 0.7 for r in ratios)} at or "
            f"under 0.7x, {sum(r < 1.0 for r in ratios)} under 1.0x, worst {max(ratios):.2f}x")
    return line + interval(ratios)


def geometric_mean(ratios: list[float]) -> str:
    """The geometric mean of these ratios as the reports print it ("0.91x")."""
    return f"{math.exp(sum(math.log(r) for r in ratios) / len(ratios)):.2f}x"


def interval(ratios: list[float]) -> str:
    """From three ratios on, the 95% interval of their geometric mean, from their own spread (one
    GPU round's p95 varies by ~0.29 in log for ttft, 0.14 for smg: a single point proves little)."""
    if len(ratios) < 3:
        return ""
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / len(logs)
    half = 1.96 * math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) / len(logs))
    return f" (95% interval of the mean {math.exp(mean - half):.2f}-{math.exp(mean + half):.2f}x)"


# Routers whose placement does not learn: run twice on the same phases they route alike, so what
# moves between runs is the engines.
FIXED_ROUTERS = ("smg", "smg-open", "sglang-router", "oracle", "round_robin")


def repeatability(paths: list[Path]) -> str:
    """The real engines against themselves: each fixed router's TTFT p50 / p95 on the same phases
    (cell, seed, phase base, rate, the same prompt text) in every run that ran them, and the
    largest over the smallest. What a ±30% fidelity goal, or one run's ratio, is up against.
    (Within one run, round against round on the engines' own traces: ``fidelity_placed
    --repeatability``.)"""
    seen: dict[tuple[str, ...], list[tuple[str, float, float]]] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            cell = json.loads(line)
            base = argv_value(cell.get("argv", []), "--phase-base", "")
            if cell.get("text", "fresh") != "same" or not base:
                continue  # fresh text per phase: no two runs sent the same prompts
            for router in FIXED_ROUTERS:
                for rate, got in cell["summary"].get(router, {}).items():
                    key = (router, cell["prompts"], cell["reports"], str(cell["seed"]), base, rate)
                    seen.setdefault(key, []).append((path.parent.name, got["ttft_p50"], got["ttft_p95"]))
    rows = ["| router | prompts, reports, seed, phase base | rate | runs: p95 ms | p50 max / min | p95 max / min |",
            "|---|---|---|---|---|---|"]
    for (router, prompts, reports, seed, base, rate), runs in sorted(seen.items()):
        if len(runs) < 2:
            continue
        p50s, p95s = [r[1] for r in runs], [r[2] for r in runs]
        listed = "; ".join(f"{name} {p95 * 1e3:,.0f}" for name, _, p95 in runs)
        rows.append(f"| {router} | {prompts}, {reports}, {seed}, {base} | {rate} | {listed} | "
                    f"{max(p50s) / min(p50s):.2f} | {max(p95s) / min(p95s):.2f} |")
    return "\n".join(rows)


def _routed_phases(paths: list[Path]) -> dict[tuple[str, int, str, float], list[dict[str, Any]]]:
    """The request rows of these ``requests.jsonl`` by (run, phase, router, rate), the one engine
    alone (``direct0``) left out."""
    phases: dict[tuple[str, int, str, float], list[dict[str, Any]]] = {}
    for path in paths:
        for line in read_text(path).splitlines():
            if line.strip():
                r = json.loads(line)
                if r["router"] != "direct0":
                    phases.setdefault((path.parent.name, r["phase"], r["router"], r["rate"]), []).append(r)
    return phases


def _ttft(r: dict[str, Any]) -> float:
    """A request's TTFT; unanswered: infinitely slow."""
    return float(r["ttft"]) if r["ok"] and r["ttft"] is not None else math.inf


def growth_report(paths: list[Path]) -> str:
    """Per rate, over these ``requests.jsonl`` files: in how many phases the client's TTFT met the
    diagnosis' overload rule (``proxy/diagnose/rules_latency.rule_overload``, default thresholds:
    p95 over the SLO, the last third's median TTFT a multiple of the first third's and seconds
    above it) — where the rule would call a phase past the fleet's capacity."""
    from proxy.diagnose.findings import RuleParams

    p = RuleParams()
    by_rate: dict[float, list[str]] = {}
    for key, rows in _routed_phases(paths).items():
        ttfts = [_ttft(r) for r in sorted(rows, key=lambda r: r["at"])]
        third = len(ttfts) // 3
        if third < 10:
            continue
        early, late = pct(ttfts[:third], 0.5), pct(ttfts[-third:], 0.5)
        fires = (pct(ttfts, 0.95) > p.slo_ttft_p95_s and late >= p.overload_growth * early
                 and late - early >= p.overload_min_s)
        by_rate.setdefault(key[3], []).append(f"{key[2]}{'*' if fires else ''}")
    return "\n".join(f"{rate:g}/s: {sum(x.endswith('*') for x in names)} of {len(names)} phases past capacity "
                     f"(* = fires): {' '.join(sorted(names))}" for rate, names in sorted(by_rate.items()))


def tail_report(paths: list[Path]) -> str:
    """Per rate, over the phases of these ``requests.jsonl``: who the slowest 5% of a phase's
    requests are. Its group's first request in the phase (a cold prefix: every router has to
    compute it somewhere) or a follower; and when they arrived, as a share of the phase. Cold
    firsts in the tail say the p95 is the groups' first prefills; late followers say it is a queue
    growing over the phase (past capacity). Unanswered requests count as the slowest."""
    by_rate: dict[float, list[tuple[int, int, float]]] = {}
    for key, rows in _routed_phases(paths).items():
        rows.sort(key=lambda r: r["at"])
        seen: set[Any] = set()
        firsts: set[int] = set()  # the rows that open their group, by id
        for r in rows:
            if r["group"] not in seen:
                seen.add(r["group"])
                firsts.add(id(r))
        span = max(r["at"] for r in rows) or 1.0
        slow = sorted(rows, key=lambda r: -_ttft(r))
        top = slow[:max(1, round(0.05 * len(rows)))]
        by_rate.setdefault(key[3], []).append(
            (len(top), sum(id(r) in firsts for r in top), sum(r["at"] for r in top) / len(top) / span))
    out = []
    for rate, cells in sorted(by_rate.items()):
        n, cold = sum(c[0] for c in cells), sum(c[1] for c in cells)
        late = sorted(c[2] for c in cells)
        out.append(f"{rate:g}/s, {len(cells)} phases: of the slowest 5% ({n} requests) {cold} their group's first "
                   f"({cold / n:.0%}); arrived at {late[0]:.0%}-{late[-1]:.0%} of the phase (per phase mean)")
    return "\n".join(out)


def engines_report(path: Path) -> str:
    """Per phase and engine (``engines.jsonl``): requests it served, its worst and 90th-percentile
    TTFT as the engine saw it, the reuse it captured, and the fewest free KV blocks (never used +
    freed but still cached) it fell to: where a router's tail came from."""
    out = []
    for line in read_text(path).splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        out.append(f"{row['router']} @ {row['rate']:g}/s, {row['prompts']}, {row['reports']} reports")
        for e in row["engines"]:
            reqs = e.get("requests") or []
            if not reqs:
                out.append(f"  {e['worker']}: no requests")
                continue
            ttft = sorted(r["first"] - r["at"] for r in reqs if r.get("first"))
            prompt = sum(r["prompt"] for r in reqs)
            free = min((t[4] + t[5] for t in e.get("timeline") or []), default=-1)
            out.append(f"  {e['worker']}: {len(reqs)} requests, TTFT max {ttft[-1]:.2f} s p90 "
                       f"{pct(ttft, 0.9):.2f} s, reuse {sum(r['cached'] for r in reqs) / max(1, prompt):.0%}, "
                       f"least free KV {free}/{e.get('blocks')} blocks" if ttft else f"  {e['worker']}: no first tokens")
    return "\n".join(out)


def diagnoses_report(path: Path) -> str:
    """Per radixgate phase (``diagnoses.jsonl``): the verdict the router's own ``/diagnosis`` gave
    for that phase, its levers, and the reuse it saw (measured or estimated) beside what the
    shadow replay of the other policies would have captured."""
    out = []
    for row in read_jsonl(path):  # the committed runs' are stored gzipped (loadtests/jsonl.py)
        d = row["diagnosis"]
        v, cache = d["verdict"], d["four_numbers"]["cache"]

        def share(x: Any) -> str:
            return "-" if x is None else f"{100 * x:.0f}%"

        shadow = ", ".join(f"{s['policy']} {share(s['captured'])}" for s in cache["shadow"]) or "none"
        levers = "; ".join(f"{lv['setting']}: {lv['change']}" for lv in v["levers"][:2]) or "-"
        rules = ", ".join(f["rule"] for f in v["findings"]) or "-"
        out.append(f"{row['router']} @ {row['rate']:g}/s, {row['prompts']}, {row['reports']} reports: "
                   f"{v['kind']} ({v['confidence_label']}), ttft p95 {v['ttft_p95_s']} s; captured "
                   f"{share(cache['captured'])}{' (estimated)' if cache['estimated'] else ''} of available "
                   f"{share(cache['available'])}; shadow: {shadow}\n    findings: {rules}\n    levers: {levers}")
    return "\n".join(out)


def knee(path: Path, slo_s: float) -> str:
    """The highest rate of the last cell with an oracle ladder whose oracle p95 TTFT is under
    ``slo_s``, and the next rate of that ladder (or 1.5x the knee if it was the last)."""
    cells = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    ladder = next(c for c in reversed(cells) if "oracle" in c["summary"] and len(c["rates"]) > 2)
    rates = sorted(ladder["rates"])
    under = [r for r in rates if ladder["summary"]["oracle"][f"{r:g}"]["ttft_p95"] < slo_s] or rates[:1]
    k = under[-1]
    above = [r for r in rates if r > k]
    return f"{k:g},{above[0] if above else k * 1.5:g}"
