"""SGLang's own server endpoints, answered for the fleet (what clients and tools call beside generation).

Public port, behind the API key like every path but ``/health`` and ``/ready``:

* ``GET /health_generate`` — one healthy worker's ``/health_generate`` (SGLang runs a one-token
  generation): its status; 503 when no worker is healthy. Unlike ``/health`` (the proxy is up), this
  says a generation can be served end to end.
* ``GET /get_model_info``, ``/model_info`` and ``GET /get_server_info``, ``/server_info`` — one healthy
  worker's own answer, relayed as it sent it (bench_serving reads ``internal_states``, tools read
  ``model_path``, ``max_total_num_tokens``), with ``X-Radixgate-Worker`` naming the worker. As
  sglang-router does: the workers of one fleet run the same server arguments, and a sum of fields
  such as ``max_total_num_tokens`` would describe no engine that exists. ``/workers`` on the admin
  port has every worker's view.
* ``POST /v1/messages/count_tokens`` — one healthy worker's count for the caller's body, as sent.
* ``POST /tokenize``, ``/detokenize`` and their ``/v1/`` twins — one healthy worker's answer for
  the caller's body, as sent: the worker's tokenizer is the model's, which the proxy's own
  (``routing.tokenizer``, optional) need not be.
* ``GET|POST /flush_cache`` — fanned out to every worker; the answer lists each worker's status and
  message (200 only when every worker flushed; SGLang refuses, 400, while requests run). Each
  worker that flushed starts a new generation: routing forgets what it held at once.

Why ``/flush_cache`` is not open on the public port: one call empties every worker's prefix cache,
so every tenant's prompts are prefilled from scratch until the caches refill (TTFT up by the whole
prefill, the fleet's capacity down) — a lever no anonymous caller should hold. So it is served on
the admin port (an operator's, loopback by default) always, and on the public port only when API
keys are configured, to a caller with a valid key (``bench_serving --flush-cache`` with
``OPENAI_API_KEY`` set); a public port without keys answers 403 naming the admin port.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from proxy.errors import Forbidden, NoHealthyWorker, RadixgateError, UpstreamError, UpstreamTimeout
from proxy.pipeline import Pipeline
from proxy.workers.upstream import UpstreamPool, read_capped

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
INFO_PATHS = ("/get_model_info", "/model_info", "/get_server_info", "/server_info", "/health_generate")
FLUSH_PATH = "/flush_cache"
# Anthropic's token count: the worker's chat template decides, any healthy one answers alike.
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# SGLang's tokenizer endpoints, under both names it registers them.
TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/v1/tokenize", "/v1/detokenize")
# A /health_generate runs a generation: as long as the health probe may take, at least 20 s (SGLang's own).
_HEALTH_GENERATE_MIN_S = 20.0


async def forward(pipeline: Pipeline, upstream: UpstreamPool, url: str, method: str, path: str, request: web.Request,
                  timeout_s: float, max_bytes: int | None = None, body: bytes | None = None) -> tuple[int, bytes, str]:
    """One small request to one worker (``body``: JSON to send): (status, body, content type);
    ``UpstreamError`` / ``UpstreamTimeout`` when the worker cannot be reached or does not answer
    in time. An answer over ``max_bytes`` (default ``upstream.max_scrape_bytes``) is an ``UpstreamError``."""
    headers = {"Accept-Encoding": "identity"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    auth = pipeline.upstream_authorization(request.headers.get("Authorization"))
    if auth:
        headers["Authorization"] = auth
    cfg = upstream.cfg
    try:
        async with upstream.session(url).request(
                method, url + path, headers=headers, data=body, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            body = await read_capped(resp, cfg.max_scrape_bytes if max_bytes is None else max_bytes, f"{method} {path}")
            return resp.status, body, resp.content_type or "application/octet-stream"
    except TimeoutError:
        raise UpstreamTimeout(f"{url}{path}: no answer within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError) as e:
        raise UpstreamError(f"{url}{path}: {e!r}") from None


def _healthy(pipeline: Pipeline) -> list[str]:
    urls = sorted(s.url for s in pipeline.registry.published() if s.healthy)
    if not urls:
        raise NoHealthyWorker("no healthy worker to answer", retry_after=1.0)
    return urls


def info_handler(pipeline: Pipeline, upstream: UpstreamPool, path: str, respond: Callable[[RadixgateError], web.Response],
                 method: str = "GET") -> Handler:
    """``path`` answered by a healthy worker (the next one if the first cannot be reached); a
    ``POST`` sends the caller's JSON body on (``/v1/messages/count_tokens``, the tokenizer paths).
    A ``GET`` is a small answer of the worker's own, bounded as a scrape is; a ``POST``'s answer
    grows with the caller's body (a tokenized prompt list) and waits on the worker's tokenizer,
    busy or not: it is bounded as a non-stream answer is (``upstream.max_response_bytes``, and
    ``upstream.first_byte_timeout_s`` to answer)."""
    cfg = pipeline.config
    timeout_s = cfg.scrape.timeout_s + cfg.upstream.connect_timeout_s
    max_bytes: int | None = None  # forward's default: upstream.max_scrape_bytes
    if path == "/health_generate":
        timeout_s = max(_HEALTH_GENERATE_MIN_S, cfg.health.timeout_s)
    elif method == "POST":
        timeout_s = cfg.upstream.connect_timeout_s + cfg.upstream.first_byte_timeout_s
        max_bytes = cfg.upstream.max_response_bytes

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            sent = await request.read() if method == "POST" else None
            last: RadixgateError | None = None
            for url in _healthy(pipeline):
                try:
                    status, body, ctype = await forward(pipeline, upstream, url, method, path, request, timeout_s,
                                                        max_bytes, body=sent)
                except RadixgateError as e:
                    last = e
                    continue
                if status >= 500 and path != "/health_generate":
                    last = UpstreamError(f"{url}{path}: HTTP {status}")
                    continue
                return web.Response(status=status, body=body, content_type=ctype.split(";")[0],
                                    headers={"X-Radixgate-Worker": url})
            assert last is not None
            raise last
        except RadixgateError as e:
            return respond(e)

    return handler


def flush_handler(pipeline: Pipeline, upstream: UpstreamPool) -> Handler:
    """``/flush_cache`` on every worker at once; per-worker results."""
    timeout_s = pipeline.config.scrape.timeout_s + pipeline.config.upstream.connect_timeout_s + 10.0

    async def one(url: str, request: web.Request) -> dict[str, Any]:
        try:
            status, body, _ = await forward(pipeline, upstream, url, request.method, FLUSH_PATH, request, timeout_s)
        except RadixgateError as e:
            return {"worker": url, "status": e.status, "flushed": False, "message": e.message}
        return {"worker": url, "status": status, "flushed": status == 200,
                "message": body.decode("utf-8", "replace")[:1000].strip()}

    async def handler(request: web.Request) -> web.StreamResponse:
        urls = sorted(s.url for s in pipeline.registry.published())
        results = list(await asyncio.gather(*(one(u, request) for u in urls)))
        pipeline.registry.flushed(r["worker"] for r in results if r["flushed"])
        flushed = bool(results) and all(r["flushed"] for r in results)
        if flushed:
            status = 200
        elif results and all(400 <= r["status"] < 500 for r in results if not r["flushed"]):
            status = 400  # as SGLang: refused (requests running), try again when idle
        else:
            status = 502 if results else 503
        return web.json_response({"flushed": flushed, "workers": results}, status=status)

    return handler


def add_public_routes(app: web.Application, pipeline: Pipeline, upstream: UpstreamPool, *, keys_checked: bool,
                      respond: Callable[[RadixgateError], web.Response]) -> None:
    """The info endpoints, and ``/flush_cache`` — served only when the port checks API keys."""
    for path in INFO_PATHS:
        app.router.add_get(path, info_handler(pipeline, upstream, path, respond))
    for path in (COUNT_TOKENS_PATH, *TOKENIZER_PATHS):
        app.router.add_post(path, info_handler(pipeline, upstream, path, respond, method="POST"))
    flush = flush_handler(pipeline, upstream)

    async def guarded_flush(request: web.Request) -> web.StreamResponse:
        if not keys_checked:
            return respond(Forbidden(
                "/flush_cache empties every worker's prefix cache: on the public port only with API keys "
                "configured (security.api_keys_file / RADIXGATE_API_KEYS); without, use the admin port's "
                "/flush_cache"))
        return await flush(request)

    app.router.add_get(FLUSH_PATH, guarded_flush)
    app.router.add_post(FLUSH_PATH, guarded_flush)


def add_admin_routes(app: web.Application, pipeline: Pipeline, upstream: UpstreamPool) -> None:
    flush = flush_handler(pipeline, upstream)
    app.router.add_get(FLUSH_PATH, flush)
    app.router.add_post(FLUSH_PATH, flush)
