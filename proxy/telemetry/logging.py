"""Process logging set-up and the one JSON line per finished request.

The request line carries every stage duration (milliseconds), token counts, where the request went
and how it ended. It never carries prompt text: the prompt is identified by its routing hash (the
last chained block hash, which names the whole hashed prefix) and its block count. Prompts are
logged only with ``telemetry.log_prompts: true`` and only when the frontend passes the text.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from proxy.records import CompletedRequest

REQUEST_LOGGER = "radixgate.requests"
# A caller may choose its rid (forwarded whole to the worker); the log line keeps its start only.
MAX_LOGGED_RID = 128


def setup_logging(level: str) -> None:
    """Plain stderr logging for the process; request lines go out as bare JSON, batched."""
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    requests = logging.getLogger(REQUEST_LOGGER)
    requests.addHandler(BatchedLineHandler(sys.stderr))
    requests.propagate = False


class BatchedLineHandler(logging.Handler):
    """One line per record (the message only), written in batches.

    A write per request line costs a system call per request; at thousands of requests per second
    that was a measurable share of the proxy's CPU. Lines are buffered and written together at most
    ``max_delay_s`` later (or once ``max_bytes`` accumulate); with no running event loop each line
    is written at once. ``flush()`` (also called by ``logging.shutdown`` at exit) empties the buffer.
    """

    def __init__(self, stream: TextIO, *, max_delay_s: float = 0.1, max_bytes: int = 65536) -> None:
        super().__init__()
        self.stream = stream
        self.max_delay_s = max_delay_s
        self.max_bytes = max_bytes
        self._lines: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = record.getMessage()
        except Exception:
            self.handleError(record)
            return
        self.add_line(line)

    def add_line(self, line: str) -> None:
        self._lines.append(line)
        self._size += len(line) + 1
        if self._size >= self.max_bytes:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.max_delay_s, self.flush)
            except RuntimeError:
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._lines:
            return
        lines, self._lines, self._size = self._lines, [], 0
        self.acquire()
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        finally:
            self.release()


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000.0, 3)


def request_fields(done: CompletedRequest) -> dict[str, Any]:
    """The request log line as a dict (tests read it; ``RequestLogger`` serialises it).

    Built once per request on the event loop: durations come from ``RequestTiming.stages()`` (one
    pass over the marks) and are converted inline rather than through a helper call each.
    """
    t = done.timing
    route, decision = done.route, done.decision
    hashes = route.block_hashes if route is not None else ()
    stages = t.stages()
    fields: dict[str, Any] = {
        "rid": done.rid if len(done.rid) <= MAX_LOGGED_RID else done.rid[:MAX_LOGGED_RID] + "...",
        "frontend": done.frontend,
        "dialect": done.dialect,
        "stream": done.stream,
        "worker": done.worker,
        "dp_rank": done.dp_rank,
        "status": done.status,
        "outcome": done.outcome,
        "cause": done.cause,
        "retries": done.retries,
        "policy": done.policy,
        "branch": decision.branch if decision else None,
        "matched_blocks": decision.matched_blocks if decision else None,
        "admission": done.admission,
        "finish_reason": done.finish_reason,
        "trace_id": done.trace.trace_id if done.trace is not None else None,
        "prompt_hash": f"{hashes[-1]:016x}" if hashes else None,
        "prompt_blocks": len(hashes) if route else None,
        "est_prompt_tokens": route.prompt_tokens if route else None,
        "prompt_tokens": t.prompt_tokens,
        "cached_tokens": t.cached_tokens,
        "completion_tokens": t.completion_tokens,
        "chunks": len(t.token_gaps) + (1 if t.first_token is not None else 0),
        "upstream_ttfb_ms": None,  # filled from stages below (same value, same key order as before)
        "upstream_ttft_ms": _ms(t.upstream_ttft),
        "worker_ttft_ms": _ms(t.worker_first_token_latency),
        "worker_e2e_ms": _ms(t.worker_e2e_latency),
    }
    for name, value in stages.items():
        fields[name + "_ms"] = None if value is None else round(value * 1000.0, 3)
    return fields


class RequestLogger:
    def __init__(self, *, enabled: bool, log_prompts: bool = False,
                 logger: logging.Logger | None = None) -> None:
        self.enabled = enabled
        self.log_prompts = log_prompts
        self._log = logger or logging.getLogger(REQUEST_LOGGER)

    def log(self, done: CompletedRequest) -> None:
        if not self.enabled or not self._log.isEnabledFor(logging.INFO):
            return
        fields = request_fields(done)
        if self.log_prompts and done.route is not None and done.route.prompt_text:
            fields["prompt"] = done.route.prompt_text
        line = json.dumps(fields, separators=(",", ":"))
        sink = self._sink()
        if sink is not None:
            sink.add_line(line)  # the line is all that handler writes: skip building a LogRecord
        else:
            self._log.info(line)

    def _sink(self) -> BatchedLineHandler | None:
        """The logger's only destination when that is a BatchedLineHandler (as ``setup_logging`` sets)."""
        handlers = self._log.handlers
        if len(handlers) == 1 and not self._log.propagate and isinstance(handlers[0], BatchedLineHandler):
            return handlers[0]
        return None
