"""Real benchmark clients nobody here wrote, against radixgate in front of simulated workers.

    .venv/bin/python -m loadtests.bench_clients [--tools guidellm,aiperf,sglang,inference-perf]
        [--requests 100] [--concurrency 4] [--tool-timeout 300] [--cache-dir /tmp/radixgate-clients-venv]

Issue 20: what real clients and tools expect of a drop-in SGLang / OpenAI front. Each tool gets
its own virtualenv under ``--cache-dir`` (they pin different transformers / pydantic / torch, and
inference-perf wants Python >= 3.12), installed once with pip at a pinned version; a tool that does
not install is reported and skipped. Then two simulated SGLang workers (``python -m proxy.sim
--count 2``, the repo's BPE tokenizer, metrics and cache reports on) and ``python -m proxy serve``
in front of them on 127.0.0.1, and each tool runs a small bounded load (``--requests`` requests,
``--concurrency`` at a time, short synthetic prompts, ``--tool-timeout`` seconds at most) against
the proxy's SGLang-native and OpenAI endpoints. After each run:

- the tool reported no failed request and as many successes as it was asked for;
- the proxy's ``radixgate_requests_succeeded_total`` rose by exactly the requests the tool says it
  sent (plus the warm-up requests the tool is known to send), ``radixgate_requests_failed_total``
  did not move, and the workers' ``sglang:num_requests_total`` rose by as much;
- the proxy's prompt / completion / cached token counters rose by exactly what the workers' own
  ``sglang:prompt_tokens_total`` / ``generation_tokens_total`` / ``cached_tokens_total`` say they
  served (the exact reference: the tools count tokens with their own tokenizer, chat templates
  aside, so their totals are printed as notes only).

Prints one row per tool and mode and exits 1 when any tool that installed failed a check (2 when
the fleet itself did not start). ``--serve`` starts the fleet and the proxy, prints the URLs and
waits (to point a tool at by hand). sglang's ``bench_serving`` is installed with ``--no-deps``
plus what its client code imports; ``import sglang`` itself pulls torch and the whole server, so
the module runs through a tiny runner that skips the package ``__init__`` (the benchmark code is
sglang's, unmodified).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from loadtests.bench_overhead import free_port, stop_processes

REPO = Path(__file__).resolve().parent.parent
TOKENIZER = REPO / "loadtests" / "gpu" / "tokenizer"
ALL_TOOLS = ["guidellm", "aiperf", "sglang", "inference-perf"]


# -- installs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tool:
    name: str
    pip: list[list[str]]          # one ``pip install`` argument list per step
    python: str = ""              # interpreter for the venv ("" = this one); >= 3.12 where needed
    min_python: tuple[int, int] = (3, 10)


# sglang's client code imports these (benchmark/serving.py, datasets/, utils.py); the rest of its
# 80 requirements (torch, flashinfer, kernels) are the server's.
SGLANG_CLIENT_DEPS = ["aiohttp", "msgspec", "numpy", "orjson", "psutil", "pyzmq", "requests", "tqdm", "transformers==5.19.0",
                      "pillow", "pybase64", "datasets"]

TOOLS = {
    "guidellm": Tool("guidellm", [["guidellm==0.8.1"]]),
    "aiperf": Tool("aiperf", [["aiperf==0.13.0"]]),
    "sglang": Tool("sglang", [["--no-deps", "sglang==0.5.23"], SGLANG_CLIENT_DEPS]),
    "inference-perf": Tool("inference-perf", [["inference-perf==0.7.0"]], min_python=(3, 12)),
}


def find_python(min_version: tuple[int, int]) -> str | None:
    """This interpreter when new enough, else a python3.X on PATH or under pyenv."""
    if sys.version_info[:2] >= min_version:
        return sys.executable
    candidates = [shutil.which(f"python3.{m}") for m in range(min_version[1], 16)]
    pyenv = Path.home() / ".pyenv" / "versions"
    if pyenv.is_dir():
        candidates += [str(p / "bin" / "python3") for p in sorted(pyenv.iterdir(), reverse=True)]
    for exe in candidates:
        if not exe or not Path(exe).exists():
            continue
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, check=False)
        if out.returncode == 0 and tuple(int(x) for x in out.stdout.split()) >= min_version:
            # the shim's target, not the shim: a venv made through a pyenv shim breaks when the
            # shim's selected version changes
            real = subprocess.run([exe, "-c", "import sys; print(sys.executable)"],
                                  capture_output=True, text=True, check=False)
            return real.stdout.strip() or exe
    return None


def install(tool: Tool, cache: Path, log: Callable[[str], None]) -> tuple[Path | None, str]:
    """The tool's venv bin directory (installed once, marked done), or None and why not."""
    venv = cache / tool.name
    marker = venv / ".radixgate-installed"
    stamp = json.dumps(tool.pip)
    if marker.exists() and marker.read_text() == stamp:
        return venv / "bin", "cached"
    python = find_python(tool.min_python)
    if python is None:
        return None, f"no Python >= {'.'.join(map(str, tool.min_python))} found"
    if venv.exists():
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    logfile = cache / f"{tool.name}-install.log"
    with logfile.open("w") as out:
        steps = [[python, "-m", "venv", str(venv)]]
        steps += [[str(venv / "bin" / "python"), "-m", "pip", "install", *args] for args in tool.pip]
        for cmd in steps:
            log(f"  {' '.join(cmd)}")
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
            if rc != 0:
                tail = logfile.read_text().strip().splitlines()[-1:]
                return None, f"pip failed (rc {rc}): {tail[0] if tail else ''} (log {logfile})"
    marker.write_text(stamp)
    return venv / "bin", "installed"


