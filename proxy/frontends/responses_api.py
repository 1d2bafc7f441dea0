"""The stored side of the OpenAI Responses API on the public port (generation itself,
``POST /v1/responses``, is the shared pipeline's, as chat is).

* ``GET /v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel``,
  ``DELETE /v1/responses/{id}`` — sent to the worker that stored the response, its answer relayed as
  it came (with ``X-Radixgate-Worker``). SGLang 0.5.23 serves the first and the cancel; what a worker
  does not serve is its own 404 / 405.
* ``previous_response_id`` on a new request pins it to that worker (``GenerateRequest.pinned``).

Where each response lives is remembered when its answer passes through (``ResponseHomes``). An id
this replica never saw (another replica served it, it was forgotten, the proxy restarted) is
found by asking every healthy worker for it at once; none has it: 404, as the worker would say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.errors import Overloaded, RadixgateError, ResponseNotFound, UpstreamError
from proxy.frontends.sglang_server import forward
from proxy.pipeline import Pipeline
from proxy.request import Dialect, GenerateRequest
from proxy.responses import ResponseHomes, check_id
from proxy.workers.upstream import UpstreamPool

PATH = "/v1/responses"
# Each search for an unknown id asks every worker: a flood of made-up ids multiplies by the fleet's
# size, so at most this many run at once (the rest: 429), besides the rate limit that charges them.
MAX_SEARCHES = 64


class ResponsesFront:
    """Where stored responses live, and the endpoints that reach them."""

    def __init__(self, pipeline: Pipeline, upstream: UpstreamPool, respond: Callable[[RadixgateError], web.Response]
                 ) -> None:
        self._pipeline, self._upstream, self._respond = pipeline, upstream, respond
        self.homes = ResponseHomes(pipeline.config.routing.response_homes)
        cfg = pipeline.config
        self._probe_s = cfg.scrape.timeout_s + cfg.upstream.connect_timeout_s
        self._metrics = pipeline.metrics
        self._searching = 0  # lookups asking every worker, now

    @property
    def searching(self) -> int:
        """Lookups asking every worker, now."""
        return self._searching

    def _count(self, outcome: str) -> None:
        self._metrics.inc(self._metrics.response_lookups, outcome)

    async def locate(self, response_id: str, request: web.Request) -> tuple[str, tuple[int, bytes, str] | None]:
        """The worker holding ``response_id``, and its GET answer when finding it took one;
        ``ResponseNotFound`` when no healthy worker has it, ``UpstreamError`` when one that might
        could not be asked."""
        members = {s.url: s.healthy for s in self._pipeline.registry.published()}
        home = self.homes.home(response_id)
        if home is not None and home in members:
            self._count("known")
            return home, None
        if home is not None:
            self.homes.forget(response_id)  # its worker left the fleet, and what it stored with it
        if self._searching >= MAX_SEARCHES:
            raise Overloaded(f"over {MAX_SEARCHES} lookups of unknown response ids in flight, each asking every "
                             "worker; retry shortly", retry_after=1.0)
        asked = sorted(url for url, healthy in members.items() if healthy)
        path = f"{PATH}/{response_id}"
        self._searching += 1
        try:
            answers = await asyncio.gather(*(forward(self._pipeline, self._upstream, url, "GET", path, request,
                                                     self._probe_s, self._max_bytes) for url in asked),
                                           return_exceptions=True)
        finally:
            self._searching -= 1
        unreachable = 0
        for url, got in zip(asked, answers, strict=True):
            if isinstance(got, BaseException):
                if not isinstance(got, RadixgateError):
                    raise got
                unreachable += 1
            elif got[0] == 200:
                self._count("found")
                self.homes.remember(response_id, url)
                return url, got
        if unreachable:
            self._count("unreachable")
            raise UpstreamError(f"response {response_id!r}: not on the workers that answered; "
                                f"{unreachable} of {len(asked)} could not be asked")
        self._count("missing")
        raise ResponseNotFound(f"Response with id '{response_id}' not found.")

    @property
    def _max_bytes(self) -> int:
        return self._pipeline.config.upstream.max_response_bytes

    async def pin(self, req: GenerateRequest, request: web.Request) -> None:
        """A follow-up (``previous_response_id``) goes to the worker holding the conversation."""
        if req.dialect is not Dialect.RESPONSES:
            return
        previous = req.payload.get("previous_response_id")
        if previous is not None:
            req.pinned, _ = await self.locate(check_id("previous_response_id", previous), request)

    def answered(self, req: GenerateRequest, worker: str | None, status: int, response_id: str | None,
                 rid: str) -> None:
        """An answer passed through: remember where it is stored (``store`` defaults to true)."""
        if req.dialect is Dialect.RESPONSES and worker is not None and status == 200 \
                and req.payload.get("store", True) is not False:
            self.homes.remember(response_id or rid, worker)

    def handler(self, method: str, suffix: str = "") -> Callable[[web.Request], Any]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                response_id = check_id("response_id", request.match_info["response_id"])
                worker, found = await self.locate(response_id, request)
                if method == "GET" and not suffix and found is not None:
                    status, body, ctype = found  # finding it was the answer
                else:
                    query = request.rel_url.raw_query_string[:2000]  # as sent (still escaped), bounded
                    path = f"{PATH}/{response_id}{suffix}" + (f"?{query}" if query else "")
                    status, body, ctype = await forward(self._pipeline, self._upstream, worker, method, path, request,
                                                        self._probe_s, self._max_bytes)
                # Gone from its worker: deleted, or the response itself not found there (a 404 from
                # a sub-endpoint the worker does not serve, e.g. input_items, says nothing of it).
                if (method == "DELETE" and status == 200) or (status == 404 and method == "GET" and not suffix):
                    self.homes.forget(response_id)
                return web.Response(status=status, body=body, content_type=ctype.split(";")[0],
                                    headers={"X-Radixgate-Worker": worker})
            except RadixgateError as e:
                return self._respond(e)
        return handle

    def add_routes(self, app: web.Application) -> None:
        app[FRONT] = self
        app.router.add_get(PATH + "/{response_id}", self.handler("GET"))
        app.router.add_delete(PATH + "/{response_id}", self.handler("DELETE"))
        app.router.add_get(PATH + "/{response_id}/input_items", self.handler("GET", "/input_items"))
        app.router.add_post(PATH + "/{response_id}/cancel", self.handler("POST", "/cancel"))


FRONT = web.AppKey("responses_front", ResponsesFront)  # the app's own, for whoever inspects it
