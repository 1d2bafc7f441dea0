"""The tail, request by request: the slowest recent requests and where each one's time went (pure).

``GET /diagnosis/tail`` (``wiring.py``) answers "who is in my p95, and why" from the diagnosis
window: the ``n`` slowest requests by TTFT (or end to end), each cut into the parts its marks give,

* ``admission`` — received → admitted (the proxy's admission queue);
* ``routing`` — admitted → dispatched (prefix key, policy, a prefix hold, retries on other workers);
* ``worker_queue`` — the engine's own queue time, where it reports one (SGLang's
  ``meta_info.queue_time``);
* ``prefill`` — the rest of dispatch → first token: the engine's prefill and the network (for an
  answer not streamed, or one that never had a first token, dispatch → its end);
* ``decode`` — first token → last (``by=e2e`` only),

and the part that dominated it, with its rid and trace id (to find its log line and spans), worker,
policy, outcome and token counts. A request that ended without a first token (its client left, its
time ran out) counts by how long it waited, its TTFT's lower bound, as the diagnosis counts it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from proxy.diagnose.window import RequestRecord

BY = ("ttft", "e2e")
PARTS = ("admission", "routing", "worker_queue", "prefill", "decode")
MAX_N = 200


def parts(record: RequestRecord, *, e2e: bool) -> dict[str, float]:
    """The request's time cut at its marks, in seconds (parts it never reached are left out)."""
    t = record.timing
    out: dict[str, float] = {}
    if t.admitted is not None:
        out["admission"] = max(0.0, t.admitted - t.received)
        if t.dispatched is not None:
            out["routing"] = max(0.0, t.dispatched - t.admitted)
    first = t.first_token if t.first_token is not None else t.done  # unstreamed, or no first token: to its end
    if t.dispatched is not None and first is not None:
        upstream = max(0.0, first - t.dispatched)
        queue = min(upstream, t.worker_queue_time) if t.worker_queue_time is not None else None
        if queue is not None:
            out["worker_queue"] = queue
        out["prefill"] = upstream - (queue or 0.0)
    if e2e and t.first_token is not None and t.last_token is not None:
        out["decode"] = max(0.0, t.last_token - t.first_token)
    return out


def latency(record: RequestRecord, by: str) -> float | None:
    if by == "ttft":
        return record.ttft_evidence
    t = record.timing
    return max(0.0, t.done - t.received) if t.done is not None else None


def slowest(records: Sequence[RequestRecord], *, n: int, by: str, now: float) -> dict[str, Any]:
    """The ``n`` slowest of ``records`` by ``by`` (``ttft`` or ``e2e``), slowest first."""
    if by not in BY:
        raise ValueError(f"by: one of {', '.join(BY)}")
    timed = [(v, r) for r in records if (v := latency(r, by)) is not None]
    timed.sort(key=lambda vr: vr[0], reverse=True)
    rows = []
    dominant: Counter[str] = Counter()
    for value, r in timed[:n]:
        cut = parts(r, e2e=by == "e2e")
        top = max(cut, key=cut.__getitem__) if cut else None
        if top is not None:
            dominant[top] += 1
        rows.append({
            "rid": r.rid, "trace_id": r.trace_id, "worker": r.worker, "policy": r.policy, "peer": r.peer or None,
            "outcome": r.outcome, "cause": r.cause, "age_s": round(max(0.0, now - r.timing.received), 3),
            by + "_s": round(value, 4), "answered": r.timing.first_token is not None,
            "parts_s": {k: round(v, 4) for k, v in cut.items()}, "dominant": top,
            "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens,
            "predicted_cached_tokens": r.predicted_cached_tokens, "completion_tokens": r.completion_tokens,
        })
    return {"by": by, "requests_in_window": len(records), "timed": len(timed),
            "dominant": dict(dominant.most_common()), "requests": rows}
