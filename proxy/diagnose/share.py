"""A finished request as replicas tell each other (``diagnose.fleet_view``), so that behind several
proxies every replica's diagnosis reads the whole fleet's traffic, not its own share.

Why: behind 4 replicas each window held a quarter of the requests, and its cache replay, shadow
policies and latency percentiles were of that quarter (on the GPU fleet a replica's shadow replay
of its quarter read 34% reuse captured where the fleet captured 74%): the verdict could not be
trusted, and said so (``missing_signals``). Each record rides on the peer link's next message
(``proxy/peers.py``, field ``finished``).

Clocks: each process has its own monotonic clock, so absolute marks mean nothing to a peer. A
record travels as its age when written (seconds since it was received) and every later mark as an
offset from ``received``; the receiver places it on its own clock at ``now - age``. The link's
delay (a few ms) shifts the whole record, never its durations.

One record on the wire::

    {"worker": "http://w1:30000", "policy": "ttft", "outcome": "ok", "cause": null,
     "age": 1.83, "marks": [0.0, 0.001, 0.35, 0.35, 0.36, 1.2, 1.2], "hold": 0.0,
     "gaps": [0.02, ...], "engine": [0.1, 0.3, 1.1], "tokens": [2176, 2048, 32],
     "blocks": [<u64>, ...], "block_tokens": 16, "estimated_prompt_tokens": 2176,
     "text": false, "predicted_cached": 2048}

``marks``: admitted, dispatched, upstream_headers, first_byte, first_token, last_token, done (null
where unset); ``engine``: the worker's own queue time, first-token latency and end-to-end latency;
``tokens``: prompt, cached, completion as the worker reported them (null: not reported).
Bounded: at most ``MAX_GAPS`` token gaps (a longer answer sends an even sample of them with its
largest kept), ``MAX_BLOCKS`` block hashes, ``MAX_TEXT`` characters per string, and every time
within ``MAX_SPAN_S``. ``from_wire`` refuses anything else with ``BadRequest`` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from proxy.diagnose.window import RequestRecord
from proxy.errors import BadRequest
from proxy.timing import RequestTiming
from proxy.workers.scrape import MAX_DP

MAX_GAPS = 1024
MAX_BLOCKS = 4096
MAX_TEXT = 2048
MAX_SPAN_S = 86400.0
_U64 = 1 << 64
_MARKS = ("admitted", "dispatched", "upstream_headers", "first_byte", "first_token", "last_token", "done")


def to_wire(record: RequestRecord, now: float) -> dict[str, Any]:
    """``record`` as a JSON-able object, its age taken at clock time ``now``."""
    t = record.timing
    return {
        "worker": record.worker, "policy": record.policy, "outcome": record.outcome, "cause": record.cause,
        "age": _bounded(now - t.received),
        "marks": [None if (m := getattr(t, name)) is None else _bounded(m - t.received) for name in _MARKS],
        "hold": _bounded(t.prefix_hold),
        "gaps": [_bounded(g) for g in _sample(t.token_gaps)],
        "engine": [None if x is None else _bounded(x)
                   for x in (t.worker_queue_time, t.worker_first_token_latency, t.worker_e2e_latency)],
        "tokens": [record.prompt_tokens, record.cached_tokens, record.completion_tokens],
        "blocks": list(record.block_hashes[:MAX_BLOCKS]), "block_tokens": record.block_tokens,
        "estimated_prompt_tokens": record.estimated_prompt_tokens, "text": record.text_prompt,
        "predicted_cached": record.predicted_cached_tokens, "dp_rank": record.dp_rank,
    }


def from_wire(item: Any, now: float, *, peer: str, where: str = "finished[0]") -> RequestRecord:
    """One wire record as a ``RequestRecord`` on our clock (received at ``now - age``)."""
    if not isinstance(item, Mapping):
        raise BadRequest(f"{where}: expected an object")
    worker = _text(item.get("worker"), f"{where}.worker")
    if not worker:
        raise BadRequest(f"{where}.worker: expected a worker URL")
    cause = item.get("cause")
    received = now - _time(item.get("age"), f"{where}.age")
    marks = _entries(item.get("marks"), f"{where}.marks", len(_MARKS))
    at = {name: None if m is None else received + _time(m, f"{where}.marks[{i}]")
          for i, (name, m) in enumerate(zip(_MARKS, marks, strict=True))}
    if at["done"] is None:
        raise BadRequest(f"{where}.marks[6]: a finished request has a done mark")
    gaps = [_time(g, f"{where}.gaps[{i}]") for i, g in enumerate(_list(item.get("gaps", []), f"{where}.gaps", MAX_GAPS))]
    engine = _entries(item.get("engine", [None] * 3), f"{where}.engine", 3)
    tokens = _entries(item.get("tokens", [None] * 3), f"{where}.tokens", 3)
    queue, first, e2e = (None if x is None else _time(x, f"{where}.engine[{i}]") for i, x in enumerate(engine))
    prompt, cached, completion = (_count(x, f"{where}.tokens[{i}]") for i, x in enumerate(tokens))
    blocks = _list(item.get("blocks", []), f"{where}.blocks", MAX_BLOCKS)
    for h in blocks:
        if type(h) is not int or not 0 <= h < _U64:
            raise BadRequest(f"{where}.blocks: expected unsigned 64-bit integers, got {h!r}")
    block_tokens = item.get("block_tokens", 16)
    if type(block_tokens) is not int or not 1 <= block_tokens < _U64:
        raise BadRequest(f"{where}.block_tokens: expected an integer >= 1, got {block_tokens!r}")
    text = item.get("text", False)
    if not isinstance(text, bool):
        raise BadRequest(f"{where}.text: expected true or false")
    dp_rank = item.get("dp_rank")
    if dp_rank is not None and not (type(dp_rank) is int and 0 <= dp_rank < MAX_DP):
        raise BadRequest(f"{where}.dp_rank: expected an integer in [0, {MAX_DP}), got {dp_rank!r}")
    timing = RequestTiming(received=received, **at, prefix_hold=_time(item.get("hold", 0.0), f"{where}.hold"),
                           token_gaps=gaps, worker_queue_time=queue, worker_first_token_latency=first,
                           worker_e2e_latency=e2e, prompt_tokens=prompt, cached_tokens=cached,
                           completion_tokens=completion)
    return RequestRecord(
        timing=timing, worker=worker, outcome=_text(item.get("outcome", "ok"), f"{where}.outcome") or "ok",
        prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion, block_hashes=tuple(blocks),
        block_tokens=block_tokens,
        estimated_prompt_tokens=_count(item.get("estimated_prompt_tokens", 0), f"{where}.estimated_prompt_tokens") or 0,
        policy=_text(item.get("policy", ""), f"{where}.policy"), text_prompt=text,
        predicted_cached_tokens=_count(item.get("predicted_cached"), f"{where}.predicted_cached"),
        cause=None if cause is None else _text(cause, f"{where}.cause"), peer=peer[:MAX_TEXT], dp_rank=dp_rank,
    )


def _sample(gaps: list[float]) -> list[float]:
    """At most ``MAX_GAPS`` of them: an even sample that keeps the largest (the worst stall)."""
    if len(gaps) <= MAX_GAPS:
        return gaps
    step = len(gaps) / (MAX_GAPS - 1)
    return [gaps[int(i * step)] for i in range(MAX_GAPS - 1)] + [max(gaps)]


def _bounded(x: float) -> float:
    return round(min(MAX_SPAN_S, max(0.0, x)), 6)


def _time(value: Any, field: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= MAX_SPAN_S:
        raise BadRequest(f"{field}: expected seconds in [0, {MAX_SPAN_S:g}], got {value!r}")
    return float(value)


def _count(value: Any, field: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < _U64:
        raise BadRequest(f"{field}: expected an integer >= 0 or null, got {value!r}")
    return value


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise BadRequest(f"{field}: expected a string of at most {MAX_TEXT} characters")
    return value


def _list(value: Any, field: str, most: int) -> list[Any]:
    if not isinstance(value, list) or len(value) > most:
        raise BadRequest(f"{field}: expected a list of at most {most} entries")
    return value


def _entries(value: Any, field: str, n: int) -> list[Any]:
    if not isinstance(value, list) or len(value) != n:
        raise BadRequest(f"{field}: expected a list of {n} entries")
    return value
