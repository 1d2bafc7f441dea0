"""The HTTP frontend (aiohttp): SGLang native and OpenAI endpoints, and the admin endpoints.

Public port: ``POST /generate``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/messages`` (Anthropic), ``POST /v1/responses`` (stream and non-stream; the stored responses' endpoints are
``frontends/responses_api.py``'s), ``GET /v1/models`` (union of the workers' models), ``GET /v1/models/{id}``,
``GET /health`` (the proxy is up), ``GET /ready`` (at least one healthy worker, not draining), and
SGLang's own server endpoints (``frontends/sglang_server.py``: ``/health_generate``, model and server
info, ``/flush_cache`` — with API keys only).
Admin port (loopback by default): ``GET /metrics``, ``GET /workers``, ``/flush_cache``; other admin routes (e.g.
``/diagnosis``) are added by their owners through ``App.add_admin_route``.

The body is parsed once into a ``GenerateRequest`` (the raw bytes ride along and are forwarded as
received); everything after that is the shared ``Pipeline``. Streams are relayed chunk by chunk.
Errors answer in the caller's dialect (``errors.to_body``), with ``Retry-After`` where it helps.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import HttpVersion11, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy import anthropic, responses, safejson
from proxy.config import Config
from proxy.errors import (
    BadRequest,
    MethodNotAllowed,
    ModelNotFound,
    PayloadTooLarge,
    RadixgateError,
    RouteNotFound,
    Unauthorized,
    UnsupportedEncoding,
    to_body,
)
from proxy.frontends import sglang_server
from proxy.frontends.responses_api import ResponsesFront
from proxy.frontends.sampling import check_sampling
from proxy.limits import RequestTimeout
from proxy.pipeline import Pipeline, not_served
from proxy.request import Dialect, GenerateRequest
from proxy.security import KEY_HINT
from proxy.tracecontext import from_headers
from proxy.workers.membership import Membership
from proxy.workers.upstream import UpstreamPool

log = logging.getLogger("radixgate.http")
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
FRONTEND = "http"


def error_response(err: RadixgateError, dialect: Dialect | None) -> web.Response:
    body = to_body(err, dialect=dialect.error_style if dialect else "openai")
    headers = {"Retry-After": str(max(1, math.ceil(err.retry_after)))} if err.retry_after else {}
    if isinstance(err, UnsupportedEncoding):
        headers["Accept-Encoding"] = "identity"  # RFC 9110 §15.5.16: what the client may send instead
    return web.json_response(body.payload, status=body.status, headers=headers or None)


def _prompt_size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_prompt_size(v) for v in value) if value and not isinstance(value[0], int) else len(value)
    return 0


def _first(value: Any) -> Any:
    """A batch's first prompt: routing keys on it (SGLang routes a batch as one request too)."""
    if isinstance(value, list) and value and isinstance(value[0], str | list):
        return value[0]
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
MAX_TOKEN_ID = 2**31 - 1  # token ids are int32 everywhere (SGLang, radixgate.v1)