# -- the fleet -----------------------------------------------------------------------------------

@dataclass
class Fleet:
    workers: list[str]
    base: str
    admin: str
    model: str
    procs: list[asyncio.subprocess.Process]


async def start_fleet(args: argparse.Namespace, workdir: Path) -> Fleet:
    cmd = [sys.executable, "-m", "proxy.sim", "--port", "0", "--count", str(args.workers), "--shared-gpu",
           "--profile", args.sim_profile, "--time-scale", str(args.time_scale), "--tokenizer", str(TOKENIZER),
           "--enable-metrics", "--enable-cache-report", "--page-size", "16"]
    sim = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE,
                                               stderr=(workdir / "sim.log").open("wb"), cwd=REPO)
    procs = [sim]
    assert sim.stdout is not None
    workers = []
    try:
        for i in range(args.workers):
            line = (await asyncio.wait_for(sim.stdout.readline(), 60)).decode()
            match = re.search(r"READY (\S+)", line)
            if not match:
                raise RuntimeError(f"simulated worker {i} did not start: {line!r} (see {workdir}/sim.log)")
            workers.append(match.group(1))
        port, admin = free_port(), free_port()
        cfg = workdir / "radixgate.yaml"
        cfg.write_text(yaml.safe_dump({
            "server": {"host": "127.0.0.1", "port": port, "admin_port": admin, "drain_grace_s": 1.0},
            "workers": {"static": workers},
            "upstream": {"first_byte_timeout_s": 120.0, "idle_timeout_s": 120.0},
            "telemetry": {"log_level": "info", "log_requests": True}}))
        log = (workdir / "proxy.log").open("wb")
        procs.append(await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(cfg), stdout=log,
            stderr=asyncio.subprocess.STDOUT, cwd=REPO))
        base = f"http://127.0.0.1:{port}"
        model = await ready(base, workdir)
        return Fleet(workers, base, f"http://127.0.0.1:{admin}", model, procs)
    except BaseException:
        await stop_processes(procs)
        raise


async def ready(base: str, workdir: Path) -> str:
    """The served model name, once a one-token request went through the proxy."""
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while time.monotonic() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(f"{base}/generate",
                                        json={"text": "ready", "sampling_params": {"max_new_tokens": 1}}) as r:
                    await r.read()
                    if r.status == 200:
                        async with session.get(f"{base}/v1/models") as m:
                            return str((await m.json())["data"][0]["id"])
            await asyncio.sleep(0.3)
    raise RuntimeError(f"the proxy at {base} never answered (see {workdir}/proxy.log)")


