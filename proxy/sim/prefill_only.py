"""The simulated worker's endpoints that only prefill (SGLang's embeddings, rerank and score): a
body becomes several prompts, each one engine request of one output token (it queues, batches and
hits the radix cache like any prompt), all run at once, and one answer is made of them.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.sim.protocol import BadRequest
from proxy.sim.scheduler import SimRequest
from proxy.sim.server import SimWorker, error_response, read_json
from proxy.sim.streaming import Watch, admit, observe, server_abort

# body -> (the prompts, their rids or None for fresh ones, what the answer needs besides);
# BadRequest for a body the endpoint refuses
Plan = Callable[[Any], tuple[list[list[int]], list[str] | None, Any]]
# (the finished requests in the prompts' order, what the plan kept) -> the JSON answer
Answer = Callable[[list[SimRequest], Any], Any]


async def _prefill_all(worker: SimWorker, inputs: list[list[int]], rids: list[str],
                      submitted: list[SimRequest]) -> web.Response | None:
    """Each input as an engine request, all at once, until each has finished; appended to
    ``submitted`` as admitted (the caller untracks them). None when all finished; else the error
    answer: one refused fails the whole body and aborts the rest, as one a server abort ended."""
    watches: list[Watch] = []
    for ids, rid in zip(inputs, rids, strict=True):
        req = SimRequest(rid=rid, input_ids=ids, max_new_tokens=1)
        watch = await admit(worker, req)
        if not isinstance(watch, Watch):
            for r in submitted:
                worker.abort(r.rid, "Another input of the batch was refused.", 503)
            return error_response(*watch, openai=True)
        submitted.append(req)
        watches.append(watch)

    async def done(req: SimRequest, watch: Watch) -> None:
        while not req.finished:
            await watch.changed()

    await asyncio.gather(*(done(r, w) for r, w in zip(submitted, watches, strict=True)))
    for req in submitted:
        observe(worker, req, streaming=False)
    failed = next((r for r in submitted if server_abort(r)), None)
    if failed is not None:
        assert failed.finish_reason is not None
        return error_response(failed.finish_reason["message"], failed.finish_reason["status_code"], openai=True)
    return None


def route(app: web.Application, worker: SimWorker, path: str, plan: Plan, answer: Answer) -> None:
    """``POST path``: the body planned into prompts (a refused one is a 400 in OpenAI's shape),
    the prompts prefilled, the answer made of them; a client that disconnects aborts them all."""
    async def serve(request: web.Request) -> web.StreamResponse:
        worker.track(request)
        submitted: list[SimRequest] = []
        try:
            try:
                prompts, rids, kept = plan(await read_json(request))
            except BadRequest as e:
                return error_response(str(e), 400, openai=True)
            fresh = rids if rids is not None else [uuid.uuid4().hex for _ in prompts]
            refused = await _prefill_all(worker, prompts, fresh, submitted)
            if refused is not None:
                return refused
            return web.json_response(answer(submitted, kept))
        finally:
            worker.untrack(request, *submitted)

    app.router.add_post(path, serve)
