"""``POST /v1/score`` of the simulated worker, as SGLang's ``serving_score`` and its tokenizer
manager's ``score_request`` answer it.

Each item makes one prompt, ``query + item`` (``item + query`` with ``item_first``): text
concatenated and then tokenized, or token ids joined. Each runs as one prefill-only engine request
(items of one query share its prefix in the radix cache), and its score is the probability of each
of ``label_token_ids`` as the next token: here a function of the prompt's tokens and the label,
normalised over the labels with ``apply_softmax``, else summing below 1. The answer is
``{"scores": [[p per label] per item], "model", "usage": {"prompt_tokens", "total_tokens",
"completion_tokens": 0}, "object": "scoring"}``. No label ids, a label outside the vocabulary,
or a query and items of different kinds (text and token ids) is a 400 in OpenAI's error shape.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import xxhash
from aiohttp import web

from proxy.sim import prefill_only
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker


def add_routes(app: web.Application, worker: SimWorker) -> None:
    prefill_only.route(app, worker, "/v1/score", lambda body: _plan(worker, body), _answer)


def _ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)


def prompts(body: Any, worker: SimWorker) -> tuple[list[list[int]], list[int], bool]:
    """(each item's prompt, the label ids, apply_softmax) of a score body."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    labels = body.get("label_token_ids")
    if not _ids(labels):
        raise BadRequest("label_token_ids must be provided")
    for t in labels:
        if t >= worker.encoder.vocab_size:
            raise BadRequest(f"Token ID {t} is out of vocabulary (vocab size: {worker.encoder.vocab_size})")
    query, items, first = body.get("query"), body.get("items"), body.get("item_first", False)
    if isinstance(items, str):
        items = [items]
    if isinstance(query, str) and isinstance(items, list) and items and all(isinstance(i, str) for i in items):
        texts = [item + query if first else query + item for item in items]
        out = [worker.encoder.encode(t) for t in texts]
    elif _ids(query) and isinstance(items, list) and items and all(_ids(i) for i in items):
        out = [list(i) + list(query) if first else list(query) + list(i) for i in items]
    else:
        raise BadRequest("Invalid combination of query/items types for score_request.")
    return out, list(labels), bool(body.get("apply_softmax", False))


def scores(ids: list[int], labels: list[int], softmax: bool) -> list[float]:
    """Each label's probability as the next token after ``ids``: a function of both alone."""
    key = repr(ids).encode()
    raw = [(xxhash.xxh64_intdigest(key, seed=label) + 1) / 2**64 for label in labels]
    total = sum(raw) if softmax else sum(raw) + 1.0
    return [round(x / total, 6) for x in raw]


def _plan(worker: SimWorker, body: Any) -> tuple[list[list[int]], None, tuple[list[int], bool, str]]:
    items, labels, softmax = prompts(body, worker)
    return items, None, (labels, softmax, body.get("model") or worker.config.served_model_name)


def _answer(done: list[SimRequest], kept: tuple[list[int], bool, str]) -> dict[str, Any]:
    labels, softmax, model = kept
    tokens = sum(len(r.input_ids) for r in done)
    return {
        "scores": [scores(r.input_ids, labels, softmax) for r in done],
        "pooled_hidden_states": None,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0, "prompt_tokens_details": None},
        "object": "scoring",
    }
