"""The Anthropic Messages API of the simulated worker, as SGLang 0.5.23's ``entrypoints/anthropic``.

Routes: ``POST /v1/messages`` (non-stream, ``stream`` SSE) and ``POST /v1/messages/count_tokens``.

SGLang serves a message by translating it to a chat completion, so a request here takes the chat
path: its system prompt and messages tokenize as the same conversation sent to
/v1/chat/completions would, it passes the same fault gate and engine submit (503 when the queue is
full), it is aborted when its client disconnects, and it is counted when it finishes, so the
worker's counters cover these requests too. The engine rid is the body's ``rid`` (the proxy names
it, so ``/abort_request {"rid": ...}`` reaches the request), else a fresh one. Errors have
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.sim import messages_protocol as mp
from proxy.sim import protocol
from proxy.sim.protocol import BadRequest
from proxy.sim.responses_protocol import sse_event
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker, read_json
from proxy.sim.streaming import SSE_HEADERS, Watch, admit, observe, server_abort


def add_routes(app: web.Application, worker: SimWorker) -> None:
    api = MessagesApi(worker)
    app.router.add_post("/v1/messages", api.create)
    app.router.add_post("/v1/messages/count_tokens", api.count_tokens)


def _error(message: str, status: int) -> web.Response:
    return web.json_response(mp.error_body(message, status), status=status)


class MessagesApi:
    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker

    def _prompt(self, body: mp.MessagesBody) -> list[int]:
        encoder = self.worker.encoder
        return protocol.chat_prompt_ids(mp.chat_messages(body), encoder.encode, encoder.encode_chat)

    async def count_tokens(self, request: web.Request) -> web.Response:
        # Tokenizing only, as SGLang's handle_count_tokens: no gate, no engine, nothing counted.
        try:
            ids = self._prompt(mp.parse_body(await read_json(request), counting=True))
        except BadRequest as e:
            return _error(str(e), 400)
        return web.json_response({"input_tokens": len(ids)})

    async def create(self, request: web.Request) -> web.StreamResponse:
        worker = self.worker
        worker.track(request)
        submitted: SimRequest | None = None
        try:
            try:
                body = mp.parse_body(await read_json(request))
                ids = self._prompt(body)
            except BadRequest as e:
                return _error(str(e), 400)
            req = SimRequest(rid=body.rid, input_ids=ids, max_new_tokens=body.max_tokens, stop=body.stop)
            watch = await admit(worker, req)
            if not isinstance(watch, Watch):
                return _error(*watch)
            submitted = req
            message_id = mp.new_message_id()
            if body.stream:
                try:
                    return await self._stream(request, body, req, watch, message_id)
                except ConnectionResetError:  # the client (or a die fault) closed the connection
                    return web.Response(status=499)
            while not req.finished:
                await watch.changed()
            observe(worker, req, streaming=False)
            if server_abort(req):  # as the chat path: a 5xx abort is an HTTP error
                assert req.finish_reason is not None
                return _error(req.finish_reason["message"], req.finish_reason["status_code"])
            reason, sequence = mp.stop_reason(req)
            return web.json_response(mp.message_object(message_id, body.model, req.output_text, reason, sequence,
                                                       self._usage(req)))
        finally:
            worker.untrack(request, submitted)

    def _usage(self, req: SimRequest) -> dict[str, int]:
        cfg = self.worker.config
        cached = req.cached_tokens if cfg.enable_cache_report and not cfg.minimal_reports else 0
        return mp.usage(len(req.input_ids), len(req.output_ids), cached)

    async def _stream(self, request: web.Request, body: mp.MessagesBody, req: SimRequest, watch: Watch,
                      message_id: str) -> web.StreamResponse:
        cfg = self.worker.config
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)

        async def send(event: dict[str, Any]) -> None:
            await response.write(sse_event(event))

        sent_tokens, sent_text = 0, 0
        started = opened = aborted = False
        while True:
            await watch.changed()
            if server_abort(req):
                assert req.finish_reason is not None
                await send(mp.error_event(req.finish_reason["message"]))
                aborted = True
                break
            n = len(req.output_ids)
            finished = req.finished  # as of this chunk: the request may finish while a write waits
            due = n > sent_tokens and (sent_tokens == 0 or n - sent_tokens >= cfg.stream_interval)
            if not (due or finished):
                continue
            if not started:
                # SGLang sends message_start on the chat stream's first chunk, i.e. with the first
                # token, not when the request is accepted: time to first byte is time to first token.
                await send(mp.message_start_event(message_id, body.model))
                started = True
            text = req.output_text
            delta = text[sent_text:]
            if delta:
                if not opened:  # the text block opens with the first text, as SGLang's stream
                    await send(mp.block_start_event())
                    opened = True
                await send(mp.text_delta_event(delta))
            sent_tokens, sent_text = n, len(text)
            if finished:
                break
        if not aborted:
            if opened:
                await send(mp.block_stop_event())
            reason, sequence = mp.stop_reason(req)
            await send(mp.message_delta_event(reason, sequence, self._usage(req)))
            await send(mp.message_stop_event())
        observe(self.worker, req, streaming=True)
        await response.write_eof()
        return response
