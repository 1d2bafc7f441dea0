"""Misbehaving workers against the real proxy (Hypothesis): the worker side, as test_fuzz_inputs.py
fuzzes the client side.

One proxy (HTTP + its scraper) in front of one ``BrokenWorker`` (tests/fixtures/broken_worker.py)
runs on its own uvloop loop in a thread; Hypothesis draws what the worker answers
(tests/fixtures/worker_faults.py): status lines, heads, framings, bodies, SSE streams, scrape
answers. Plain blocking clients then ask the proxy. Every case must end in an outcome the case
allows — 200 with a whole JSON answer or a stream that ends explicitly, the worker's own 4xx, or
502 / 504 (429 for a busy worker) — never a 500, never a hang past the deadline, never a crash;
a scrape of any answer must not raise. After the cases the proxy still serves, no request was an
"internal" error and accepted = succeeded + failed. Caps are small here (``SMALL_CAPS``) so the
bodies that exceed them stay cheap. Cases and outcomes are tallied and printed at the end of the
module (``-s`` shows them); loadtests/fuzz_worker_rss.py runs the same cases against a
``radixgate serve`` process and reports its memory.
"""

from __future__ import annotations

import http.client
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from prometheus_client import CollectorRegistry

from proxy.app import App
from proxy.config import load
from tests.fixtures.broken_worker import BrokenWorker
from tests.fixtures.loop_thread import LoopThread, metrics_by_cause
from tests.fixtures.worker_faults import SMALL_CAPS, Case, http_answers, scrape_answers, sse_answers


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
TRIED: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
# Cases whose answer was whole yet came back 504 after the proxy's deadline had passed: the deadline
# held (the property), the machine ran past it (a busy CI core: once in ~1,100 cases). Kept rare below.
STALLED: list[float] = []
CLIENT_TIMEOUT_S = 10.0  # far past the proxy's own deadline (0.6 s): reaching it is a hang
PROXY_SETTINGS: dict[str, Any] = {
    "server.port": 0, "server.admin_port": 0, "health.interval_s": 0, "scrape.interval_s": 0,
    "health.timeout_s": 0.2, "health.eject_after_failures": 1_000_000,  # the one worker stays in
    "upstream.total_timeout_s": 0.6, "upstream.first_byte_timeout_s": 0.25, "upstream.idle_timeout_s": 0.25,
    "upstream.keepalive_timeout_s": 0.0,  # no reuse: each case's answer meets a fresh connection
    "telemetry.log_requests": False, **SMALL_CAPS,
}
DEADLINE_S = PROXY_SETTINGS["upstream.total_timeout_s"]


class Stack(LoopThread):
    """A broken worker and a proxy on a private uvloop loop in a background thread."""

    def __init__(self) -> None:
        super().__init__("fuzz-workers")
        self.app: App | None = None
        self.worker: BrokenWorker | None = None

    async def _start(self) -> None:
        self.worker = await self._stack.enter_async_context(BrokenWorker.running())
        self.app = App(load(env={}, overrides={**PROXY_SETTINGS, "workers.static": [self.worker.url]}),
                       registry=CollectorRegistry())
        await self.app.start()
        self._stack.push_async_callback(self.app.stop, 2.0)

    async def _answer(self, path: str, case: Case) -> None:
        assert self.worker is not None
        self.worker.on(path, case.steps)

    def script(self, path: str, case: Case) -> None:
        self.call(self._answer(path, case))


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack() as s:
        yield s
        assert s.app is not None
        # The proxy still serves, answered nothing as "internal", and its books balance.
        s.call(_good_answers(s))
        assert request(s, "/generate", {"text": "still there?"})[0] == 200
        m = metrics(s)
        assert m.get(("radixgate_errors_total", "internal"), 0) == 0, m
        accepted = sum(v for (n, _), v in m.items() if n == "radixgate_requests_accepted_total")
        done = sum(v for (n, _), v in m.items() if n in ("radixgate_requests_succeeded_total",
                                                           "radixgate_requests_failed_total"))
        assert accepted == done and accepted >= sum(TRIED[k] for k in TRIED if not k.startswith("scrape"))
        assert len(STALLED) <= 3, STALLED
    print("\nworker fuzz cases: " + ", ".join(f"{k}={v}" for k, v in sorted(TRIED.items()))
          + f" (total {sum(TRIED.values())}); outcomes: "
          + ", ".join(f"{k}={v}" for k, v in sorted(OUTCOMES.items())))


