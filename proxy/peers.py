"""Routing decisions shared between proxy replicas (``routing.peers``).

Why: N proxies in front of one fleet each see 1/N of the traffic. A proxy learns where a prefix
lives only from its own decisions, so a group's requests spread over up to N workers, each paying
the prefix's prefill (4 proxies, shared_prefix 64x16 @128 req/s in ``loadtests/routing_sim``, 16
seeds: TTFT p95 0.314 s against 0.135 s for one proxy). When each replica tells the others
"prompt P went to worker W", they record it in their prefix index as if they had routed it, and
count it in their spread of new prompts: 0.166 s with 20 ms flushes; on 150x5 6000/1200/1000
@6 req/s, 0.203 s against one proxy's 0.201 (0.388 s sharing nothing).

Protocol: every ``routing.peer_sync_interval_s`` the decisions taken since the last flush go to
each peer's admin port, ``POST /peer/decisions``, as JSON::

    {"v": 1, "from": "<instance id>", "decisions": [{"worker": "http://w1:30000", "model": "m",
      "block_tokens": 16, "prompt_tokens": 2176, "blocks": [<u64 chained block hash>, ...]}]}

plus ``"from": <this replica's random instance id>``, and with ``Authorization: Bearer <key>``
when ``routing.peer_key_env`` names an environment variable holding a shared key (the receiver
then refuses others with 401). Peers are ``routing.peers`` and, with ``routing.peers_dns``, every
address of a headless Service over the replicas; a replica that receives its own instance id
answers 409, and the sender drops that URL (itself) from its peers. Peers must name workers by the
same URLs (they do when they share a config or a discovery source); a decision naming a worker the
receiver does not know is ignored. Best effort by design: a routing hint is worth something for a
few hundred milliseconds, so a failed POST is counted and dropped, never retried, and a full
buffer (``MAX_BUFFERED``) drops its oldest decision.

``encode`` / ``decode`` are pure; ``PeerSync`` owns the buffer, the flush loop and the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp
from aiohttp import web

from proxy.config import RoutingConfig
from proxy.errors import BadRequest
from proxy.routing.base import RouteRequest
from proxy.telemetry.metrics import Metrics
from proxy.workers.discovery_dns import DnsSource

log = logging.getLogger("radixgate.peers")

PATH = "/peer/decisions"
VERSION = 1
# Decisions kept between flushes (oldest dropped beyond), and accepted in one POST.
MAX_BUFFERED = 4096
MAX_DECISIONS_PER_POST = MAX_BUFFERED
# Bounds one POST body: 4096 decisions x 2048 hashes would be ~170 MB; real prompts need far less.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_BLOCKS = 4096
_U64 = 1 << 64

Decision = tuple[str, RouteRequest]


def encode(decisions: Iterable[Decision], sender: str = "") -> bytes:
    return json.dumps({"v": VERSION, "from": sender, "decisions": [
        {"worker": worker, "model": r.model, "block_tokens": r.block_tokens, "prompt_tokens": r.prompt_tokens,
         "blocks": list(r.block_hashes)}
        for worker, r in decisions]}, separators=(",", ":")).encode()


def decode(body: bytes) -> tuple[str, list[Decision]]:
    """(sender id, the decisions) of one POST body; ``BadRequest`` names the first bad field."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"body: not JSON ({e})") from None
    if not isinstance(doc, Mapping):
        raise BadRequest("body: expected a JSON object")
    if doc.get("v") != VERSION:
        raise BadRequest(f"v: expected {VERSION}, got {doc.get('v')!r}")
    sender = doc.get("from", "")
    if not isinstance(sender, str):
        raise BadRequest("from: expected a string")
    items = doc.get("decisions")
    if not isinstance(items, list):
        raise BadRequest("decisions: expected a list")
    if len(items) > MAX_DECISIONS_PER_POST:
        raise BadRequest(f"decisions: at most {MAX_DECISIONS_PER_POST} per request, got {len(items)}")
    return sender, [_decision(i, item) for i, item in enumerate(items)]


def _decision(i: int, item: Any) -> Decision:
    where = f"decisions[{i}]"
    if not isinstance(item, Mapping):
        raise BadRequest(f"{where}: expected an object")
    worker, model, blocks = item.get("worker"), item.get("model"), item.get("blocks")
    if not isinstance(worker, str) or not worker:
        raise BadRequest(f"{where}.worker: expected a worker URL")
    if not isinstance(model, str):
        raise BadRequest(f"{where}.model: expected a string")
    block_tokens = _positive_int(item.get("block_tokens"), f"{where}.block_tokens")
    prompt_tokens = _positive_int(item.get("prompt_tokens"), f"{where}.prompt_tokens", allow_zero=True)
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise BadRequest(f"{where}.blocks: expected a list of at most {MAX_BLOCKS} block hashes")
    for h in blocks:
        if type(h) is not int or not 0 <= h < _U64:
            raise BadRequest(f"{where}.blocks: expected unsigned 64-bit integers, got {h!r}")
    return worker, RouteRequest(model=model, block_hashes=tuple(blocks), block_tokens=block_tokens,
                                prompt_tokens=prompt_tokens)


