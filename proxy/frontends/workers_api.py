"""Adding and removing workers at runtime, on the admin port (the control plane sglang-router and
smg users script).

* ``POST /workers`` with ``{"url": "http://host:port", "model": "..."}`` (``model`` optional, as in
  ``workers.static``): 201 and the worker's state when it joined, 200 when it was already a member
  (its model unchanged). It takes requests once a health probe passes, like any new worker.
* ``DELETE /workers/{url}`` (the URL percent-encoded, or as it is): 200 when it left, 404 when it
  was no member. Requests already on it finish there; no new one goes to it.
* ``GET /workers/{url}``: that worker as ``GET /workers`` lists it; 404 when no member.
* sglang-router's calls: ``POST /add_worker?url=URL`` (200 ``Successfully added worker: URL``, 400
  when it is already a member or the URL is bad), ``POST /remove_worker?url=URL`` (200
  ``Successfully removed worker: URL``, 404 when no member) and ``GET /list_workers``
  (``{"urls": [...]}``).

The rules of membership (what the configured source announces against what was changed here) are
in ``proxy/workers/membership.py``; changes do not outlive the process, and each replica of a
fleet of proxies keeps its own (call each, or use discovery).

Who may change the fleet: with a key in the environment variable ``security.admin_key_env``, a
caller presenting it (``Authorization: Bearer KEY`` or ``x-api-key``; 401 otherwise); without one,
anyone who can reach the admin port while it listens on loopback, and nobody when it listens on
another address (403): pointing the proxy at a worker of the caller's choosing sends it every
tenant's prompts. Reads stay open, like ``/metrics`` and ``GET /workers``.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy import safejson
from proxy.security import ApiKeys, presented_key
from proxy.telemetry.metrics import Metrics
from proxy.workers.membership import Membership, MembershipFull, worker_url
from proxy.workers.registry import WorkerRegistry

log = logging.getLogger(__name__)

FIELDS = frozenset({"url", "model"})
MAX_MODEL_CHARS = 256
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def _text(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message)


class WorkersApi:
    def __init__(self, membership: Membership, registry: WorkerRegistry, metrics: Metrics, *,
                 key: ApiKeys, loopback: bool) -> None:
        self.membership = membership
        self.registry = registry
        self.metrics = metrics
        self.key = key
        self.loopback = loopback

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/workers", self.post)
        app.router.add_get("/workers/{url:.+}", self.get)
        app.router.add_delete("/workers/{url:.+}", self.delete)
        app.router.add_post("/add_worker", self.add_worker)
        app.router.add_post("/remove_worker", self.remove_worker)
        app.router.add_get("/list_workers", self.list_workers)

    # -- the changes ---------------------------------------------------------------------------------
    def _count(self, outcome: str) -> None:
        self.metrics.inc(self.metrics.worker_changes, outcome)

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.key:
            given = presented_key(request.headers.get("Authorization"), request.headers.get("x-api-key"))
            if not self.key.accepts(given):
                self._count("unauthorized")
                return _error(401, "missing or wrong admin key (Authorization: Bearer <security.admin_key_env>)")
        elif not self.loopback:
            self._count("forbidden")
            return _error(403, "adding or removing workers needs an admin key (security.admin_key_env) while "
                               "the admin port listens beyond loopback (server.admin_host)")
        return None

    def _add(self, url: str, model: str) -> tuple[bool, str | None]:
        """(joined, why it is refused when the fleet is full); joined False alone = already a member."""
        try:
            joined = self.membership.add(url)
        except MembershipFull as e:
            self._count("full")
            return False, str(e)
        if joined:
            self.registry.pin_model(url, model)
            self.registry.set_members(self.membership.members())
            log.info("admin: worker %s added", url)
        self._count("added" if joined else "present")
        return joined, None

    def _remove(self, url: str) -> bool:
        gone = self.membership.remove(url)
        if gone:
            self.registry.set_members(self.membership.members())
            self.registry.pin_model(url, "")
            log.info("admin: worker %s removed", url)
        self._count("removed" if gone else "absent")
        return gone

    def _described(self, url: str) -> dict[str, Any] | None:
        for w in self.registry.describe():
            if w["url"] == url:
                w["origin"] = self.membership.origin(url)
                return w
        return None

    # -- POST /workers, GET and DELETE /workers/{url} -------------------------------------------------
    async def post(self, request: web.Request) -> web.StreamResponse:
        if (refusal := self._refused(request)) is not None:
            return refusal
        try:
            body = safejson.loads(await request.read())  # aiohttp caps the body (client_max_size: 413)
        except ValueError as e:
            return self._invalid(f"body: not JSON ({e})")
        if not isinstance(body, dict):
            return self._invalid('body: must be a JSON object, {"url": "http://host:port"}')
        if unknown := sorted(set(body) - FIELDS):
            return self._invalid(f"body: unknown field(s) {unknown[:8]} (known: model, url)")
        model = body.get("model", "")
        if not isinstance(model, str) or len(model) > MAX_MODEL_CHARS:
            return self._invalid(f"model: must be a string of at most {MAX_MODEL_CHARS} characters")
        try:
            url = worker_url(body.get("url"))
        except ValueError as e:
            return self._invalid(f"url: {e}")
        joined, full = self._add(url, model)
        if full is not None:
            return _error(409, full)
        return web.json_response({"url": url, "added": joined, "worker": self._described(url)},
                                 status=201 if joined else 200)

    async def get(self, request: web.Request) -> web.StreamResponse:
        try:
            url = worker_url(request.match_info["url"])
        except ValueError as e:
            return _error(400, f"url: {e}")
        described = self._described(url)
        return web.json_response(described) if described is not None else _error(404, f"no worker {url}")

    async def delete(self, request: web.Request) -> web.StreamResponse:
        if (refusal := self._refused(request)) is not None:
            return refusal
        try:
            url = worker_url(request.match_info["url"])
        except ValueError as e:
            return self._invalid(f"url: {e}")
        if not self._remove(url):
            return _error(404, f"no worker {url}")
        return web.json_response({"url": url, "removed": True})

    def _invalid(self, message: str) -> web.Response:
        self._count("invalid")
        return _error(400, message)

    # -- sglang-router's calls: text answers, the URL in the query ------------------------------------
    def _query_url(self, request: web.Request) -> str | web.Response:
        """The call's checked ``?url=``, or the answer that refuses the call."""
        if (refusal := self._refused(request)) is not None:
            return refusal
        raw = request.query.get("url")
        if raw is None:
            self._count("invalid")
            return _text(400, "Worker URL required. Provide 'url' query parameter")
        try:
            return worker_url(raw)
        except ValueError as e:
            self._count("invalid")
            return _text(400, f"url: {e}")

    async def add_worker(self, request: web.Request) -> web.StreamResponse:
        url = self._query_url(request)
        if isinstance(url, web.Response):
            return url
        joined, full = self._add(url, "")
        if full is not None:
            return _text(409, full)
        if not joined:
            return _text(400, f"Worker {url} already exists")
        return _text(200, f"Successfully added worker: {url}")

    async def remove_worker(self, request: web.Request) -> web.StreamResponse:
        url = self._query_url(request)
        if isinstance(url, web.Response):
            return url
        if not self._remove(url):
            return _text(404, f"No worker {url}")
        return _text(200, f"Successfully removed worker: {url}")

    async def list_workers(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"urls": sorted(self.registry.urls())})
