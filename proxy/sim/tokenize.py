"""``POST /tokenize`` and ``/detokenize`` (also under ``/v1/``) of the simulated worker, as SGLang
0.5.23's ``serving_tokenize`` answers them.

Tokenize: ``{"prompt": str | [str], "add_special_tokens": true}`` -> ``{"tokens", "count",
"max_model_len"}``, ``tokens`` and ``count`` a list each for a list of prompts. Detokenize:
``{"tokens": [int] | [[int]], "skip_special_tokens": true}`` -> ``{"text"}``, a list for a list;
an empty list decodes to "". Tokenizing only: no gate, no engine, nothing counted. A body of
another shape is a 400 in OpenAI's error shape, as SGLang's ``create_error_response``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.sim.protocol import BadRequest
from proxy.sim.server import SimWorker, error_response, read_json


def add_routes(app: web.Application, worker: SimWorker) -> None:
    async def tokenize(request: web.Request) -> web.Response:
        try:
            return web.json_response(tokenized(await read_json(request), worker))
        except BadRequest as e:
            return error_response(str(e), 400, openai=True)

    async def detokenize(request: web.Request) -> web.Response:
        try:
            return web.json_response(detokenized(await read_json(request), worker))
        except BadRequest as e:
            return error_response(str(e), 400, openai=True)

    for prefix in ("", "/v1"):
        app.router.add_post(prefix + "/tokenize", tokenize)
        app.router.add_post(prefix + "/detokenize", detokenize)


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, True)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be a boolean.")
    return value


def tokenized(body: Any, worker: SimWorker) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    special, prompt = _flag(body, "add_special_tokens"), body.get("prompt")
    encode = worker.encoder.encode
    limit = worker.engine.context_length
    if isinstance(prompt, str):
        ids = encode(prompt, special)
        return {"tokens": ids, "count": len(ids), "max_model_len": limit}
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        lists = [encode(p, special) for p in prompt]
        return {"tokens": lists, "count": [len(x) for x in lists], "max_model_len": limit}
    raise BadRequest("Invalid prompt type. Expected str or List[str].")


def _ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def detokenized(body: Any, worker: SimWorker) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    skip, tokens = _flag(body, "skip_special_tokens"), body.get("tokens")
    decode = worker.encoder.decode
    if isinstance(tokens, list) and tokens and all(isinstance(t, list) for t in tokens):
        if not all(_ids(t) for t in tokens):
            raise BadRequest("Invalid input: Sublist in 'tokens' must contain only integers.")
        return {"text": [decode(t, skip) for t in tokens]}
    if _ids(tokens):
        return {"text": decode(tokens, skip) if tokens else ""}
    raise BadRequest("Invalid tokens type. Expected List[int] or List[List[int]].")
