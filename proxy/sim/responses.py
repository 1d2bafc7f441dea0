"""The OpenAI Responses API of the simulated worker, as SGLang 0.5.23's ``serving_responses.py``.

Routes: ``POST /v1/responses`` (non-stream, ``stream`` SSE, ``background``),
``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``; SGLang serves no DELETE.

A request takes the chat path: its conversation tokenizes as the same messages sent to
/v1/chat/completions would, it passes the same fault gate and engine submit (503 when the queue
is full), it is aborted when its client disconnects, and it is counted when it finishes, so the
worker's counters cover Responses requests too. The engine rid is the response id
(``request_id``), so ``/abort_request {"rid": id}`` reaches it.

Stored responses (``store``, the default) keep their input messages for ``previous_response_id``;
the store is per served app (a restarted worker starts empty, as SGLang's in-memory store does)
and bounded by ``responses_store_max``, least recently stored dropped first.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.sim import protocol
from proxy.sim import responses_protocol as rp
from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker, error_response, read_json
from proxy.sim.streaming import SSE_HEADERS, Watch, admit, observe, server_abort

CANCEL_WAIT_S = 5.0  # a cancelled generation ends on the engine's next wake-up; this only bounds it


@dataclass
class Stored:
    response: dict[str, Any]  # replaced, never mutated: an answer already sent keeps its snapshot
    messages: list[dict[str, Any]]  # the conversation its prompt came from
    task: asyncio.Task[None] | None = None  # a background generation


class ResponseStore:
    """Responses by id, at most ``limit``; storing again counts as the latest store."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def get(self, response_id: str) -> Stored | None:
        return self._items.get(response_id)

    def put(self, response_id: str, entry: Stored) -> None:
        self._items.pop(response_id, None)
        self._items[response_id] = entry
        while len(self._items) > self.limit:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def add_routes(app: web.Application, worker: SimWorker) -> None:
    api = ResponsesApi(worker)
    app.router.add_post("/v1/responses", api.create)
    app.router.add_get("/v1/responses/{response_id}", api.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", api.cancel)


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


class ResponsesApi:
    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.store = ResponseStore(worker.config.responses_store_max)

    # -- GET / cancel ----------------------------------------------------------------------------
    def _lookup(self, request: web.Request) -> Stored | web.Response:
        response_id = request.match_info["response_id"]
        entry = self.store.get(response_id)
        refused = rp.id_error(response_id, entry is not None)
        if refused is not None:
            return _json(*refused)
        assert entry is not None
        return entry

    async def retrieve(self, request: web.Request) -> web.Response:
        entry = self._lookup(request)
        return entry if isinstance(entry, web.Response) else _json(entry.response)

    async def cancel(self, request: web.Request) -> web.Response:
        entry = self._lookup(request)
        if isinstance(entry, web.Response):
            return entry
        if entry.response["status"] not in rp.RUNNING:
            return _json(rp.cancel_sync_error(), 400)
        entry.response = {**entry.response, "status": "cancelled"}
        self.worker.abort(entry.response["id"], "The response was cancelled.")
        if entry.task is not None:
            # The task sees its request end, counts it and leaves the status alone. asyncio.wait,
            # not await: a client leaving this cancel must not cancel the task.
            await asyncio.wait({entry.task}, timeout=CANCEL_WAIT_S)
        return _json(entry.response)

    # -- POST ------------------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        worker = self.worker
        worker.track(request)
        submitted: SimRequest | None = None
        try:
            try:
                body = rp.parse_body(await read_json(request))
                if body.background and body.stream:
                    raise BadRequest("background responses cannot be streamed")
                if body.background and not body.store:
                    raise BadRequest("background responses need store=true (they are read back by id)")
            except BadRequest as e:
                return error_response(str(e), 400, openai=True)
            previous = None
            if body.previous_response_id is not None:
                entry = self.store.get(body.previous_response_id)
                refused = rp.id_error(body.previous_response_id, entry is not None)
                if refused is not None:
                    return _json(*refused)
                assert entry is not None
                previous = (entry.messages, entry.response)
            messages = rp.conversation(body, previous)
            try:
                ids = protocol.chat_prompt_ids(messages, worker.encoder.encode, worker.encoder.encode_chat)
            except BadRequest as e:
                return error_response(str(e), 400, openai=True)
            req = SimRequest(rid=body.request_id, input_ids=ids, max_new_tokens=body.max_new_tokens, stop=body.stop)
            watch = await admit(worker, req)
            if not isinstance(watch, Watch):
                return error_response(*watch, openai=True)
            created_at = int(time.time())
            if body.background:  # not ``submitted``: the generation outlives this connection
                return self._start_background(body, req, watch, messages, created_at)
            submitted = req
            if body.stream:
                try:
                    return await self._stream(request, body, req, watch, messages, created_at)
                except ConnectionResetError:  # the client (or a die fault) closed the connection
                    return web.Response(status=499)
            while not req.finished:
                await watch.changed()
            observe(worker, req, streaming=False)
            if server_abort(req):  # as SGLang's tokenizer manager: a 5xx abort is an HTTP error
                assert req.finish_reason is not None
                return error_response(req.finish_reason["message"], req.finish_reason["status_code"], openai=True)
            response = self._final(body, req, created_at, rp.new_item_id())
            self._keep(body, messages, response)
            return _json(response)
        finally:
            worker.untrack(request, submitted)

    def _final(self, body: rp.ResponsesBody, req: SimRequest, created_at: int, item_id: str) -> dict[str, Any]:
        cfg = self.worker.config
        cached = req.cached_tokens if cfg.enable_cache_report and not cfg.minimal_reports else 0
        text = req.output_text
        # SGLang adds no message item for an empty output.
        output = [rp.message_item(item_id, text, "completed")] if text else []
        return rp.response_object(body, model=cfg.served_model_name, created_at=created_at, status="completed",
                                  output=output, usage=rp.usage(len(req.input_ids), cached, len(req.output_ids)))

    def _keep(self, body: rp.ResponsesBody, messages: list[dict[str, Any]], response: dict[str, Any]) -> None:
        if not body.store:
            return
        stored = self.store.get(body.request_id)
        if stored is not None and stored.response["status"] == "cancelled":
            return  # a cancel is final, as SGLang keeps it
        self.store.put(body.request_id, Stored(response, messages))

    def _initial(self, body: rp.ResponsesBody, created_at: int, status: str) -> dict[str, Any]:
        return rp.response_object(body, model=self.worker.config.served_model_name, created_at=created_at,
                                  status=status, output=[], usage=None)

    # -- background ------------------------------------------------------------------------------
    def _start_background(self, body: rp.ResponsesBody, req: SimRequest, watch: Watch,
                          messages: list[dict[str, Any]], created_at: int) -> web.Response:
        queued = self._initial(body, created_at, "queued")
        entry = Stored(queued, messages)
        self.store.put(body.request_id, entry)
        entry.task = self.worker.spawn(self._run_background(body, req, watch, entry, created_at),
                                       name=f"create_{body.request_id}")
        return _json(queued)

    async def _run_background(self, body: rp.ResponsesBody, req: SimRequest, watch: Watch, entry: Stored,
                              created_at: int) -> None:
        if entry.response["status"] == "queued":
            entry.response = {**entry.response, "status": "in_progress"}
        while not req.finished:
            await watch.changed()
        observe(self.worker, req, streaming=False)
        if entry.response["status"] == "cancelled":
            return
        if server_abort(req):  # SGLang marks a background request that ended in an error "failed"
            entry.response = {**entry.response, "status": "failed"}
            return
        self._keep(body, entry.messages, self._final(body, req, created_at, rp.new_item_id()))

    # -- stream ----------------------------------------------------------------------------------
    async def _stream(self, request: web.Request, body: rp.ResponsesBody, req: SimRequest, watch: Watch,
                      messages: list[dict[str, Any]], created_at: int) -> web.StreamResponse:
        cfg = self.worker.config
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        sequence = 0

        async def send(event: dict[str, Any]) -> None:
            nonlocal sequence
            event["sequence_number"] = sequence
            sequence += 1
            await response.write(rp.sse_event(event))

        initial = self._initial(body, created_at, "in_progress")
        await send(rp.response_event("response.created", initial))
        await send(rp.response_event("response.in_progress", initial))
        item_id = rp.new_item_id()
        sent_tokens, sent_text, added, aborted = 0, 0, False, False
        while True:
            await watch.changed()
            if server_abort(req):
                assert req.finish_reason is not None
                await send(rp.error_event(req.finish_reason["message"], req.finish_reason["status_code"]))
                aborted = True
                break
            n = len(req.output_ids)
            finished = req.finished  # as of this chunk: the request may finish while a write waits
            due = n > sent_tokens and (sent_tokens == 0 or n - sent_tokens >= cfg.stream_interval)
            if not (due or finished):
                continue
            text = req.output_text
            delta = text[sent_text:]
            if delta:
                if not added:  # the message item opens with the first text, as SGLang's stream
                    await send(rp.item_added_event(item_id))
                    await send(rp.part_added_event(item_id))
                    added = True
                await send(rp.delta_event(item_id, delta))
            sent_tokens, sent_text = n, len(text)
            if finished:
                break
        if not aborted:
            if added:
                for event in rp.done_events(item_id, req.output_text):
                    await send(event)
            final = self._final(body, req, created_at, item_id)
            await send(rp.response_event("response.completed", final))
            self._keep(body, messages, final)
        observe(self.worker, req, streaming=True)
        await response.write_eof()
        return response
