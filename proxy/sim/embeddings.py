"""``POST /v1/embeddings`` of the simulated worker, as SGLang 0.5.23 serves it (``--is-embedding``).

SGLang's ``serving_embedding`` turns the body into one engine request per input (``input``: a
string, a list of strings, token ids, a list of token-id lists, or multimodal
``{text, image, video}`` parts) and answers once all are done: ``{"object": "list", "data":
[{"object": "embedding", "embedding", "index"}], "model", "usage": {"prompt_tokens",
"total_tokens"}}``, with no cached-token details. An embedding is a prefill and nothing after it,
so each input runs here as a request of one output token: it queues, batches and hits the radix
cache like any prompt, and its answer comes at the end of its prefill. The vector is a function of
the prompt's tokens (the same text, the same vector), ``EMBEDDING_DIM`` long unless ``dimensions``
asks for fewer; ``encoding_format: "base64"`` packs it as little-endian float32. A client that
disconnects aborts every input still running; the rids are the body's (one string for one
input, a list for a batch), else fresh ones.
"""

from __future__ import annotations

import base64
import math
import struct
import uuid
from array import array
from typing import Any, TypeGuard

import xxhash
from aiohttp import web

from proxy.sim import prefill_only
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker

EMBEDDING_DIM = 64


def add_routes(app: web.Application, worker: SimWorker) -> None:
    prefill_only.route(app, worker, "/v1/embeddings", lambda body: _plan(worker, body),
                       lambda done, kept: _answer(worker, done, kept))


def _ids(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def prompts(body: Any, worker: SimWorker) -> tuple[list[list[int]], list[str]]:
    """The body's inputs as token-id prompts, and their rids."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    value = body.get("input")
    encode = worker.encoder.encode
    if isinstance(value, str):
        inputs = [encode(value)]
    elif _ids(value):
        inputs = [list(value)]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        inputs = [encode(v) for v in value]
    elif isinstance(value, list) and value and all(_ids(v) for v in value):
        inputs = [list(v) for v in value]
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        # multimodal parts: the text, and the media's reference standing in for its tokens
        inputs = [encode(" ".join(str(v[k]) for k in ("text", "image", "video") if v.get(k))) for v in value]
    else:
        raise BadRequest("input must be a string, a list of strings, token ids, a list of token-id lists, "
                         "or a list of {text, image, video} objects")
    if any(not ids for ids in inputs):
        raise BadRequest("input must not be empty")
    return inputs, rids_of(body, len(inputs))


def rids_of(body: dict[str, Any], n: int) -> list[str]:
    """The body's rids for its ``n`` inputs (one string for one input, a list for a batch), else
    fresh ones."""
    rid = body.get("rid")
    if isinstance(rid, str) and n == 1:
        return [rid]
    if isinstance(rid, list) and len(rid) == n and all(isinstance(r, str) for r in rid):
        return list(rid)
    if rid is None:
        return [uuid.uuid4().hex for _ in range(n)]
    raise BadRequest("rid must be a string for one input, or a list of strings, one per input")


def vector(ids: list[int], dim: int) -> list[float]:
    """A unit vector that is a function of the prompt's tokens alone."""
    data = array("q", ids).tobytes()
    raw = [xxhash.xxh64_intdigest(data, seed=i) / 2**63 - 1.0 for i in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]


def _encoded(values: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()
    return values


def _plan(worker: SimWorker, body: Any) -> tuple[list[list[int]], list[str], tuple[int, str]]:
    inputs, rids = prompts(body, worker)
    dim = body.get("dimensions")
    if dim is None:
        dim = EMBEDDING_DIM
    elif type(dim) is not int or not 0 < dim <= EMBEDDING_DIM:
        raise BadRequest(f"dimensions must be an integer in [1, {EMBEDDING_DIM}]")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("encoding_format must be 'float' or 'base64'")
    return inputs, rids, (dim, encoding)


def _answer(worker: SimWorker, done: list[SimRequest], kept: tuple[int, str]) -> dict[str, Any]:
    dim, encoding = kept
    tokens = sum(len(r.input_ids) for r in done)
    return {
        "data": [{"embedding": _encoded(vector(r.input_ids, dim), encoding), "index": i, "object": "embedding"}
                 for i, r in enumerate(done)],
        "model": worker.config.served_model_name,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                  "prompt_tokens_details": None, "reasoning_tokens": 0},
    }
