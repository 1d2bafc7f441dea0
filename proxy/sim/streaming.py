"""Generation endpoints: /generate (native) and /v1/completions, /v1/chat/completions (OpenAI).

Each handler parses the body, passes the fault gate, submits to the engine and then either waits
for the end (non-stream) or relays updates as SSE ``data: {json}\\n\\n`` lines ending with
``data: [DONE]\\n\\n``. Native chunks carry cumulative text/ids unless
``incremental_streaming_output``; a chunk goes out on the first token, then every
``stream_interval`` tokens, and at the end. Queue-full answers 503 before any byte is streamed.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from proxy.sim import protocol
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker, error_response, read_json

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class Watch:
    """Wakes a handler whenever the engine touches its request; feeds the inter-token histogram."""

    def __init__(self, worker: SimWorker, req: SimRequest) -> None:
        self.worker = worker
        self.event = asyncio.Event()
        self.tokens = 0
        self.last_token_at: float | None = None
        req.listener = self._update

    def _update(self, req: SimRequest) -> None:
        n = len(req.output_ids)
        metrics = self.worker.metrics
        if n > self.tokens and req.last_token_at is not None:
            if metrics is not None and self.last_token_at is not None:
                metrics.observe_inter_token((req.last_token_at - self.last_token_at) / (n - self.tokens))
            self.tokens, self.last_token_at = n, req.last_token_at
        self.event.set()

    async def changed(self) -> None:
        await self.event.wait()
        self.event.clear()


def server_abort(req: SimRequest) -> bool:
    """Aborted by the server itself (shutdown, internal error): SGLang ends such a stream with an error."""
    reason = req.finish_reason
    return bool(reason and reason.get("type") == "abort" and (reason.get("status_code") or 0) >= 500)


def stream_error(message: str, status: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": status, "retryable": False}}


def sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def add_routes(app: web.Application, worker: SimWorker) -> None:
    async def generate(request: web.Request) -> web.StreamResponse:
        return await _serve(worker, request, dialect="generate")

    async def completions(request: web.Request) -> web.StreamResponse:
        return await _serve(worker, request, dialect="completions")

    async def chat(request: web.Request) -> web.StreamResponse:
        return await _serve(worker, request, dialect="chat")

    app.router.add_post("/generate", generate)
    app.router.add_put("/generate", generate)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)


async def _serve(worker: SimWorker, request: web.Request, dialect: str) -> web.StreamResponse:
    openai = dialect != "generate"
    worker.track(request)
    submitted: SimRequest | None = None
    try:
        try:
            body = await read_json(request)
            if openai:
                req, stream, include_usage = protocol.parse_openai(body, chat=dialect == "chat",
                                                                   encode=worker.encoder.encode,
                                                                   encode_chat=worker.encoder.encode_chat)
            else:
                req, stream = protocol.parse_generate(body, worker.encoder.encode)
                include_usage = False
        except BadRequest as e:
            return error_response(str(e), 400, openai)
        watch = await admit(worker, req)
        if not isinstance(watch, Watch):
            return error_response(*watch, openai=openai)
        submitted = req
        if stream:
            try:
                return await _stream(worker, request, req, watch, dialect, include_usage)
            except ConnectionResetError:  # the client (or a die fault) closed the connection
                return web.Response(status=499)
        while not req.finished:
            await watch.changed()
        observe(worker, req, streaming=False)
        return web.json_response(_final_body(worker, req, dialect))
    finally:
        worker.untrack(request, submitted)


async def admit(worker: SimWorker, req: SimRequest) -> Watch | tuple[str, int]:
    """The fault gate, the hang fault, then the engine: the request's watch, or the refusal
    (message, HTTP status) to answer with. Every generation endpoint comes in this way."""
    refused = worker.gate()
    if refused is not None:
        return refused
    await worker.hang_if_faulted()
    watch = Watch(worker, req)
    refused = worker.submit(req)
    return watch if refused is None else refused


def observe(worker: SimWorker, req: SimRequest, streaming: bool) -> None:
    worker.finished_prompt_tokens += len(req.input_ids)
    worker.finished_cached_tokens += req.cached_tokens
    worker.finished_requests += 1
    if worker.metrics is not None:
        worker.metrics.observe_finished(req, streaming)


def _final_body(worker: SimWorker, req: SimRequest, dialect: str) -> dict[str, Any]:
    cfg = worker.config
    if dialect == "generate":
        meta = protocol.meta_info(req, final=True, metrics=cfg.enable_metrics, wall_offset=worker.wall_offset,
                                  cached=not cfg.minimal_reports)
        return protocol.generate_payload(req, req.output_text, list(req.output_ids), meta)
    return protocol.openai_response(req, cfg.served_model_name, dialect == "chat",
                                   cfg.enable_cache_report and not cfg.minimal_reports)


async def _stream(worker: SimWorker, request: web.Request, req: SimRequest, watch: Watch,
                  dialect: str, include_usage: bool) -> web.StreamResponse:
    cfg = worker.config
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    sent_tokens, sent_text = 0, 0
    first = True
    while True:
        await watch.changed()
        if server_abort(req):
            assert req.finish_reason is not None
            await response.write(sse(stream_error(req.finish_reason["message"], req.finish_reason["status_code"])))
            break
        n = len(req.output_ids)
        finished = req.finished  # as of this chunk: the request may finish while the write below waits
        due = n > sent_tokens and (sent_tokens == 0 or n - sent_tokens >= cfg.stream_interval)
        if not (due or finished):
            continue
        text = req.output_text
        if dialect == "generate":
            meta = protocol.meta_info(req, final=finished, metrics=cfg.enable_metrics,
                                      wall_offset=worker.wall_offset, cached=not cfg.minimal_reports)
            if cfg.incremental_streaming_output:
                payload = protocol.generate_payload(req, text[sent_text:], req.output_ids[sent_tokens:n], meta)
            else:
                payload = protocol.generate_payload(req, text, list(req.output_ids[:n]), meta)
        else:
            payload = protocol.openai_chunk(req, cfg.served_model_name, dialect == "chat",
                                            text[sent_text:], first=first)
        first = False
        await response.write(sse(payload))
        sent_tokens, sent_text = n, len(text)
        if finished:
            break
    if include_usage and not server_abort(req):
        await response.write(sse(protocol.openai_usage_chunk(req, cfg.served_model_name, dialect == "chat",
                                                             cfg.enable_cache_report and not cfg.minimal_reports)))
    await response.write(DONE)
    observe(worker, req, streaming=True)
    await response.write_eof()
    return response