def _valid_unicode(payload: Any) -> bool:
    """False when a string in ``payload`` holds a lone surrogate (a worker would fail encoding it)."""
    try:
        json.dumps(payload, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True


def _check_token_ids(field: str, value: Any) -> None:
    for ids in value if value and isinstance(value[0], list) else [value]:
        if not all(type(i) is int and 0 <= i <= MAX_TOKEN_ID for i in ids):
            raise BadRequest(f"{field}: token ids must be integers in [0, {MAX_TOKEN_ID}]")


# Where each dialect's prompt is (the OpenAI completions' ``prompt`` unless named here).
_PROMPT_FIELDS = {Dialect.SGLANG: ("text", "input_ids"), Dialect.EMBEDDINGS: ("input",),
                  Dialect.CLASSIFY: ("input",)}
# What each prompt field may hold: a batch is a list of the single form (token ids: a list of lists).
_PROMPT_SHAPES = {"text": ("text",), "input_ids": ("ids",), "prompt": ("text", "ids"), "input_embeds": ("any",),
                  "input": ("text", "ids", "parts")}


def _check_prompt_shape(field: str, value: Any) -> None:
    """``input_ids: ["1"]`` is no token-id prompt, and ``text: [1, 2]`` no text prompt."""
    allowed = _PROMPT_SHAPES.get(field, ("any",))
    if "any" in allowed:
        return
    if isinstance(value, str):
        ok = "text" in allowed
    elif "parts" in allowed and all(isinstance(v, dict) for v in value):
        # SGLang's multimodal embedding inputs: [{"text": ..., "image": ..., "video": ...}, ...] (other
        # keys pass: the worker's model ignores them)
        ok = all(v.get(k) is None or isinstance(v.get(k), str) for v in value for k in ("text", "image", "video"))
    elif all(type(i) is int for i in value):
        ok = "ids" in allowed
    elif all(isinstance(v, str) for v in value):
        ok = "text" in allowed
    else:
        ok = "ids" in allowed and all(isinstance(v, list) and v and all(type(i) is int for i in v) for v in value)
    if not ok:
        want = " or ".join({"text": "text (a string, or a list of strings)",
                            "ids": "token ids (a list of integers, or a list of such lists)",
                            "parts": "a list of objects whose text, image and video are strings"}[a] for a in allowed)
        raise BadRequest(f"{field}: must be {want}")


def _rerank_content(field: str, value: Any) -> None:
    """A rerank query or document: a non-empty string, or a non-empty list of content-part objects
    (SGLang's multimodal ``text`` / ``image_url`` / ``video_url`` parts)."""
    if isinstance(value, str):
        if not value.strip():
            raise BadRequest(f"{field}: must not be empty")
    elif not (isinstance(value, list) and value and all(isinstance(p, dict) for p in value)):
        raise BadRequest(f"{field}: must be a non-empty string or a non-empty list of content parts")


def _rerank_query(payload: dict[str, Any]) -> str | None:
    """A rerank body checked; its text query, which routing keys on (every pair the worker
    prefills starts with it: the prefix its documents share), or None for a multimodal one
    (routed on load)."""
    query, docs = payload.get("query"), payload.get("documents")
    _rerank_content("query", query)
    if not isinstance(docs, list) or not docs:
        raise BadRequest("documents: required, a non-empty list")
    for i, doc in enumerate(docs):
        _rerank_content(f"documents[{i}]", doc)
    top_n = payload.get("top_n")
    if top_n is not None and (type(top_n) is not int or top_n < 1):
        raise BadRequest("top_n: must be an integer of at least 1")
    return query if isinstance(query, str) else None


def _score_query(payload: dict[str, Any]) -> str | list[int] | None:
    """A score body checked; its query, which routing keys on (text or token ids: every item's
    prompt starts with it), or None with ``item_first`` (the items lead: routed on load)."""
    query, items, labels = payload.get("query"), payload.get("items"), payload.get("label_token_ids")
    if isinstance(query, str):
        if not query:
            raise BadRequest("query: must not be empty")
        text_items = isinstance(items, str) or (isinstance(items, list) and bool(items)
                                                and all(isinstance(i, str) for i in items))
        if not text_items:
            raise BadRequest("items: with a text query, a string or a non-empty list of strings")
    elif isinstance(query, list) and query and all(type(t) is int for t in query):
        _check_token_ids("query", query)
        if not (isinstance(items, list) and items and all(isinstance(i, list) and i for i in items)):
            raise BadRequest("items: with a token-id query, a non-empty list of token-id lists")
        _check_token_ids("items", items)
    else:
        raise BadRequest("query: must be a non-empty string or a non-empty list of token ids")
    if not (isinstance(labels, list) and labels):
        raise BadRequest("label_token_ids: required, a non-empty list of token ids")
    _check_token_ids("label_token_ids", labels)
    for flag in ("apply_softmax", "item_first"):
        if not isinstance(payload.get(flag, False), bool):
            raise BadRequest(f"{flag}: must be true or false")
    return None if payload.get("item_first") else query


def _forwardable(name: str, value: str) -> str:
    """A header value passed on to a worker: visible ASCII, spaces and tabs (credentials are
    token68 / base64, RFC 9110 §11). aiohttp hands header bytes over decoded as UTF-8: anything
    beyond ASCII would reach the worker re-encoded (other bytes than the client sent), and what
    is not Latin-1 could not be written at all (it was a 500)."""
    if not value.isascii() or any((c < " " and c != "\t") or c == "\x7f" for c in value):
        raise BadRequest(f"{name}: header must be printable ASCII text")
    return value


def parse_request(dialect: Dialect, raw: bytes, headers: Any, cfg: Config) -> GenerateRequest:
    """The caller's bytes → a ``GenerateRequest``; ``BadRequest`` / ``PayloadTooLarge`` name the field."""
    try:
        payload = safejson.loads(raw)
    except ValueError as e:
        raise BadRequest(f"malformed JSON body: {e}") from None
    if not isinstance(payload, dict):
        raise BadRequest("the body must be a JSON object")
    model = payload.get("model", "")
    if not isinstance(model, str):
        raise BadRequest("model: must be a string")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("stream: must be true or false")
    stream = stream and dialect.streams  # embeddings, rankings, scores: answered whole (SGLang's requests have no stream)
    rid = payload.get(dialect.rid_field)
    if dialect is Dialect.RESPONSES:
        rid = None if rid is None else responses.check_id("request_id", rid)
    elif rid is not None and not (isinstance(rid, str) or (isinstance(rid, list) and all(isinstance(r, str) for r in rid))):
        raise BadRequest("rid: must be a string (a list of strings for a batch)")
    params = payload.get("sampling_params")
    if params is not None and not (isinstance(params, dict)
                                   or (isinstance(params, list) and params and all(isinstance(p, dict) for p in params))):
        raise BadRequest("sampling_params: must be an object (a list of objects for a batch)")
    # The sampling table gRPC requests are checked against too (frontends/sampling.py).
    if dialect is Dialect.SGLANG:
        for i, one in enumerate(params if isinstance(params, list) else [params] if params else []):
            check_sampling(one, f"sampling_params[{i}]." if isinstance(params, list) else "sampling_params.")
    elif not dialect.prefill_only:  # nothing is sampled there
        check_sampling(payload, "")
    if b"\\u" in raw and _SURROGATE_ESCAPE.search(raw) and not _valid_unicode(payload):
        raise BadRequest("the body holds a lone UTF-16 surrogate (\\ud800-\\udfff escape): not valid Unicode text")
    text: str | None = None
    ids: list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    if dialect is Dialect.CHAT:
        msgs = payload.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("messages: required, a non-empty list of message objects")
        for i, m in enumerate(msgs):
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not role:
                raise BadRequest(f"messages[{i}].role: must be a non-empty string")
            if content is not None and not (isinstance(content, str) or (
                    isinstance(content, list) and all(isinstance(part, dict) for part in content))):
                raise BadRequest(f"messages[{i}].content: must be a string or a list of content parts")
        messages, size = msgs, len(raw)
    elif dialect is Dialect.MESSAGES:
        messages, size = anthropic.conversation(payload), len(raw)
    elif dialect is Dialect.RESPONSES:
        messages, size = responses.conversation(payload), len(raw)
        if payload.get("previous_response_id") is not None:
            responses.check_id("previous_response_id", payload["previous_response_id"])
    elif dialect is Dialect.RERANK:
        text, size = _rerank_query(payload), len(raw)
    elif dialect is Dialect.SCORE:
        query, size = _score_query(payload), len(raw)
        if isinstance(query, list):
            ids = query
        else:
            text = query
    else:
        names = _PROMPT_FIELDS.get(dialect, ("prompt",))
        given = [n for n in names if payload.get(n) is not None]
        if dialect is Dialect.SGLANG and payload.get("input_embeds") is not None:
            given.append("input_embeds")
        if len(given) != 1:
            raise BadRequest(f"{' or '.join(names)}: exactly one prompt field is required")
        value = payload[given[0]]
        if not isinstance(value, str | list) or (isinstance(value, list) and not value):
            raise BadRequest(f"{given[0]}: must be a string, a list of token ids, or a non-empty list of those")
        _check_prompt_shape(given[0], value)
        size = _prompt_size(value)
        head = _first(value)
        if isinstance(head, str):
            text = head
        elif isinstance(head, list) and all(isinstance(i, int) for i in head):
            ids = head
            _check_token_ids(given[0], value)
        elif given[0] == "input":  # multimodal embedding parts: routed on load alone, sized by the body
            size = len(raw)
        elif given[0] != "input_embeds":
            raise BadRequest(f"{given[0]}: must be text or token ids")
    if size > cfg.limits.max_prompt_chars:
        raise PayloadTooLarge(f"prompt: {size} characters is over the limit of {cfg.limits.max_prompt_chars}")
    priority_raw = headers.get(cfg.admission.priority_header)
    try:
        priority = int(priority_raw) if priority_raw is not None else 0
    except ValueError:
        raise BadRequest(f"{cfg.admission.priority_header}: header must be an integer") from None
    fwd = {"authorization": _forwardable("Authorization", headers["Authorization"])} if "Authorization" in headers else {}
    if not fwd and "x-api-key" in headers:
        # Anthropic's API documents x-api-key (curl, older SDKs); SGLang's --api-key checks the bearer.
        fwd = {"authorization": "Bearer " + _forwardable("x-api-key", headers["x-api-key"])}
    return GenerateRequest(
        dialect=dialect, payload=payload, model=model, stream=stream, text=text, input_ids=ids,
        messages=messages, rid=rid if isinstance(rid, str) and rid else None,
        session_key=headers.get(cfg.routing.session_header), priority=priority, frontend=FRONTEND,
        headers=fwd, body=raw, trace=from_headers(lambda name: _joined(headers, name)))


def _joined(headers: Any, name: str) -> str | None:
    """A header's value, a repeated one's joined with commas (RFC 9110 §5.3)."""
    if name not in headers:
        return None
    return ",".join(headers.getall(name)) if hasattr(headers, "getall") else str(headers[name])


@web.middleware
async def json_route_errors(request: web.Request,
                            handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """An unknown path or method answered in the OpenAI error shape, with the methods the path takes."""
    try:
        return await handler(request)
    except web.HTTPMethodNotAllowed as e:
        resp = error_response(MethodNotAllowed(f"{request.method} {request.path[:200]}: allowed "
                                               f"{', '.join(sorted(e.allowed_methods))}"), None)
        resp.headers["Allow"] = ", ".join(sorted(e.allowed_methods))
        return resp
    except web.HTTPNotFound:
        return error_response(RouteNotFound(f"{request.method} {request.path[:200]}: no such endpoint"), None)


def build_public_app(cfg: Config, pipeline: Pipeline, upstream: UpstreamPool, ready: Callable[[], bool], *,
                     authorized: Callable[[web.Request], bool] | None = None) -> web.Application:
    """The public port. ``authorized``: whether a request presents an accepted API key, None when the
    port checks none (the key itself is checked by ``security.guard_http_app``'s middleware; this is
    for the ``Expect`` handler, which runs before it, and ``/flush_cache``, served only with keys)."""
    app = web.Application(client_max_size=cfg.limits.max_body_bytes, middlewares=[json_route_errors])
    clock = pipeline.clock
    stored = ResponsesFront(pipeline, upstream, lambda err: error_response(err, Dialect.RESPONSES))

    async def serve(request: web.Request, dialect: Dialect) -> web.StreamResponse:
        received = clock.now()
        try:
            encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
            if encoding not in ("", "identity"):
                # Not inflated here (the server's parser runs with auto_decompress off, limits.py):
                # a request body is JSON, and inflating a bomb only to refuse it cost 1-2 s of loop time.
                raise UnsupportedEncoding(f"Content-Encoding: {encoding[:40]!r} is not accepted; "
                                          "send the JSON body uncompressed (identity)")
            if request.content_length is not None and request.content_length > cfg.limits.max_body_bytes:
                raise PayloadTooLarge(f"body: {request.content_length} bytes is over the limit of "
                                      f"{cfg.limits.max_body_bytes}")
            try:
                if request.content.is_eof():  # the whole body already arrived: no timer to arm
                    raw = await request.read()
                else:
                    async with clock.timeout_at(clock.now() + cfg.limits.body_timeout_s):
                        raw = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise PayloadTooLarge(f"body: over the limit of {cfg.limits.max_body_bytes} bytes") from None
            except TimeoutError:
                raise RequestTimeout(f"body: not received within {cfg.limits.body_timeout_s:g} s") from None
            req = parse_request(dialect, raw, request.headers, cfg)
            await stored.pin(req, request)
        except RadixgateError as e:
            pipeline.reject(FRONTEND, dialect.value, e, received)
            return error_response(e, dialect)
        resp: web.StreamResponse | None = None
        try:
            async with pipeline.exchange(req, received=received) as ex:
                if not ex.streaming:
                    stored.answered(req, ex.worker, ex.status, ex.meta.response_id, ex.rid)
                    return web.Response(status=ex.status, body=ex.body, content_type=ex.content_type)
                resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
                await resp.prepare(request)
                async for chunk in ex.chunks():
                    if ex.last_chunk:
                        await resp.write_eof(chunk)  # the last event and the stream's end in one write
                    else:
                        await resp.write(chunk)
                await resp.write_eof()  # no-op unless the stream ended without a last event
                if ex.error is None:
                    stored.answered(req, ex.worker, ex.status, ex.meta.response_id, ex.rid)
                return resp
        except RadixgateError as e:
            return error_response(e, dialect)
        except ConnectionResetError:
            if resp is None:
                raise
            return resp  # the client left mid-stream (recorded as a disconnect): nothing to log
        except Exception:
            if resp is not None:
                raise  # mid-stream: aiohttp closes the connection
            log.exception("internal error serving %s", request.path)
            return error_response(RadixgateError("internal error"), dialect)

    def expect(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse | None]]:
        """``Expect: 100-continue``: a request without an accepted key (when keys are checked), or with
        a body declared over the limit (or compressed), is refused with its final status at once, no
        ``100 Continue`` first (RFC 9110 §10.1.1: the client need not send
        a body it would send for nothing); the connection closes, the unsent body unread."""
        async def handler(request: web.Request) -> web.StreamResponse | None:
            value = request.headers.get("Expect", "")
            if request.version != HttpVersion11:
                return None
            if value.lower() != "100-continue":
                raise web.HTTPExpectationFailed(text=f"Unknown Expect: {value[:40]}")
            err: RadixgateError | None = None
            encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
            if authorized is not None and not authorized(request):
                err = Unauthorized(f"missing or invalid API key; {KEY_HINT}")
            elif request.content_length is not None and request.content_length > cfg.limits.max_body_bytes:
                err = PayloadTooLarge(f"body: {request.content_length} bytes is over the limit of "
                                      f"{cfg.limits.max_body_bytes}")
            elif encoding not in ("", "identity"):
                err = UnsupportedEncoding(f"Content-Encoding: {encoding[:40]!r} is not accepted; "
                                          "send the JSON body uncompressed (identity)")
            if err is not None:
                pipeline.reject(FRONTEND, dialect.value, err, clock.now())
                resp = error_response(err, dialect)
                if isinstance(err, Unauthorized):
                    resp.headers["WWW-Authenticate"] = 'Bearer realm="radixgate"'
                resp.force_close()
                return resp
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            request.writer.output_size = 0  # as aiohttp's own handler: the response proper starts next
            return None
        return handler

    def route(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await serve(request, dialect)
        return handler

    # A model card's ``created`` (OpenAI: Unix seconds): when this proxy started serving, as SGLang
    # stamps its own cards; one value for the process, so a client comparing listings sees no churn.
    created = int(time.time())

    def card(model: str) -> dict[str, object]:
        return {"id": model, "object": "model", "created": created, "owned_by": "radixgate", "root": model}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [card(m) for m in pipeline.models()]})

    async def model(request: web.Request) -> web.Response:
        """``GET /v1/models/{id}`` (the openai SDK's ``models.retrieve``); ids may hold ``/``."""
        name = request.match_info["model"]
        served = pipeline.models()
        if name not in served:
            return error_response(ModelNotFound(not_served(name, served)), Dialect.CHAT)
        return web.json_response(card(name))

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readiness(request: web.Request) -> web.Response:
        ok = ready()
        return web.json_response({"ready": ok}, status=200 if ok else 503)

    app.router.add_post("/generate", route(Dialect.SGLANG), expect_handler=expect(Dialect.SGLANG))
    app.router.add_put("/generate", route(Dialect.SGLANG), expect_handler=expect(Dialect.SGLANG))
    app.router.add_post("/v1/completions", route(Dialect.COMPLETIONS), expect_handler=expect(Dialect.COMPLETIONS))
    app.router.add_post("/v1/chat/completions", route(Dialect.CHAT), expect_handler=expect(Dialect.CHAT))
    app.router.add_post("/v1/responses", route(Dialect.RESPONSES), expect_handler=expect(Dialect.RESPONSES))
    app.router.add_post("/v1/messages", route(Dialect.MESSAGES), expect_handler=expect(Dialect.MESSAGES))
    app.router.add_post("/v1/embeddings", route(Dialect.EMBEDDINGS), expect_handler=expect(Dialect.EMBEDDINGS))
    app.router.add_post("/v1/rerank", route(Dialect.RERANK), expect_handler=expect(Dialect.RERANK))
    app.router.add_post("/v1/score", route(Dialect.SCORE), expect_handler=expect(Dialect.SCORE))
    app.router.add_post("/v1/classify", route(Dialect.CLASSIFY), expect_handler=expect(Dialect.CLASSIFY))
    stored.add_routes(app)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", readiness)
    sglang_server.add_public_routes(app, pipeline, upstream, keys_checked=authorized is not None,
                                    respond=lambda err: error_response(err, None))
    return app