async def samples(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Every sample of ``url``/metrics, summed over labels."""
    async with session.get(url + "/metrics") as r:
        r.raise_for_status()
        text = await r.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def snapshot(fleet: Fleet) -> dict[str, float]:
    """The proxy's counters (``radixgate_*``) and the workers' (``sglang:*``, summed)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        out = {k: v for k, v in (await samples(session, fleet.admin)).items() if k.startswith("radixgate_")}
        for w in fleet.workers:
            for k, v in (await samples(session, w)).items():
                if k.startswith("sglang:"):
                    out[k] = out.get(k, 0.0) + v
    return out


async def settle(fleet: Fleet, before: dict[str, float]) -> dict[str, float]:
    """The counters once the workers stopped counting (a cancelled request ends a moment later)."""
    last = await snapshot(fleet)
    for _ in range(20):
        await asyncio.sleep(0.3)
        now = await snapshot(fleet)
        if now == last:
            return now
        last = now
    return last


# -- runs ----------------------------------------------------------------------------------------

@dataclass
class Result:
    tool: str
    mode: str
    ok: int = 0
    failed: int = 0
    extra: int = 0                 # requests the tool sends beside the ones it reports (warm-up)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    notes: list[str] = field(default_factory=list)
    checks: dict[str, bool] = field(default_factory=dict)
    error: str = ""
    gap: str = ""

    @property
    def passed(self) -> bool:
        return not self.error and bool(self.checks) and all(self.checks.values())


@dataclass
class Case:
    tool: str
    mode: str                      # what the row says: endpoint and stream mode
    command: Callable[[Path, Fleet, argparse.Namespace, Path], list[str]]
    parse: Callable[[Path, argparse.Namespace, Result], None]
    extra: int = 0
    env: dict[str, str] = field(default_factory=dict)
    gap: str = ""                  # a mode the proxy is known not to serve (why), run only with --gaps


def _cli(bin_dir: Path, name: str) -> str:
    return str(bin_dir / name)


# guidellm ---------------------------------------------------------------------------------------

def guidellm_cmd(endpoint: str, stream: bool) -> Callable[[Path, Fleet, argparse.Namespace, Path], list[str]]:
    def build(bin_dir: Path, fleet: Fleet, args: argparse.Namespace, out: Path) -> list[str]:
        return [_cli(bin_dir, "guidellm"), "run",
                "--backend", f"kind=openai_http,target={fleet.base},model={fleet.model},"
                             f"request_format={endpoint},stream={str(stream).lower()}",
                "--profile", f"kind=concurrent,streams={args.concurrency}",
                "--constraint", f"kind=max_requests,count={args.requests}",
                "--tokenizer", f"kind=huggingface_auto,model={TOKENIZER}",
                "--data", f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},"
                          f"output_tokens={args.output_tokens}",
                "--output", f"kind=json,path={out / 'guidellm.json'}",
                "--disable-progress"]
    return build


def guidellm_parse(out: Path, args: argparse.Namespace, res: Result) -> None:
    metrics = json.loads((out / "guidellm.json").read_text())["benchmarks"][0]["metrics"]
    totals = metrics["request_totals"]
    res.ok, res.failed = int(totals["successful"]), int(totals["errored"]) + int(totals["incomplete"])
    if totals["incomplete"]:
        res.notes.append(f"{totals['incomplete']} incomplete")
    # guidellm prefers the server's usage (prefer_response_metrics) over its own count
    res.prompt_tokens = round(metrics["prompt_token_count"]["successful"]["total_sum"])
    res.completion_tokens = round(metrics["output_token_count"]["successful"]["total_sum"])


# aiperf -----------------------------------------------------------------------------------------

def aiperf_cmd(endpoint_type: str, stream: bool) -> Callable[[Path, Fleet, argparse.Namespace, Path], list[str]]:
    def build(bin_dir: Path, fleet: Fleet, args: argparse.Namespace, out: Path) -> list[str]:
        return [_cli(bin_dir, "aiperf"), "profile", "--model", fleet.model, "--url", fleet.base,
                "--endpoint-type", endpoint_type, *(["--streaming"] if stream else []),
                "--tokenizer", str(TOKENIZER), "--request-count", str(args.requests),
                "--concurrency", str(args.concurrency),
                "--synthetic-input-tokens-mean", str(args.prompt_tokens), "--synthetic-input-tokens-stddev", "0",
                "--output-tokens-mean", str(args.output_tokens), "--output-tokens-stddev", "0",
                # SGLang serves /metrics on its own port; radixgate on the admin port only
                "--server-metrics", f"{fleet.admin}/metrics",
                "--output-artifact-dir", str(out / "aiperf"), "--ui-type", "none"]
    return build


def _find(out: Path, pattern: str) -> Path:
    found = sorted(out.rglob(pattern))
    if not found:
        raise FileNotFoundError(f"no {pattern} under {out}")
    return found[0]


