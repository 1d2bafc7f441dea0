"""Pure rules for Kubernetes discovery: which objects name which workers, and what a watch event means.

No I/O here; ``discovery_k8s`` feeds list and watch payloads through these functions.

Which endpoints count (ready pods only, never a terminating one):

* **EndpointSlice** (``discovery.k8s.io/v1``): each endpoint whose ``conditions.ready`` is true or
  absent (the API says nil means ready) and whose ``conditions.terminating`` is not true; its first
  address (the EndpointSlice controller writes exactly one per endpoint). The port is the slice
  port named ``port_name``, or ``default_port`` when no name is configured; a slice without that
  named port contributes nothing.
* **Pod**: ``status.phase == Running``, a ``Ready`` condition with status ``True``, a ``podIP`` and
  no ``metadata.deletionTimestamp`` (a pod being deleted leaves at once, not when it is gone). The
  port is the container port named ``port_name``, else ``default_port``.

``ObjectSet`` keeps the URLs contributed by each object, keyed by namespace/name, so that a
MODIFIED event replaces that object's share and a DELETED event removes it: deletes are never
dropped (the SGLang router's watcher lost them, ``sglang-protocol.md`` §7 item 10). A relist
replaces the whole map, which also repairs anything missed while disconnected.

Watch events (``{"type": ..., "object": ...}`` JSON lines): ADDED / MODIFIED / DELETED apply to the
set and advance the resourceVersion; BOOKMARK only advances it; ERROR with a Status of code 410
("Gone": our resourceVersion is too old) means relist; any other ERROR ends the stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.workers.discovery import worker_url

Obj = Mapping[str, Any]
Extract = Callable[[Obj], frozenset[str]]


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def endpointslice_urls(obj: Obj, *, scheme: str, port_name: str, default_port: int) -> frozenset[str]:
    if port_name:
        named = [p.get("port") for p in _list(obj.get("ports")) if _dict(p).get("name") == port_name]
        if not named or not isinstance(named[0], int):
            return frozenset()
        port = named[0]
    else:
        port = default_port
    urls = set()
    for endpoint in _list(obj.get("endpoints")):
        conditions = _dict(_dict(endpoint).get("conditions"))
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        addresses = _list(_dict(endpoint).get("addresses"))
        if addresses and isinstance(addresses[0], str):
            urls.add(worker_url(scheme, addresses[0], port))
    return frozenset(urls)


def pod_urls(obj: Obj, *, scheme: str, port_name: str, default_port: int) -> frozenset[str]:
    metadata, status = _dict(obj.get("metadata")), _dict(obj.get("status"))
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return frozenset()
    ready = any(
        _dict(c).get("type") == "Ready" and _dict(c).get("status") == "True" for c in _list(status.get("conditions"))
    )
    pod_ip = status.get("podIP")
    if not ready or not isinstance(pod_ip, str) or not pod_ip:
        return frozenset()
    port = default_port
    if port_name:
        found = [
            p.get("containerPort")
            for c in _list(_dict(obj.get("spec")).get("containers"))
            for p in _list(_dict(c).get("ports"))
            if _dict(p).get("name") == port_name
        ]
        if not found or not isinstance(found[0], int):
            return frozenset()
        port = found[0]
    return frozenset({worker_url(scheme, pod_ip, port)})


def object_key(obj: Obj) -> str:
    metadata = _dict(obj.get("metadata"))
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def resource_version(obj: Obj) -> str | None:
    value = _dict(obj.get("metadata")).get("resourceVersion")
    return value if isinstance(value, str) and value else None


class ObjectSet:
    """The URLs each watched object contributes; ``urls()`` is their union."""

    def __init__(self, extract: Extract) -> None:
        self._extract = extract
        self._by_key: dict[str, frozenset[str]] = {}

    def replace_all(self, items: Iterable[Obj]) -> None:
        self._by_key = {object_key(item): self._extract(item) for item in items}

    def apply(self, event_type: str, obj: Obj) -> None:
        key = object_key(obj)
        if event_type == "DELETED":
            self._by_key.pop(key, None)
        else:
            self._by_key[key] = self._extract(obj)

    def urls(self) -> frozenset[str]:
        return frozenset().union(*self._by_key.values()) if self._by_key else frozenset()

    def __len__(self) -> int:
        return len(self._by_key)


@dataclass(frozen=True)
class WatchStep:
    """What one watch event asks of the caller."""

    action: Literal["apply", "bookmark", "relist", "fail"]
    resource_version: str | None = None
    detail: str = ""


def classify_event(event: Any) -> WatchStep:
    if not isinstance(event, Mapping):
        return WatchStep("fail", detail=f"watch event is not an object: {event!r:.200}")
    kind, obj = event.get("type"), _dict(event.get("object"))
    if kind in ("ADDED", "MODIFIED", "DELETED"):
        return WatchStep("apply", resource_version(obj))
    if kind == "BOOKMARK":
        return WatchStep("bookmark", resource_version(obj))
    if kind == "ERROR":
        if obj.get("code") == 410:
            return WatchStep("relist", detail=str(obj.get("message", "resourceVersion too old")))
        return WatchStep("fail", detail=f"watch error {obj.get('code')}: {obj.get('message', '')}")
    return WatchStep("fail", detail=f"unknown watch event type {kind!r}")