def build_admin_app(pipeline: Pipeline, upstream: UpstreamPool, membership: Membership) -> web.Application:
    app = web.Application()

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(pipeline.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def workers(request: web.Request) -> web.Response:
        limits = pipeline.admission.limits()
        described = pipeline.registry.describe()
        for w in described:
            w["admission_limit"] = limits.get(w["url"])
            w["origin"] = membership.origin(w["url"])  # a StrEnum: "source" or "api" in the JSON
        snap = pipeline.admission.core.snapshot()
        estimate = pipeline.token_estimate
        return web.json_response({
            "policy": pipeline.policy.name,
            # Text prompts' tokens: bytes / these (learned per model), else the prior.
            "prompt_bytes_per_token": {
                "prior": estimate.prior,
                "models": {m: {"bytes_per_token": round(e.bytes_per_token, 4), "reports": e.reports}
                           for m, e in estimate.snapshot().items()}},
            "admission": {"queue_depth": snap.queue_depth, "reserved": snap.reserved,
                          "shutting_down": snap.shutting_down},
            "workers": described,
            # As smg's GET /workers sums them up.
            "total": len(described),
            "healthy": sum(1 for w in described if w.get("healthy")),
            # Listed by the configured source, taken out on this admin port (DELETE /workers/{url}).
            "removed": sorted(membership.removed()),
        })

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/workers", workers)
    sglang_server.add_admin_routes(app, pipeline, upstream)
    return app