def aiperf_parse(out: Path, args: argparse.Namespace, res: Result) -> None:
    doc = json.loads(_find(out / "aiperf", "profile_export_aiperf.json").read_text())

    def metric(name: str) -> float:
        m = doc.get(name)
        return float(m.get("avg") or 0) if isinstance(m, dict) else 0.0
    res.ok = round(metric("request_count"))
    res.failed = round(metric("error_request_count")) or sum(int(e.get("count", 0)) for e in doc.get("error_summary") or [])
    if not doc.get("is_complete", True) or doc.get("was_cancelled"):
        res.notes.append("aiperf: run incomplete or cancelled")
    # the usage the server reported, as aiperf received it through the proxy (its own ISL/OSL are
    # client-side re-tokenizations)
    res.prompt_tokens = round(metric("total_usage_prompt_tokens"))
    res.completion_tokens = round(metric("total_usage_completion_tokens"))
    scraped = sorted((out / "aiperf").rglob("server_metrics*.json"))
    res.notes.append("aiperf read the admin /metrics" if scraped else "aiperf exported no server metrics")


# sglang.bench_serving ---------------------------------------------------------------------------

# sglang/__init__.py imports the server (torch, triton, flashinfer); bench_serving needs none of
# it. Register the package and the two srt packages its client imports from as bare namespaces,
# and stand in the one server constant it reads, then run sglang's CLI unmodified.
SGLANG_RUNNER = """
import importlib.util, sys, types
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
for name, sub in (("sglang", ""), ("sglang.srt", "/srt"), ("sglang.srt.utils", "/srt/utils"),
                  ("sglang.srt.disaggregation", "/srt/disaggregation")):
    mod = types.ModuleType(name); mod.__path__ = [root + sub]; sys.modules[name] = mod
dis = types.ModuleType("sglang.srt.disaggregation.utils"); dis.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
sys.modules["sglang.srt.disaggregation.utils"] = dis
from sglang.benchmark.serving import cli_main
sys.argv[0] = "sglang.bench_serving"
cli_main()
"""


def sglang_cmd(backend: str, *extra: str) -> Callable[[Path, Fleet, argparse.Namespace, Path], list[str]]:
    def build(bin_dir: Path, fleet: Fleet, args: argparse.Namespace, out: Path) -> list[str]:
        return [_cli(bin_dir, "python"), "-c", SGLANG_RUNNER, "--backend", backend, "--base-url", fleet.base,
                "--model", fleet.model, "--tokenizer", str(TOKENIZER), "--dataset-name", "random-ids",
                "--random-input-len", str(args.prompt_tokens), "--random-output-len", str(args.output_tokens),
                "--random-range-ratio", "1.0", "--num-prompts", str(args.requests),
                "--max-concurrency", str(args.concurrency), "--request-rate", "inf",
                "--output-file", str(out / "sglang.jsonl"), "--disable-tqdm", *extra]
    return build


def sglang_parse(out: Path, args: argparse.Namespace, res: Result) -> None:
    doc = json.loads((out / "sglang.jsonl").read_text().strip().splitlines()[-1])
    res.ok = int(doc["completed"])
    res.failed = args.requests - res.ok
    res.prompt_tokens = int(doc["total_input_tokens"])
    res.completion_tokens = int(doc["total_output_tokens"])


# inference-perf ---------------------------------------------------------------------------------

