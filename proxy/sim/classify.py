"""``POST /v1/classify`` of the simulated worker, as SGLang's ``serving_classify`` answers it for a
sequence-classification model (a worker started with ``--is-embedding``).

SGLang sends ``input`` (a string, a list of strings, or one prompt's token ids) to the engine as
embedding requests, one per text, and turns each output (the class logits) into ``{"index",
"label", "probs", "num_classes"}``: the softmax of the logits, the label of the largest from the
model's ``id2label`` (``LABEL_i`` where the config names none). Its ``_validate_request`` refuses
an empty input, a text that is whitespace, a list mixing types and a negative token id, with a 400
in OpenAI's error shape. Here each text is one prefill-only engine request (it queues, batches and
hits the radix cache like any prompt) whose logits are a function of its tokens, over
``NUM_LABELS`` classes. A client that disconnects aborts every text.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from aiohttp import web

from proxy.sim import prefill_only
from proxy.sim.embeddings import rids_of, vector
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker

NUM_LABELS = 2


def add_routes(app: web.Application, worker: SimWorker) -> None:
    prefill_only.route(app, worker, "/v1/classify", lambda body: _plan(worker, body),
                       lambda done, _: _answer(worker, done))


def inputs(body: Any, worker: SimWorker) -> list[list[int]]:
    """The body's ``input`` as token-id prompts, refused as SGLang refuses it."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    value = body.get("input")
    if not value:
        raise BadRequest("Input cannot be empty")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise BadRequest("input must be a string, a list of strings, or token ids")
    if isinstance(value[0], str):
        for i, text in enumerate(value):
            if not isinstance(text, str):
                raise BadRequest("All items in input list must be strings")
            if not text.strip():
                raise BadRequest(f"Input at index {i} cannot be empty or whitespace only")
        return [worker.encoder.encode(text) for text in value]
    for i, token in enumerate(value):
        if type(token) is not int:
            raise BadRequest("All items in input list must be integers")
        if token < 0:
            raise BadRequest(f"Token ID at index {i} must be non-negative")
    return [list(value)]


def probs(ids: list[int]) -> list[float]:
    """The softmax of the prompt's class logits (a function of its tokens alone)."""
    logits = [4 * x for x in vector(ids, NUM_LABELS)]
    top = max(logits)
    exp = [math.exp(x - top) for x in logits]
    return [round(e / sum(exp), 6) for e in exp]


def _plan(worker: SimWorker, body: Any) -> tuple[list[list[int]], list[str], None]:
    prompts = inputs(body, worker)
    return prompts, rids_of(body, len(prompts)), None


def _answer(worker: SimWorker, done: list[SimRequest]) -> dict[str, Any]:
    tokens = sum(len(r.input_ids) for r in done)
    data = []
    for i, req in enumerate(done):
        p = probs(req.input_ids)
        data.append({"index": i, "label": f"LABEL_{p.index(max(p))}", "probs": p, "num_classes": len(p)})
    return {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": worker.config.served_model_name, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                      "prompt_tokens_details": None}}
