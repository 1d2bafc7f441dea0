"""``POST /v1/rerank`` of the simulated worker, as SGLang's ``serving_rerank`` answers it for a
cross-encoder (a worker started with ``--is-embedding``).

SGLang pairs the query with each document (``[query, document]``, tokenized as one prompt whose
first tokens are the query's) and scores every pair as an embedding request; it answers a list of
``{"score", "index", "meta_info"}`` (``"document"`` too with ``return_documents``), highest score
first, the first ``top_n`` when given. Here each pair is one prefill-only engine request (the
query's tokens then the document's: pairs of one query share that prefix in the radix cache), its
score a function of the pair's tokens in [0, 1), its meta_info the engine's (prompt and cached
tokens). A query or document empty or of another type, or no documents, is a 400 in OpenAI's
error shape, as SGLang's ``_validate_request``; a multimodal part list is read for its text (the
cross-encoder path keeps the text alone). A client that disconnects aborts every pair.
"""

from __future__ import annotations

from typing import Any

import xxhash
from aiohttp import web

from proxy.sim import prefill_only, protocol
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker


def add_routes(app: web.Application, worker: SimWorker) -> None:
    prefill_only.route(app, worker, "/v1/rerank", lambda body: _plan(worker, body),
                       lambda done, kept: _answer(worker, done, kept))


def _text(value: Any, field: str) -> str:
    """A query or document's text: a string, or the text parts of a content-part list."""
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        value = " ".join(str(p.get("text", "")) for p in value if p.get("type") == "text")
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(f"{field} cannot be empty or whitespace only")
    return value


def parse(body: Any) -> tuple[str, list[str], int | None, bool]:
    """(query, documents, top_n, return_documents) of a rerank body."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    query = _text(body.get("query"), "Query")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise BadRequest("Documents cannot be empty")
    texts = [_text(d, "Each document") for d in docs]
    top_n = body.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise BadRequest("Value error, parameter top_n should be larger than 0.")
    back = body.get("return_documents", False)
    if not isinstance(back, bool):
        raise BadRequest("return_documents must be a boolean")
    return query, texts, top_n, back


def score(ids: list[int]) -> float:
    """A pair's relevance, a function of its tokens alone, in [0, 1)."""
    return round(xxhash.xxh64_intdigest(repr(ids).encode()) / 2**64, 6)


def _plan(worker: SimWorker, body: Any) -> tuple[list[list[int]], None, tuple[list[str], int | None, bool]]:
    query, docs, top_n, back = parse(body)
    head = worker.encoder.encode(query)
    return [head + worker.encoder.encode(doc, False) for doc in docs], None, (docs, top_n, back)


def _answer(worker: SimWorker, done: list[SimRequest], kept: tuple[list[str], int | None, bool]) -> list[dict[str, Any]]:
    docs, top_n, back = kept
    cfg = worker.config
    ranked = []
    for i, req in enumerate(done):
        item: dict[str, Any] = {"score": score(req.input_ids), "index": i, "meta_info": protocol.meta_info(
            req, final=True, metrics=cfg.enable_metrics, wall_offset=worker.wall_offset, cached=not cfg.minimal_reports)}
        if back:
            item["document"] = docs[i]
        ranked.append(item)
    ranked.sort(key=lambda x: x["score"], reverse=True)
    return ranked[:top_n] if top_n else ranked