async def _good_answers(s: Stack) -> None:
    assert s.worker is not None
    s.worker.reset()


def request(s: Stack, path: str, body: dict[str, Any]) -> tuple[int, str, bytes, float]:
    """(status, content type, body, seconds the client waited)."""
    assert s.app is not None
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", s.app.http_port, timeout=CLIENT_TIMEOUT_S)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        got = resp.status, resp.getheader("Content-Type") or "", resp.read()  # IncompleteRead: a cut stream
        return (*got, time.monotonic() - start)
    finally:
        conn.close()


def metrics(s: Stack) -> dict[tuple[str, str], float]:
    assert s.app is not None
    return metrics_by_cause(s.app.admin_port, CLIENT_TIMEOUT_S)


def check_http(status: int, ctype: str, body: bytes, waited: float, case: Case) -> None:
    OUTCOMES[str(status)] += 1
    if status == 504 and waited >= DEADLINE_S and status not in case.allowed:
        STALLED.append(round(waited, 3))
    else:
        assert status in case.allowed, (status, body[:300], case.steps[:6])
    doc = json.loads(body)  # whatever the status, the client gets JSON
    if status >= 400:
        assert isinstance(doc, dict), body[:300]
    if status >= 500:  # the proxy's own error, in its own shape
        assert isinstance(doc.get("error"), dict) and doc["error"]["message"], body[:300]


def check_stream(status: int, ctype: str, body: bytes, waited: float, case: Case) -> None:
    if status != 200 or not ctype.startswith("text/event-stream"):
        check_http(status, ctype, body, waited, case)
        return
    OUTCOMES["200-stream"] += 1
    events = [e for e in body.split(b"\n\n") if e.startswith(b"data:")]
    assert events, body[:300]
    last = events[-1]
    # An explicit end: [DONE], or the worker's / the proxy's error event (then [DONE] when the proxy ended it).
    assert last == b"data: [DONE]" or b'"error"' in last[:30], (body[-300:], case.steps[:6])
    if len(events) >= 2 and b'"error"' in events[-2][:30]:
        err = json.loads(events[-2][5:])["error"]
        assert err["code"] in (502, 504) or err.get("type") != "upstream_error", err
        OUTCOMES[f"200-stream-error-{err['code']}"] += 1


@fuzz(450)
@given(case=http_answers())
def test_whole_answers_from_a_broken_worker_end_in_an_allowed_outcome(stack: Stack, case: Case) -> None:
    TRIED[case.kind] += 1
    stack.script("/generate", case)
    check_http(*request(stack, "/generate", {"text": "fuzz", "sampling_params": {"max_new_tokens": 2}}), case)


@fuzz(400)
@given(case=sse_answers())
def test_streams_from_a_broken_worker_end_explicitly(stack: Stack, case: Case) -> None:
    TRIED[case.kind] += 1
    stack.script("/generate", case)
    check_stream(*request(stack, "/generate", {"text": "fuzz", "stream": True}), case)


@fuzz(250)
@given(answers=scrape_answers())
def test_scrapes_of_any_answer_never_raise_and_a_good_one_is_taken(stack: Stack, answers: dict[str, Any]) -> None:
    assert stack.app is not None and stack.worker is not None
    TRIED["scrape"] += 1
    url = stack.worker.url
    for path, steps in answers.items():
        stack.worker.on(path, steps)
    stack.call(stack.app.scraper.poll(url))  # raising here would have ended the fleet's scrape loop
    stack.worker.reset()  # a good answer is taken at once: the failure left nothing behind
    stack.call(stack.app.scraper.poll(url))
    age = stack.app.workers.snapshot_age(url)
    assert age is not None and age < 5.0
