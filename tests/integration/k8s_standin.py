"""A stand-in Kubernetes API server (aiohttp on 127.0.0.1) speaking the real list/watch wire format.

Serves ``/apis/discovery.k8s.io/v1/namespaces/NS/endpointslices`` and ``/api/v1/namespaces/NS/pods``:

* list → ``{"kind": "<Kind>List", "metadata": {"resourceVersion": RV}, "items": [...]}``;
* ``?watch=1&resourceVersion=RV`` → a chunked JSON-lines stream of ``{"type", "object"}`` events after
  RV, held open for new ones until ``timeoutSeconds``; a RV older than the compaction point gets the
  real server's answer, an ERROR event carrying a 410 ``Status`` (or an HTTP 410 when
  ``gone_as_http`` is set);
* ``labelSelector`` with equality terms (``a=b,c=d``);
* a bearer token checked on every request (401 otherwise).

Every object stored is checked against the Kubernetes JSON schema (kubernetes-validate), so the
test data has the shape a real cluster sends. Test controls: ``fail_requests`` (answer 500),
``stall_watches`` (accept, then say nothing and never end), ``end_watches()`` (cut live streams),
``bookmark()``, ``compact()``.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
from aiohttp import web

KIND_BY_RESOURCE = {"endpointslices": ("EndpointSlice", "discovery.k8s.io/v1"), "pods": ("Pod", "v1")}


@dataclass
class Event:
    rv: int
    type: str
    obj: dict[str, Any]


@dataclass
class StandinApi:
    token: str = "test-token"
    gone_as_http: bool = False
    fail_requests: int = 0
    stall_watches: int = 0  # this many next watches are accepted, then left silent and open
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (resource, ns, name)
    history: list[Event] = field(default_factory=list)
    requests: list[dict[str, str]] = field(default_factory=list)
    rv: int = 100
    compacted_rv: int = 0
    events_sent: int = 0  # watch events written to any stream

    def __post_init__(self) -> None:
        self._tick = asyncio.Event()  # set (and replaced) on every change
        self._stop_streams = asyncio.Event()

    # -- mutations (each bumps the resourceVersion and records a watch event) ------------------

    async def put(self, resource: str, namespace: str, obj: dict[str, Any]) -> None:
        kind, api_version = KIND_BY_RESOURCE[resource]
        obj = {"kind": kind, "apiVersion": api_version, **copy.deepcopy(obj)}
        obj["metadata"]["namespace"] = namespace
        kubernetes_validate.validate(obj, "1.32", strict=True)
        key = (resource, namespace, obj["metadata"]["name"])
        event_type = "MODIFIED" if key in self.objects else "ADDED"
        await self._record(key, event_type, obj)

    async def delete(self, resource: str, namespace: str, name: str) -> None:
        key = (resource, namespace, name)
        await self._record(key, "DELETED", self.objects[key])

    async def _record(self, key: tuple[str, str, str], event_type: str, obj: dict[str, Any]) -> None:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if event_type == "DELETED":
            del self.objects[key]
        else:
            self.objects[key] = obj
        self.history.append(Event(self.rv, event_type, obj))
        self._notify()

    async def bookmark(self) -> None:
        self.rv += 1
        self.history.append(Event(self.rv, "BOOKMARK", {"metadata": {"resourceVersion": str(self.rv)}}))
        self._notify()

    def _notify(self) -> None:
        self._tick.set()
        self._tick = asyncio.Event()

    def compact(self) -> None:
        """Forget history: any watch from an older resourceVersion now gets 410 Gone."""
        self.compacted_rv = self.rv

    def end_watches(self) -> None:
        self._stop_streams.set()
        self._stop_streams = asyncio.Event()

    def watch_versions(self) -> list[str]:
        return [r["resourceVersion"] for r in self.requests if r.get("watch") == "1"]

    def list_count(self) -> int:
        return sum(1 for r in self.requests if r.get("watch") != "1")

    # -- HTTP ---------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", self._handle)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        authorised = request.headers.get("Authorization") == f"Bearer {self.token}"
        self.requests.append({**request.query, "path": request.path, "auth": "ok" if authorised else "denied"})
        if not authorised:
            return _status(401, "Unauthorized", "Unauthorized")
        if self.fail_requests > 0:
            self.fail_requests -= 1
            return _status(500, "InternalError", "etcd is having a bad day")
        resource = request.path.rsplit("/", 1)[1]
        namespace = request.match_info["ns"]
        selector = _parse_selector(request.query.get("labelSelector", ""))

        def selected(obj: dict[str, Any]) -> bool:
            labels = obj["metadata"].get("labels", {})
            return all(labels.get(k) == v for k, v in selector.items())

        if request.query.get("watch") not in ("1", "true"):
            kind, api_version = KIND_BY_RESOURCE[resource]
            items = [
                {k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                for (r, ns, _), o in sorted(self.objects.items())
                if r == resource and ns == namespace and selected(o)
            ]
            body = {"kind": f"{kind}List", "apiVersion": api_version,
                    "metadata": {"resourceVersion": str(self.rv)}, "items": items}
            return web.json_response(body)
        return await self._watch(request, resource, namespace, selected)

    async def _watch(self, request: web.Request, resource: str, namespace: str, selected: Any) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.rv)
        timeout = float(request.query.get("timeoutSeconds", "1800"))
        if since < self.compacted_rv and self.gone_as_http:
            return _status(410, "Expired", f"too old resource version: {since} ({self.compacted_rv})")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        if self.stall_watches > 0:
            self.stall_watches -= 1
            await self._stop_streams.wait()
            return response
        if since < self.compacted_rv:
            gone = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"too old resource version: {since} ({self.compacted_rv})",
                    "reason": "Expired", "code": 410}
            await response.write(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
            return response
        stop = self._stop_streams
        deadline = asyncio.get_running_loop().time() + timeout
        sent = since
        while not stop.is_set():
            tick = self._tick
            for event in [e for e in self.history if e.rv > sent]:
                sent = event.rv
                if event.type == "BOOKMARK":
                    kind, api_version = KIND_BY_RESOURCE[resource]
                    obj = {"kind": kind, "apiVersion": api_version, **event.obj}
                elif event.obj["metadata"]["namespace"] == namespace and selected(event.obj) and (
                    KIND_BY_RESOURCE[resource][0] == event.obj["kind"]
                ):
                    obj = event.obj
                else:
                    continue
                await response.write(json.dumps({"type": event.type, "object": obj}).encode() + b"\n")
                self.events_sent += 1
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            waiters = {asyncio.ensure_future(tick.wait()), asyncio.ensure_future(stop.wait())}
            _, pending = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return response


def _parse_selector(text: str) -> dict[str, str]:
    return dict(term.split("=", 1) for term in text.split(",") if "=" in term)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


@asynccontextmanager
async def serve(api: StandinApi, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """Run ``api`` on 127.0.0.1:0; yields its base URL."""
    runner = web.AppRunner(api.app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    finally:
        api.end_watches()
        await runner.cleanup()


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, bool, bool]], port: int,
                   port_name: str = "http") -> dict[str, Any]:
    """An EndpointSlice as the controller writes it; endpoints are (ip, ready, terminating)."""
    return {
        "metadata": {"name": name, "generateName": f"{service}-",
                     "labels": {"kubernetes.io/service-name": service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [ip], "conditions": {"ready": ready, "serving": ready or terminating,
                                               "terminating": terminating},
             "targetRef": {"kind": "Pod", "namespace": "llm", "name": f"{service}-{i}"}}
            for i, (ip, ready, terminating) in enumerate(endpoints)
        ],
        "ports": [{"name": port_name, "protocol": "TCP", "port": port}],
    }


def pod(name: str, ip: str, *, ready: bool = True, phase: str = "Running", deleting: bool = False,
        labels: dict[str, str] | None = None, port: int = 30000) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": labels or {"app": "sglang"}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "sglang", "image": "lmsysorg/sglang:latest",
                                 "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": phase, "podIP": ip,
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
