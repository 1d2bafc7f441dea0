"""Worker discovery from the Kubernetes API: list, then watch, EndpointSlices or pods by label selector.

A thin client over aiohttp (no Kubernetes SDK): the two requests we need are plain HTTP.

1. **List** ``GET /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector=S`` (or
   ``/api/v1/namespaces/NS/pods``): the full set, plus the list's ``resourceVersion``.
2. **Watch** the same path with ``watch=1&resourceVersion=RV&allowWatchBookmarks=true&timeoutSeconds=T``:
   a JSON-lines stream of events, applied as ``k8s_objects`` describes. The server ends the stream
   after ``T`` seconds and we watch again from the last resourceVersion; a client-side read
   timeout a little above ``T`` catches a stream that has gone silent (the SGLang router's watches
   stalled unnoticed). ``410 Gone`` (as the response status or as an ERROR event) means our
   resourceVersion was compacted away: relist.
3. **Errors** (connection refused, 5xx, 401/403, bad JSON) keep the last known set and retry with
   exponential backoff from ``interval_s`` up to ``backoff_max_s``, with ±20 % jitter so that
   replicas do not reconnect in step. A watch that delivers events resets the backoff.

Auth: ``Authorization: Bearer`` with the service-account token, re-read on every request (projected
tokens rotate); TLS verified against ``ca_file`` when the API server is https.

``watch()`` yields the first listed set (an empty set first if that list fails, so start-up need
not wait), then each changed set. ``interval_s = 0`` lists once and stops (the off switch for tests
and one-shot tools).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from proxy.clock import Clock, MonotonicClock
from proxy.config import DiscoveryConfig
from proxy.workers import k8s_objects

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
_MAX_EVENT_BYTES = 16 * 1024 * 1024
_JITTER = 0.2
_LIST_TIMEOUT_S = 30.0


class KubernetesApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class _Relist(Exception):
    """The resourceVersion is gone; list again."""


class KubernetesSource:
    """A WorkerSource over the Kubernetes API; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        api_server: str,
        namespace: str,
        label_selector: str,
        resource: str = "endpointslices",
        port_name: str = "",
        port: int = 30000,
        scheme: str = "http",
        token_file: str = "",
        ca_file: str = "",
        watch_timeout_s: int = 240,
        interval_s: float = 1.0,
        backoff_max_s: float = 30.0,
        stall_slack_s: float = 30.0,
        sleep: Sleep = asyncio.sleep,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if resource not in ("endpointslices", "pods"):
            raise ValueError(f"resource must be endpointslices or pods, got {resource!r}")
        group = "apis/discovery.k8s.io/v1" if resource == "endpointslices" else "api/v1"
        self.path = f"/{group}/namespaces/{quote(namespace, safe='')}/{resource}"
        self.api_server = api_server.rstrip("/")
        self.label_selector = label_selector
        self.token_file = token_file
        self.ca_file = ca_file
        self.watch_timeout_s = watch_timeout_s
        self.interval_s = interval_s
        self.backoff_max_s = backoff_max_s
        # A watch silent for watch_timeout_s + this long has stalled (the server should have ended it).
        self.stall_slack_s = stall_slack_s
        self._sleep = sleep
        self._clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        extract = k8s_objects.endpointslice_urls if resource == "endpointslices" else k8s_objects.pod_urls

        def _extract(obj: k8s_objects.Obj) -> frozenset[str]:
            return extract(obj, scheme=scheme, port_name=port_name, default_port=port)

        self._extract = _extract
        # Observable state, for logs and tests: how many lists and watch connections we made.
        self.lists = 0
        self.watches = 0

    @classmethod
    def from_config(cls, cfg: DiscoveryConfig, *, namespace_file: Path = NAMESPACE_FILE) -> KubernetesSource:
        k = cfg.kubernetes
        namespace = k.namespace
        if not namespace:
            try:
                namespace = namespace_file.read_text().strip() or "default"
            except OSError:
                namespace = "default"
        return cls(
            api_server=k.api_server,
            namespace=namespace,
            label_selector=k.label_selector,
            resource=k.resource,
            port_name=k.port_name,
            port=cfg.port,
            scheme=cfg.scheme,
            token_file=k.token_file,
            ca_file=k.ca_file,
            watch_timeout_s=k.watch_timeout_s,
            interval_s=cfg.interval_s,
            backoff_max_s=k.backoff_max_s,
        )

    async def watch(self) -> AsyncIterator[frozenset[str]]:
        connector = aiohttp.TCPConnector(ssl=self._ssl_context() if self.api_server.startswith("https") else False)
        async with aiohttp.ClientSession(connector=connector) as session:
            objects = k8s_objects.ObjectSet(self._extract)
            last: frozenset[str] | None = None
            version: str | None = None
            backoff = self.interval_s
            while True:
                try:
                    if version is None:
                        version = await self._list(session, objects)
                        if objects.urls() != last:
                            last = objects.urls()
                            yield last
                        if self.interval_s <= 0:
                            return
                    delivered = 0
                    started = self._clock.now()
                    async with contextlib.aclosing(self._watch_steps(session, version, objects)) as steps:
                        async for step in steps:
                            delivered += 1
                            backoff = self.interval_s
                            version = step.resource_version or version
                            if step.action == "apply" and objects.urls() != last:
                                last = objects.urls()
                                yield last
                    # A stream that ends on schedule (timeoutSeconds) is normal: watch again now.
                    # One that ends early and empty is a misbehaving server: back off.
                    if not delivered and self._clock.now() - started < self.watch_timeout_s / 2:
                        raise KubernetesApiError(200, "watch ended early without any event")
                except _Relist as e:
                    log.info("kubernetes discovery: %s; relisting", e)
                    version = None
                except (aiohttp.ClientError, TimeoutError, KubernetesApiError, ValueError) as e:
                    if last is None:  # nothing listed yet: say "none known yet" rather than nothing
                        last = frozenset()
                        yield last
                    if self.interval_s <= 0:
                        log.warning("kubernetes discovery %s: %r (listing once only)", self.path, e)
                        return
                    log.warning(
                        "kubernetes discovery %s: %r; keeping %d workers, retrying in %.1fs",
                        self.path, e, len(last or ()), backoff,
                    )
                    await self._sleep(backoff * (1 + self._rng.uniform(-_JITTER, _JITTER)))
                    backoff = min(backoff * 2, self.backoff_max_s)

    async def _list(self, session: aiohttp.ClientSession, objects: k8s_objects.ObjectSet) -> str:
        self.lists += 1
        params = {"labelSelector": self.label_selector}
        timeout = aiohttp.ClientTimeout(total=_LIST_TIMEOUT_S)
        async with session.get(self._url(), params=params, headers=self._headers(), timeout=timeout) as resp:
            if resp.status != 200:
                raise KubernetesApiError(resp.status, (await resp.text())[:500])
            body: Any = await resp.json(content_type=None)
        if not isinstance(body, Mapping) or not isinstance(body.get("items"), list):
            raise ValueError("list response has no items")
        objects.replace_all(i for i in body["items"] if isinstance(i, Mapping))
        version = k8s_objects.resource_version(body)
        if version is None:
            raise ValueError("list response has no metadata.resourceVersion")
        return version

    async def _watch_steps(
        self, session: aiohttp.ClientSession, version: str, objects: k8s_objects.ObjectSet
    ) -> AsyncGenerator[k8s_objects.WatchStep, None]:
        self.watches += 1
        params = {
            "labelSelector": self.label_selector,
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        timeout = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=self.watch_timeout_s + self.stall_slack_s)
        async with session.get(self._url(), params=params, headers=self._headers(), timeout=timeout) as resp:
            if resp.status == 410:
                raise _Relist("watch answered 410 Gone")
            if resp.status != 200:
                raise KubernetesApiError(resp.status, (await resp.text())[:500])
            async for line in _json_lines(resp.content):
                event = json.loads(line)
                step = k8s_objects.classify_event(event)
                if step.action == "relist":
                    raise _Relist(step.detail)
                if step.action == "fail":
                    raise KubernetesApiError(200, step.detail)
                if step.action == "apply":
                    objects.apply(event["type"], event["object"])
                yield step

    def _url(self) -> str:
        return self.api_server + self.path

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.token_file:
            with contextlib.suppress(OSError):
                token = Path(self.token_file).read_text().strip()
                if token:
                    headers["Authorization"] = f"Bearer {token}"
        return headers

    def _ssl_context(self) -> ssl.SSLContext:
        if self.ca_file and Path(self.ca_file).exists():
            return ssl.create_default_context(cafile=self.ca_file)
        return ssl.create_default_context()


async def _json_lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Complete newline-terminated lines; objects can exceed aiohttp's readline limit, so split ourselves."""
    buffer = bytearray()
    async for chunk in stream.iter_any():
        buffer += chunk
        while (cut := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:cut]).strip()
            del buffer[: cut + 1]
            if line:
                yield line
        if len(buffer) > _MAX_EVENT_BYTES:
            raise ValueError(f"watch event larger than {_MAX_EVENT_BYTES} bytes")
    if buffer.strip():
        yield bytes(buffer).strip()