def inference_perf_cmd(api: str, stream: bool) -> Callable[[Path, Fleet, argparse.Namespace, Path], list[str]]:
    def build(bin_dir: Path, fleet: Fleet, args: argparse.Namespace, out: Path) -> list[str]:
        fixed = {"min": args.prompt_tokens, "max": args.prompt_tokens, "mean": args.prompt_tokens, "std_dev": 0,
                 "total_count": args.requests}
        if api == "completion":   # its random generator serves completions only
            data: dict[str, Any] = {"type": "random", "input_distribution": fixed,
                                    "output_distribution": {**fixed, "min": args.output_tokens,
                                                            "max": args.output_tokens, "mean": args.output_tokens}}
        else:                     # chat: groups of prompts behind a shared system prompt
            groups = 4
            data = {"type": "shared_prefix", "shared_prefix": {
                "num_groups": groups, "num_prompts_per_group": max(1, args.requests // groups),
                "system_prompt_len": args.prompt_tokens, "question_len": args.prompt_tokens // 4,
                "output_len": args.output_tokens, "seed": 42}}
        config = {
            # fixed seeds: its generators decode random ids and re-encode them until the length is
            # exact, and give up after 20 tries (the repo's BPE merges some): a seed that works works
            "load": {"type": "concurrent", "base_seed": 42,
                     "stages": [{"num_requests": args.requests, "concurrency_level": args.concurrency}]},
            "api": {"type": api, "streaming": stream},
            "server": {"type": "sglang", "model_name": fleet.model, "base_url": fleet.base, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(TOKENIZER)},
            "data": data,
            "report": {"request_lifecycle": {"summary": True, "per_stage": True, "per_request": True}},
            "storage": {"local_storage": {"path": str(out / "inference-perf")}},
        }
        path = out / "inference-perf.yaml"
        path.write_text(yaml.safe_dump(config))
        return [_cli(bin_dir, "inference-perf"), "--config_file", str(path)]
    return build


def inference_perf_parse(out: Path, args: argparse.Namespace, res: Result) -> None:
    doc = json.loads(_find(out / "inference-perf", "summary_lifecycle_metrics.json").read_text())
    successes, failures = doc.get("successes") or {}, doc.get("failures") or {}
    res.ok, res.failed = int(successes.get("count", 0)), int(failures.get("count", 0))
    sent = int((doc.get("load_summary") or {}).get("count", res.ok + res.failed))
    if sent != res.ok + res.failed:
        res.notes.append(f"inference-perf scheduled {sent}")
    # the server's usage as inference-perf received it ("output_len" is its own re-tokenization)
    res.prompt_tokens = round(float((successes.get("prompt_tokens") or {}).get("total", 0)))
    res.completion_tokens = round(float((successes.get("output_tokens") or {}).get("total", 0)))


ONLINE = {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": ""}   # "" = unset
CASES: dict[str, list[Case]] = {
    "guidellm": [
        Case("guidellm", "/v1/chat/completions stream", guidellm_cmd("/v1/chat/completions", True), guidellm_parse),
        Case("guidellm", "/v1/completions stream", guidellm_cmd("/v1/completions", True), guidellm_parse),
        Case("guidellm", "/v1/completions", guidellm_cmd("/v1/completions", False), guidellm_parse),
        Case("guidellm", "/v1/chat/completions", guidellm_cmd("/v1/chat/completions", False), guidellm_parse),
        Case("guidellm", "/v1/responses stream", guidellm_cmd("/v1/responses", True), guidellm_parse),
        Case("guidellm", "/v1/responses", guidellm_cmd("/v1/responses", False), guidellm_parse),
    ],
    "aiperf": [
        # aiperf's offline mode takes only a Hub id as --tokenizer, not a local directory: run it
        # online (127.0.0.1 is all it talks to once the tokenizer is a path)
        Case("aiperf", "/v1/chat/completions stream", aiperf_cmd("chat", True), aiperf_parse, env=ONLINE),
        Case("aiperf", "/v1/chat/completions", aiperf_cmd("chat", False), aiperf_parse, env=ONLINE),
        Case("aiperf", "/v1/completions stream", aiperf_cmd("completions", True), aiperf_parse, env=ONLINE),
        Case("aiperf", "/v1/completions", aiperf_cmd("completions", False), aiperf_parse, env=ONLINE),
        Case("aiperf", "/v1/responses stream", aiperf_cmd("responses", True), aiperf_parse, env=ONLINE),
        Case("aiperf", "/v1/responses", aiperf_cmd("responses", False), aiperf_parse, env=ONLINE),
    ],
    "sglang": [
        # one warm-up request before the run (bench_serving's --warmup-requests, default 1)
        Case("sglang", "/generate stream (--backend sglang)", sglang_cmd("sglang"), sglang_parse, extra=1),
        Case("sglang", "/generate (--backend sglang --disable-stream)", sglang_cmd("sglang", "--disable-stream"),
             sglang_parse, extra=1),
        Case("sglang", "/generate input_ids stream (--tokenize-prompt)", sglang_cmd("sglang", "--tokenize-prompt"),
             sglang_parse, extra=1),
        Case("sglang", "/v1/completions stream (sglang-oai)", sglang_cmd("sglang-oai"), sglang_parse, extra=1),
        Case("sglang", "/v1/completions (sglang-oai --disable-stream)", sglang_cmd("sglang-oai", "--disable-stream"),
             sglang_parse, extra=1),
        Case("sglang", "/v1/chat/completions stream (sglang-oai-chat)", sglang_cmd("sglang-oai-chat"),
             sglang_parse, extra=1),
        Case("sglang", "/v1/chat/completions (sglang-oai-chat --disable-stream)",
             sglang_cmd("sglang-oai-chat", "--disable-stream"), sglang_parse, extra=1),
    ],
    "inference-perf": [
        Case("inference-perf", "/v1/completions stream", inference_perf_cmd("completion", True),
             inference_perf_parse),
        Case("inference-perf", "/v1/completions", inference_perf_cmd("completion", False), inference_perf_parse),
        Case("inference-perf", "/v1/chat/completions stream, shared prefix", inference_perf_cmd("chat", True),
             inference_perf_parse),
        Case("inference-perf", "/v1/chat/completions, shared prefix", inference_perf_cmd("chat", False),
             inference_perf_parse),
    ],
}

COUNTERS = [("radixgate_prompt_tokens_total", "sglang:prompt_tokens_total"),
            ("radixgate_completion_tokens_total", "sglang:generation_tokens_total"),
            ("radixgate_cached_tokens_total", "sglang:cached_tokens_total")]


def check(res: Result, before: dict[str, float], after: dict[str, float], expected: int, requested: int) -> None:
    def delta(name: str) -> int:
        return round(after.get(name, 0.0) - before.get(name, 0.0))
    res.checks["tool: 0 failed"] = res.failed == 0 and res.ok > 0
    if res.ok + res.failed != requested:   # the tool itself gave up on some (see its log)
        res.notes.append(f"the tool sent {res.ok + res.failed} of {requested}")
    ok, failed = delta("radixgate_requests_succeeded_total"), delta("radixgate_requests_failed_total")
    worker_reqs = delta("sglang:num_requests_total")
    res.checks["proxy requests"] = ok == expected and failed == 0 and worker_reqs == expected
    if not res.checks["proxy requests"]:
        res.notes.append(f"proxy ok +{ok} failed +{failed}, workers +{worker_reqs}, expected {expected}")
    mismatched = [f"{p} +{delta(p)} vs {w} +{delta(w)}" for p, w in COUNTERS if delta(p) != delta(w)]
    res.checks["tokens = workers'"] = not mismatched and delta("radixgate_prompt_tokens_total") > 0
    res.notes += mismatched
    tool_tokens = [f"{what} tool {mine} / workers {delta(w)}"
                   for what, mine, w in (("prompt", res.prompt_tokens, "sglang:prompt_tokens_total"),
                                         ("output", res.completion_tokens, "sglang:generation_tokens_total"))
                   if mine is not None]
    if tool_tokens:
        res.notes.append("tokens: " + ", ".join(tool_tokens))


async def run_case(case: Case, bin_dir: Path, fleet: Fleet, args: argparse.Namespace, workdir: Path) -> Result:
    res = Result(case.tool, case.mode, extra=case.extra, gap=case.gap)
    out = workdir / re.sub(r"[^A-Za-z0-9]+", "_", f"{case.tool}_{case.mode}").strip("_")
    out.mkdir(parents=True, exist_ok=True)
    cmd = case.command(bin_dir, fleet, args, out)
    (out / "command.txt").write_text(" ".join(cmd) + "\n")
    before = await snapshot(fleet)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost",
           "no_proxy": "127.0.0.1,localhost", "TOKENIZERS_PARALLELISM": "false", **case.env}
    env = {k: v for k, v in env.items() if v and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{bin_dir}:{env.get('PATH', '')}"
    started = time.monotonic()
    with (out / "tool.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=asyncio.subprocess.STDOUT,
                                                    cwd=out, env=env, start_new_session=True)
        try:
            rc = await asyncio.wait_for(proc.wait(), args.tool_timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            rc = -9
            res.error = f"timed out after {args.tool_timeout:.0f} s"
    res.notes.append(f"{time.monotonic() - started:.0f} s")
    after = await settle(fleet, before)
    if rc != 0 and not res.error:
        res.error = f"rc {rc}: " + last_line(out / "tool.log")
    try:
        case.parse(out, args, res)
    except (OSError, KeyError, ValueError, IndexError, TypeError) as exc:
        res.error = res.error or f"no results ({type(exc).__name__}: {exc}): " + last_line(out / "tool.log")
    if not res.error:
        check(res, before, after, res.ok + res.failed + res.extra, args.requests)
    return res


def last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def table(results: list[Result], skipped: dict[str, str]) -> str:
    rows = [["tool", "endpoint / mode", "ok/failed", "tool ok", "proxy reqs", "tokens", "result", "notes"]]
    for r in results:
        def mark(name: str, r: Result = r) -> str:
            return "-" if name not in r.checks else "yes" if r.checks[name] else "NO"
        rows.append([r.tool, r.mode, f"{r.ok}/{r.failed}", mark("tool: 0 failed"), mark("proxy requests"),
                     mark("tokens = workers'"),
                     ("gap: passed" if r.passed else "gap") if r.gap else "pass" if r.passed else "FAIL",
                     "; ".join(([r.gap] if r.gap else []) + ([r.error] if r.error else []) + r.notes)])
    for tool, why in skipped.items():
        rows.append([tool, "-", "-", "-", "-", "-", "not installed", why])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
                     + " | " + row[-1] + " |")
        if i == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|---|")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    unknown = set(tools) - set(TOOLS)
    if unknown:
        raise SystemExit(f"unknown tools {sorted(unknown)} (known: {ALL_TOOLS})")
    cache = Path(args.cache_dir)
    bins: dict[str, Path] = {}
    skipped: dict[str, str] = {}
    if not args.serve:
        for name in tools:
            print(f"[{name}] install into {cache / name}", flush=True)
            bin_dir, why = install(TOOLS[name], cache, lambda s: print(s, flush=True))
            print(f"[{name}] {why}", flush=True)
            if bin_dir is None:
                skipped[name] = why
            else:
                bins[name] = bin_dir
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="radixgate-clients-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        fleet = await start_fleet(args, workdir)
    except (RuntimeError, TimeoutError) as exc:
        print(f"fleet did not start: {exc}", file=sys.stderr)
        return 2
    print(f"proxy {fleet.base} (admin {fleet.admin}) -> workers {fleet.workers}, model {fleet.model!r}; "
          f"logs in {workdir}", flush=True)
    results: list[Result] = []
    try:
        if args.serve:   # until SIGTERM / SIGINT (SIGINT is ignored in a background job)
            stop = asyncio.Event()
            for sig in (signal.SIGTERM, signal.SIGINT):
                asyncio.get_running_loop().add_signal_handler(sig, stop.set)
            await stop.wait()
            return 0
        for name in tools:
            if name not in bins:
                continue
            for case in CASES[name]:
                if (args.only and args.only not in case.mode) or (case.gap and not args.gaps):
                    continue
                print(f"[{name}] {case.mode} ...", flush=True)
                res = await run_case(case, bins[name], fleet, args, workdir)
                print(f"[{name}] {case.mode}: {'pass' if res.passed else 'FAIL'} "
                      f"{res.error} {'; '.join(res.notes)}", flush=True)
                results.append(res)
    finally:
        await stop_processes(fleet.procs)
    print()
    print(table(results, skipped))
    summary = workdir / "results.csv"
    with summary.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tool", "mode", "ok", "failed", "checks", "error", "notes"])
        for r in results:
            w.writerow([r.tool, r.mode, r.ok, r.failed, json.dumps(r.checks), r.error, "; ".join(r.notes)])
    print(f"\nper-run logs and commands: {workdir}")
    return 0 if all(r.passed for r in results if not r.gap) else 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", default=",".join(ALL_TOOLS), help="comma-separated subset of " + ",".join(ALL_TOOLS))
    p.add_argument("--only", default="", help="run only the modes whose name contains this")
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--tool-timeout", type=float, default=300.0, help="seconds per tool run")
    p.add_argument("--cache-dir", default=os.environ.get("RADIXGATE_CLIENTS_CACHE", "/tmp/radixgate-clients-venv"))
    p.add_argument("--workdir", default="", help="logs and tool outputs (default: a new temp dir)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sim-profile", default="llama-3.1-8b-h100")
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--gaps", action="store_true",
                   help="also run the modes the proxy is known not to serve (reported, never failing the run)")
    p.add_argument("--serve", action="store_true", help="start the fleet and the proxy and wait")
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
