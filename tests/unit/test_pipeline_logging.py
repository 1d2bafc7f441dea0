"""The per-request JSON log line (no prompt text) and its batched writer."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from proxy.pipeline import CompletedRequest
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import Decision
from proxy.routing.prefix_key import build_route_request
from proxy.telemetry.logging import BatchedLineHandler, RequestLogger, request_fields
from proxy.timing import RequestTiming

SECRET = "my secret prompt about project zebra " * 10


def completed() -> CompletedRequest:
    req = GenerateRequest(dialect=Dialect.SGLANG, payload={"text": SECRET}, text=SECRET)
    route = build_route_request(req, block_tokens=16, chars_per_token=4.0, max_blocks=64)
    timing = RequestTiming(received=1.0, admitted=1.0, dispatched=1.001, upstream_headers=1.002,
                           first_byte=1.01, first_token=1.01, last_token=1.05, done=1.05,
                           token_gaps=[0.02, 0.02], prompt_tokens=90, cached_tokens=64, completion_tokens=3)
    return CompletedRequest(
        rid="r1", frontend="http", dialect="sglang", stream=True, worker="http://w1", status=200, outcome="ok",
        cause=None, retries=1, policy="round_robin", decision=Decision("http://w1", "rr"), route=route,
        admission="admitted", admission_wait=0.0, timing=timing, finish_reason="length")


def test_the_line_has_stages_tokens_and_a_prompt_hash_but_no_prompt_text() -> None:
    fields = request_fields(completed())
    line = json.dumps(fields)
    assert "zebra" not in line
    assert fields["prompt_hash"] and fields["prompt_blocks"] > 0
    assert fields["ttft_ms"] == 10.0 and fields["e2e_ms"] == 50.0 and fields["itl_mean_ms"] == 20.0
    assert (fields["prompt_tokens"], fields["cached_tokens"], fields["completion_tokens"]) == (90, 64, 3)
    assert (fields["worker"], fields["branch"], fields["retries"], fields["outcome"]) == ("http://w1", "rr", 1, "ok")


def logger_into(stream: io.StringIO, name: str) -> logging.Logger:
    log = logging.getLogger(name)
    log.handlers = [BatchedLineHandler(stream, max_delay_s=0.01)]
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def test_prompts_are_logged_only_when_asked() -> None:
    out = io.StringIO()
    RequestLogger(enabled=True, log_prompts=False, logger=logger_into(out, "t.quiet")).log(completed())
    RequestLogger(enabled=True, log_prompts=True, logger=logger_into(out, "t.loud")).log(completed())
    first, second = out.getvalue().splitlines()
    assert "zebra" not in first and "prompt" not in json.loads(first)
    assert "zebra" in json.loads(second)["prompt"]


async def test_lines_are_batched_and_flushed_within_the_delay() -> None:
    out = io.StringIO()
    log = logger_into(out, "t.batched")
    for i in range(3):
        log.info(json.dumps({"n": i}))
    assert out.getvalue() == ""  # buffered while the loop runs
    for _ in range(500):
        if out.getvalue():
            break
        await asyncio.sleep(0.005)
    assert [json.loads(line)["n"] for line in out.getvalue().splitlines()] == [0, 1, 2]


def test_a_full_buffer_is_written_at_once() -> None:
    out = io.StringIO()
    handler = BatchedLineHandler(out, max_bytes=10)
    handler.handle(logging.makeLogRecord({"msg": "0123456789abc"}))
    assert out.getvalue() == "0123456789abc\n"
