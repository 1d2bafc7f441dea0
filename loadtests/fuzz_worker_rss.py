"""Memory of a ``radixgate serve`` process while a broken worker misbehaves at it (issue 16).

    python -m loadtests.fuzz_worker_rss                     # 1,500 fuzz cases + heavy cases, small caps
    python -m loadtests.fuzz_worker_rss --caps default      # the shipped caps (64 MiB / 8 MiB / 8 MiB)
    python -m loadtests.fuzz_worker_rss --cases 3000 --json out.json

The proxy runs as its own process (the CLI, on uvloop), in front of one ``BrokenWorker``
(tests/fixtures/broken_worker.py) in this process. The cases are the worker-side fuzz's
(tests/fixtures/worker_faults.py, drawn by Hypothesis): whole answers, streams, and scrape answers
(the proxy's own scraper polls the worker every 50 ms while they are set). Then heavy cases that
only the caps stop: a 2 GB ``Content-Length`` with 8 MiB actually sent, a 9 MiB SSE line without
its blank line, 9 MiB scrape and probe answers, each several times. Resident memory (RSS) of the
proxy process is read after a warm-up, every 100 cases, and at the end; the report also gives
each outcome's count and checks that the proxy answered nothing with a 500 and that its books
balance (accepted = succeeded + failed). Exit status 0 when they do and RSS grew by less than
``--max-growth-mb``.

Imports a test fixture (the broken worker and the case strategies) so that what is measured is
exactly what the fuzz test runs; it is a measurement, not a test: numbers, printed.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.broken_worker import HANG, Answer, BrokenWorker, Step, chunk, sse_head
from tests.fixtures.broken_worker import http as answer
from tests.fixtures.loop_thread import LoopThread, metrics_by_cause
from tests.fixtures.worker_faults import SMALL_CAPS, Case, http_answers, scrape_answers, sse_answers

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


class WorkerThread(LoopThread):
    """The broken worker on its own uvloop loop in a thread."""

    def __init__(self) -> None:
        super().__init__("rss-worker")
        self.worker: BrokenWorker | None = None

    async def _start(self) -> None:
        self.worker = await self._stack.enter_async_context(BrokenWorker.running())

    def __enter__(self) -> BrokenWorker:  # type: ignore[override]
        super().__enter__()
        assert self.worker is not None
        return self.worker


@contextlib.contextmanager
def proxy_process(worker_url: str, caps: dict[str, int]) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    config = {
        "workers": {"static": [worker_url]},
        "health": {"interval_s": 0, "timeout_s": 0.2, "eject_after_failures": 1_000_000},
        "scrape": {"interval_s": 0.05, "timeout_s": 1.0, "stale_after_s": 0.5},
        "upstream": {"total_timeout_s": 0.6, "first_byte_timeout_s": 0.25, "idle_timeout_s": 0.25,
                     "keepalive_timeout_s": 0.0, **{k.split(".", 1)[1]: v for k, v in caps.items()}},
        "telemetry": {"log_requests": False, "log_level": "error"},
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "radixgate.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "serve", "--config", str(path), "--port", "0",
                                 "--admin-port", "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            assert line.startswith("READY "), line
            fields = dict(part.split("=", 1) for part in line.split()[1:])
            yield proc, int(fields["http"].rsplit(":", 1)[1]), int(fields["admin"].rsplit(":", 1)[1])
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def post(port: int, body: dict[str, Any]) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        try:
            return resp.status, resp.read()
        except http.client.IncompleteRead:
            return -1, b""  # a cut stream: counted as an outcome, and a failure of the run
    finally:
        conn.close()


def metrics(port: int) -> dict[tuple[str, str], float]:
    return metrics_by_cause(port, 10.0)


def heavy_cases() -> list[tuple[str, str, Answer, bool]]:
    """(name, path, steps, stream): answers only the caps stop."""
    declared: list[Step] = [b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2000000000\r\n\r\n",
                            *[b" " * MB for _ in range(8)], HANG]
    endless: list[Step] = [sse_head(), chunk(b'data: {"text": "'), *[chunk(b"a" * (64 * 1024)) for _ in range(9 * 16)], HANG]
    pad = b" " * (9 * MB)
    return [("declared-2GB", "/generate", declared, False),
            ("endless-sse-line-9MiB", "/generate", endless, True),
            ("loads-9MiB", "/v1/loads", answer(200, b'{"loads": [{"num_running_reqs": 0}], "pad": "' + pad + b'"}'), False),
            ("metrics-9MiB", "/metrics", answer(200, b"# " + pad + b"\n", content_type="text/plain"), False)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1500, help="fuzz cases (split 45%% whole answers, 40%% streams, "
                                                             "15%% scrape answers)")
    ap.add_argument("--heavy-repeats", type=int, default=5)
    ap.add_argument("--caps", choices=["small", "default"], default="small")
    ap.add_argument("--heavy", action="append", default=[], metavar="NAME",
                    help="run only these heavy cases (repeatable; default: all)")
    ap.add_argument("--max-growth-mb", type=float, default=50.0)
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args(argv)
    caps = SMALL_CAPS if args.caps == "small" else {}
    outcomes: Counter[str] = Counter()
    samples: list[tuple[int, float]] = []
    started = time.monotonic()
    with WorkerThread() as worker, proxy_process(worker.url, caps) as (proc, http_port, admin_port):
        rss = psutil.Process(proc.pid)
        count = 0

        def sample() -> None:
            samples.append((count, rss.memory_info().rss / MB))

        def run(case: Case, path: str, stream: bool) -> None:
            nonlocal count
            worker.on(path, case.steps)
            if path == "/generate":
                status, _ = post(http_port, {"text": "fuzz", "stream": stream})
                outcomes[f"{'stream' if stream else 'whole'} {status}"] += 1
            count += 1
            if count % 100 == 0:
                sample()

        warm_up = max(1, args.cases // 10)
        def fuzz(examples: int) -> settings:
            return settings(max_examples=max(1, examples), deadline=None, database=None, derandomize=True,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

        @fuzz(int(args.cases * 0.45))
        @given(case=http_answers())
        def whole(case: Case) -> None:
            run(case, "/generate", False)
            if count == warm_up:
                sample()

        @fuzz(int(args.cases * 0.40))
        @given(case=sse_answers())
        def streams(case: Case) -> None:
            run(case, "/generate", True)

        @fuzz(args.cases - int(args.cases * 0.45) - int(args.cases * 0.40))
        @given(answers=scrape_answers(), pause=st.sampled_from([0.06]))
        def scrapes(answers: dict[str, Any], pause: float) -> None:
            nonlocal count
            for path, steps in answers.items():
                worker.on(path, steps)
            time.sleep(pause)  # the proxy's scraper (every 50 ms) meets these answers
            outcomes["scrape answers set"] += 1
            count += 1
            if count % 100 == 0:
                sample()

        whole()
        streams()
        scrapes()
        worker.reset()
        for name, path, steps, stream in heavy_cases():
            if args.heavy and name not in args.heavy:
                continue
            for _ in range(args.heavy_repeats):
                worker.on(path, steps)
                if path == "/generate":
                    status, _ = post(http_port, {"text": "heavy", "stream": stream})
                    outcomes[f"heavy {name} {status}"] += 1
                else:
                    time.sleep(0.12)
                    outcomes[f"heavy {name} set"] += 1
            worker.reset()
        time.sleep(0.2)
        status, _ = post(http_port, {"text": "still serving?"})
        outcomes[f"final good request {status}"] += 1
        sample()
        m = metrics(admin_port)
    elapsed = time.monotonic() - started
    accepted = sum(v for (n, _), v in m.items() if n == "radixgate_requests_accepted_total")
    succeeded = sum(v for (n, _), v in m.items() if n == "radixgate_requests_succeeded_total")
    failed = sum(v for (n, _), v in m.items() if n == "radixgate_requests_failed_total")
    internal = m.get(("radixgate_errors_total", "internal"), 0.0)
    scrape_failures = sum(v for (n, _), v in m.items() if n == "radixgate_scrape_failures_total")
    warm = next((mb for c, mb in samples if c >= warm_up), samples[0][1])
    end, peak = samples[-1][1], max(mb for _, mb in samples)
    bad_status = sum(v for k, v in outcomes.items() if k.split()[-1] in ("500", "-1"))
    figures = {"cases": count, "heavy_cases": len(heavy_cases()) * args.heavy_repeats, "caps": args.caps,
               "elapsed_s": round(elapsed, 1), "outcomes": dict(sorted(outcomes.items())),
               "rss_mb": {"after_warm_up": round(warm, 1), "end": round(end, 1), "peak": round(peak, 1),
                          "growth": round(end - warm, 1)},
               "accepted": accepted, "succeeded": succeeded, "failed": failed, "internal_errors": internal,
               "scrape_failures": scrape_failures, "status_500_or_cut": bad_status}
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    ok = (accepted == succeeded + failed and internal == 0 and bad_status == 0
          and end - warm < args.max_growth_mb and outcomes.get("final good request 200") == 1)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
