"""Run 32's summary.jsonl, rebuilt (run from the repository root: python loadtests/results/gpu-fleet-spread-4/rebuild_summary.py)."""
# Rebuilds run 32's summary.jsonl (the device returned 8 files and left it out) from its
# requests.jsonl.gz and engines.jsonl.gz, with loadtests.gpu.fleet.summarize as the run would have.
import dataclasses
import json
from pathlib import Path

from loadtests.gpu.fleet import Record, summarize
from loadtests.jsonl import read_jsonl

d = Path("loadtests/results/gpu-fleet-spread-4")
recs = read_jsonl(d / "requests.jsonl")
engines = read_jsonl(d / "engines.jsonl")
fields = {f.name for f in dataclasses.fields(Record)}
out = []
for prompts, reports, rate, base in (("text", "minimal", 4.5, 2400), ("ids", "full", 6.0, 2500)):
    summary, complete = {}, True
    for router in ("ttft", "smg"):
        phases = sorted({r["phase"] for r in recs if r["router"] == router and r["prompts"] == prompts})
        rows = [Record(**{k: v for k, v in r.items() if k in fields}) for r in recs
                if r["router"] == router and r["prompts"] == prompts]
        traced = [q for e in engines if e["router"] == router and e["prompts"] == prompts for w in e["engines"] for q in w["requests"]]
        reuse = sum(q["cached"] for q in traced) / max(1, sum(q["prompt"] for q in traced))
        p95s = [summarize([x for x in rows if x.phase == ph], None)["ttft_p95"] for ph in phases]
        whole = summarize(rows, reuse)
        summary[router] = {f"{rate:g}": whole if len(p95s) == 1 else {**whole, "p95_repeats": p95s}}
        complete &= len(phases) == 3
    argv = ["--out", "/root/out", "--phase-s", "25", "--drain-s", "15", "--seed", "9", "--repeat", "3",
            "--workers", *[f"http://127.0.0.1:3100{i}" for i in range(1, 5)], "--routers", "ttft,smg",
            "--rates", f"{rate:g}", "--prompts", prompts, "--reports", reports, "--warmup-s", "10", "--phase-base", str(base)]
    out.append({"argv": argv, "prompts": prompts, "reports": reports,
                "shape": {"groups": 32, "system_chars": 7000, "question_chars": 300, "output_tokens": 32, "workload": "shared"},
                "seed": 9, "text": "same", "repeat": 3, "workers": 4, "rates": [rate], "routers": ["ttft", "smg"],
                "summary": summary, "engine": "gpu", "complete": complete,
                "rebuilt": "from requests.jsonl.gz and engines.jsonl.gz after the run (NOTE.md)"})
(d / "summary.jsonl").write_text("".join(json.dumps(c) + "\n" for c in out))