def _positive_int(value: Any, field: str, *, allow_zero: bool = False) -> int:
    if type(value) is not int or value < (0 if allow_zero else 1):
        raise BadRequest(f"{field}: expected a {'non-negative' if allow_zero else 'positive'} integer, got {value!r}")
    return value


class PeerSync:
    """Sends this proxy's decisions to its peers and applies theirs to the policy."""

    def __init__(self, config: RoutingConfig, apply: Callable[[str, RouteRequest], None], metrics: Metrics,
                 key: str | None = None, instance: str | None = None) -> None:
        self.config = config
        self.instance = instance or uuid.uuid4().hex
        self.interval_s = config.peer_sync_interval_s
        self._apply, self.metrics, self._key = apply, metrics, key
        self._static = frozenset(p.rstrip("/") for p in config.peers)
        self._discovered: frozenset[str] = frozenset()
        self._myself: set[str] = set()  # peer URLs that answered with our own instance id
        self._buffer: deque[Decision] = deque(maxlen=MAX_BUFFERED)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def enabled(self) -> bool:
        return bool(self._static or self.config.peers_dns) and self.interval_s > 0

    @property
    def peers(self) -> list[str]:
        return sorted((self._static | self._discovered) - self._myself)

    def publish(self, worker: str, route: RouteRequest) -> None:
        """Called once per routing decision (pipeline); sent at the next flush."""
        if not route.block_hashes:
            return
        if len(self._buffer) == MAX_BUFFERED:
            self.metrics.inc(self.metrics.peer_decisions_dropped)
        self._buffer.append((worker, route))

    async def start(self, admin_port: int) -> None:
        """Start flushing (and following ``peers_dns``); ``admin_port``: ours, the peers' default."""
        if not self.enabled or self._tasks:
            return
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        self._session = aiohttp.ClientSession(headers=headers,
                                              timeout=aiohttp.ClientTimeout(total=self.config.peer_timeout_s))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._run()))
        if self.config.peers_dns:
            dns = DnsSource(self.config.peers_dns, port=self.config.peers_port or admin_port,
                            interval_s=self.config.peers_dns_interval_s)
            self._tasks.append(loop.create_task(self._follow(dns)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _follow(self, dns: DnsSource) -> None:
        async for urls in dns.watch():
            self._discovered = urls
            log.info("peers from %s: %s", self.config.peers_dns, ", ".join(sorted(urls)) or "none")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Send what is buffered to every peer at once; failures are counted, not retried."""
        if not self._buffer or self._session is None:
            return
        body = encode(self._buffer, self.instance)
        self._buffer.clear()
        await asyncio.gather(*(self._post(peer, body) for peer in self.peers))

    async def _post(self, peer: str, body: bytes) -> None:
        assert self._session is not None
        try:
            async with self._session.post(peer + PATH, data=body) as resp:
                await resp.read()
                outcome = {204: "ok", 409: "self"}.get(resp.status, f"http_{resp.status}")
        except TimeoutError:
            outcome = "timeout"
        except aiohttp.ClientError:
            outcome = "connect_error"
        if outcome == "self":
            self._myself.add(peer)
        elif outcome != "ok":
            log.debug("peer %s: %s", peer, outcome)
        self.metrics.inc(self.metrics.peer_posts, peer, outcome)

    async def handle(self, request: web.Request) -> web.Response:
        """``POST /peer/decisions`` on the admin port."""
        if self._key is not None and not _authorized(request.headers.get("Authorization"), self._key):
            self.metrics.inc(self.metrics.peer_received, "unauthorized")
            return _error(401, "missing or wrong peer key (Authorization: Bearer <routing.peer_key_env>)")
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            self.metrics.inc(self.metrics.peer_received, "too_large")
            return _error(413, f"body over {MAX_BODY_BYTES} bytes")
        try:
            body = await request.content.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                self.metrics.inc(self.metrics.peer_received, "too_large")
                return _error(413, f"body over {MAX_BODY_BYTES} bytes")
            sender, decisions = decode(body)
        except BadRequest as e:
            self.metrics.inc(self.metrics.peer_received, "bad_request")
            return _error(400, e.message)
        if sender == self.instance:
            self.metrics.inc(self.metrics.peer_received, "self")
            return _error(409, "these decisions came from this replica (it is listed among its own peers)")
        for worker, route in decisions:
            self._apply(worker, route)
        self.metrics.inc(self.metrics.peer_received, "applied", amount=len(decisions))
        return web.Response(status=204)


def _authorized(header: str | None, key: str) -> bool:
    scheme, _, presented = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), key.encode())


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)
