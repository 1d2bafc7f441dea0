"""Routing decisions shared between proxy replicas (``routing.peers`` / ``routing.peers_dns``).

Why: N proxies in front of one fleet each see 1/N of the traffic. A proxy learns where a prefix
lives, and how much prefill is queued where, only from its own decisions, so a group's requests
spread over up to N workers, each paying the prefix's prefill, and each proxy underestimates the
load it adds to (4 proxies, shared_prefix 64x16 @128 req/s in ``loadtests/routing_sim``, 32 seeds:
TTFT p95 0.365 s against 0.110 s for one proxy). When each replica tells the others "prompt P, U
uncached tokens, went to worker W" and later "its first token is out", they record P in their
prefix index as if they had routed it, count it in their spread of new prompts, and count U as
prefill queued on W until its first token (``TtftCost.on_peer_decision`` / ``on_peer_prefilled``),
and hold a request whose prefix a peer's streamed request is still prefilling until that first
token (``Pipeline.prefilled``). In the simulation, 4 proxies told 2 ms later reach 0.119 s against
one proxy's 0.110 (32 seeds; sharing nothing 0.365).

Protocol: a WebSocket from each replica to each peer's admin port, ``GET /peer/stream`` with
``X-Radixgate-Instance: <random id>`` (and ``Authorization: Bearer <key>`` when ``routing.peer_key_env``
names a variable holding a key the replicas share; 401 otherwise). Each text message is one JSON
document::

    {"v": 1, "from": "<instance id>",
     "decisions": [{"worker": "http://w1:30000", "model": "m", "block_tokens": 16, "prompt_tokens": 2176,
                    "blocks": [<u64 chained block hash>, ...], "ref": "<rid>", "uncached": 2176,
                    "stream": true}],
     "prefilled": [{"worker": "http://w1:30000", "ref": "<rid>"}],
     "in_flight": {"http://w1:30000": 3},
     "finished": [<a finished request: proxy/diagnose/share.py>, ...]}

``in_flight``: the sender's requests dispatched and unfinished per worker, as of the message (each
replaces the last; it rides on every message, and a change with nothing else to send goes out
within ``LOAD_REFRESH_S``, 0.1 s). A replica routes a quarter of the
traffic behind 4 replicas, so its own count of a worker's requests is a quarter of the truth; on
the GPU fleet (4 engines, 6 req/s past the knee) replicas sharing decisions alone put popular groups
together (TTFT p95 1.09-2.08x one proxy's over three rounds), since a new group goes where fewer
requests are outstanding (``ttft_cost``). The receiver counts a peer's load until the peer's last
connection closes (``Policy.on_peer_load``; ``radixgate_peer_in_flight``); an older peer sends no
``in_flight`` and is not counted.

Each link pings every ``routing.peer_heartbeat_s``; a peer that stops answering (a node that
vanished without closing its connections) is noticed within that, not when TCP gives up.
One connection per peer instead of a request per batch: a message costs a few tens of µs where an
HTTP POST and its answer cost a few hundred. Sending: one task per peer writes what was decided
since its last message as soon as the loop lets it (``routing.peer_sync_interval_s`` > 0 adds a
batching wait). Best effort: a broken connection is counted and reopened with backoff (50 ms
doubling to 1 s); what queued meanwhile is sent after, the oldest dropped beyond ``MAX_BUFFERED``;
a routing hint is worth little a second later, so nothing is resent. A malformed message closes
the connection with 1007 naming the field (an oversized one, 1009). With ``routing.peers_dns`` the
peers are every address of a headless Service over the replicas, at ``routing.peers_port``
(default: our admin port); a replica that is offered its own instance id answers 409 and the
sender drops that address. Peers must name workers by the same URLs (they do when they share a
config or a discovery source); a decision naming a worker the receiver does not know is ignored.

``finished`` (``diagnose.fleet_view``): the sender's requests that ended since its last message,
at most ``MAX_FINISHED_PER_MESSAGE`` a message (the rest follow at once), so each replica's
diagnosis window holds the fleet's traffic; a sender that shares none omits the field, and its
routed requests are then only counted (``decisions_since``, the diagnosis says what it misses).

``encode`` / ``decode`` are pure; ``PeerSync`` owns the links and the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, NamedTuple

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web

from proxy.clock import Clock, MonotonicClock
from proxy.config import RoutingConfig
from proxy.diagnose.share import from_wire, to_wire
from proxy.diagnose.window import RequestRecord
from proxy.errors import BadRequest
from proxy.routing.base import Policy, RouteRequest, summed_in_flight
from proxy.routing.prefix_key import uncached_tokens
from proxy.security import ApiKeys, presented_key
from proxy.telemetry.metrics import Metrics
from proxy.workers.discovery_dns import DnsSource
from proxy.workers.scrape import MAX_DP

log = logging.getLogger("radixgate.peers")

PATH = "/peer/stream"
INSTANCE_HEADER = "X-Radixgate-Instance"
VERSION = 1
# Items kept per peer between POSTs (oldest dropped beyond), and accepted in one POST.
MAX_BUFFERED = 4096
MAX_ITEMS_PER_POST = MAX_BUFFERED
MIN_BACKOFF_S, MAX_BACKOFF_S = 0.05, 1.0
# Bounds one POST body: 4096 decisions x 2048 hashes would be ~170 MB; real prompts need far less.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_BLOCKS = 4096
MAX_WORKERS = 4096  # entries of one message's in_flight
MAX_DP_RANKS = MAX_DP  # a decision's dp_rank is below it (scrape.py's bound on a worker's dp_size)
MAX_IN_FLIGHT = 65536  # our own requests remembered as in flight (far above admission's bounds)
# A changed in-flight count with nothing else to send goes out this often at most.
LOAD_REFRESH_S = 0.1
# Finished requests per message (diagnose.fleet_view): ~3 KB each for 2k-token prompts, ~110 KB
# at share.py's bounds, so a message of them stays under half of MAX_BODY_BYTES even then.
MAX_FINISHED_PER_MESSAGE = 32
_U64 = 1 << 64


class Placement(NamedTuple):
    """One routing decision as peers hear it: ``route`` went to ``worker`` with ``uncached`` tokens
    to prefill there; ``ref`` (the request id) names it in a later ``Prefilled``."""

    worker: str
    route: RouteRequest
    ref: str = ""
    uncached: int = 0
    dp_rank: int | None = None  # the worker's DP rank it was sent to (routing.dp_ranks), if one


class Prefilled(NamedTuple):
    worker: str
    ref: str


class Message(NamedTuple):
    sender: str
    decisions: list[Placement]
    prefilled: list[Prefilled]
    # The sender's requests in flight per worker when it wrote this (None: not told).
    in_flight: dict[str, int] | None = None
    # Its requests finished since its last message, on the receiver's clock (None: it shares none).
    finished: list[RequestRecord] | None = None


def encode(decisions: Iterable[Placement], prefilled: Iterable[Prefilled] = (), sender: str = "",
           in_flight: Mapping[str, int] | None = None,
           finished: Iterable[RequestRecord] | None = None, now: float = 0.0) -> bytes:
    """One message; ``finished`` records are aged at our clock time ``now``."""
    doc: dict[str, Any] = {
        "v": VERSION, "from": sender,
        "decisions": [{"worker": d.worker, "model": d.route.model, "block_tokens": d.route.block_tokens,
                       "prompt_tokens": d.route.prompt_tokens, "blocks": list(d.route.block_hashes),
                       "ref": d.ref, "uncached": d.uncached, "stream": d.route.stream,
                       **({"dp_rank": d.dp_rank} if d.dp_rank is not None else {})} for d in decisions],
        "prefilled": [{"worker": p.worker, "ref": p.ref} for p in prefilled],
    }
    if in_flight is not None:
        doc["in_flight"] = dict(in_flight)
    if finished is not None:
        doc["finished"] = [to_wire(r, now) for r in finished]
    return json.dumps(doc, separators=(",", ":")).encode()


def decode(body: bytes, now: float = 0.0) -> Message:
    """One message; ``BadRequest`` names the first bad field. ``finished`` records are placed on
    our clock as of ``now`` (when it arrived)."""
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
    items, notices = doc.get("decisions", []), doc.get("prefilled", [])
    for name, value in (("decisions", items), ("prefilled", notices)):
        if not isinstance(value, list):
            raise BadRequest(f"{name}: expected a list")
        if len(value) > MAX_ITEMS_PER_POST:
            raise BadRequest(f"{name}: at most {MAX_ITEMS_PER_POST} per request, got {len(value)}")
    finished = doc.get("finished")
    if finished is not None and (not isinstance(finished, list) or len(finished) > MAX_FINISHED_PER_MESSAGE):
        raise BadRequest(f"finished: expected a list of at most {MAX_FINISHED_PER_MESSAGE} requests")
    return Message(sender, [_decision(i, item) for i, item in enumerate(items)],
                   [_prefilled(i, item) for i, item in enumerate(notices)], _in_flight(doc.get("in_flight")),
                   None if finished is None else [from_wire(item, now, peer=sender or "peer", where=f"finished[{i}]")
                                                  for i, item in enumerate(finished)])


def _in_flight(value: Any) -> dict[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) > MAX_WORKERS:
        raise BadRequest(f"in_flight: expected an object of at most {MAX_WORKERS} worker URLs")
    for url, n in value.items():
        if not url:
            raise BadRequest("in_flight: expected worker URLs as keys")
        _int(n, f"in_flight[{url!r}]")
    return dict(value)


def _decision(i: int, item: Any) -> Placement:
    where = f"decisions[{i}]"
    if not isinstance(item, Mapping):
        raise BadRequest(f"{where}: expected an object")
    worker, model, blocks, ref = item.get("worker"), item.get("model"), item.get("blocks"), item.get("ref", "")
    if not isinstance(worker, str) or not worker:
        raise BadRequest(f"{where}.worker: expected a worker URL")
    if not isinstance(model, str):
        raise BadRequest(f"{where}.model: expected a string")
    if not isinstance(ref, str):
        raise BadRequest(f"{where}.ref: expected a string")
    block_tokens = _int(item.get("block_tokens"), f"{where}.block_tokens", least=1)
    prompt_tokens = _int(item.get("prompt_tokens"), f"{where}.prompt_tokens")
    uncached = _int(item.get("uncached", 0), f"{where}.uncached")
    dp_rank = item.get("dp_rank")
    if dp_rank is not None and not (type(dp_rank) is int and 0 <= dp_rank < MAX_DP_RANKS):
        raise BadRequest(f"{where}.dp_rank: expected an integer in [0, {MAX_DP_RANKS}), got {dp_rank!r}")
    stream = item.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(f"{where}.stream: expected true or false")
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise BadRequest(f"{where}.blocks: expected a list of at most {MAX_BLOCKS} block hashes")
    for h in blocks:
        if type(h) is not int or not 0 <= h < _U64:
            raise BadRequest(f"{where}.blocks: expected unsigned 64-bit integers, got {h!r}")
    route = RouteRequest(model=model, block_hashes=tuple(blocks), block_tokens=block_tokens,
                         prompt_tokens=prompt_tokens, stream=stream)
    return Placement(worker, route, ref, uncached, dp_rank)


def _prefilled(i: int, item: Any) -> Prefilled:
    where = f"prefilled[{i}]"
    if not isinstance(item, Mapping) or not isinstance(item.get("worker"), str) or not isinstance(item.get("ref"), str):
        raise BadRequest(f"{where}: expected {{\"worker\": <url>, \"ref\": <string>}}")
    return Prefilled(item["worker"], item["ref"])


def _int(value: Any, field: str, *, least: int = 0) -> int:
    if type(value) is not int or value < least:
        raise BadRequest(f"{field}: expected an integer >= {least}, got {value!r}")
    return value


class _Link:
    """What is waiting for one peer, and its sender task."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.decisions: deque[Placement] = deque(maxlen=MAX_BUFFERED)
        self.prefilled: deque[Prefilled] = deque(maxlen=MAX_BUFFERED)
        self.finished: deque[RequestRecord] = deque(maxlen=MAX_BUFFERED)
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.connected = False
        # The in-flight counts this connection last carried (None: none yet on it).
        self.told: dict[str, int] | None = None

    def take(self) -> tuple[list[Placement], list[Prefilled], list[RequestRecord]]:
        decisions, prefilled = list(self.decisions), list(self.prefilled)
        self.decisions.clear()
        self.prefilled.clear()
        finished = [self.finished.popleft() for _ in range(min(MAX_FINISHED_PER_MESSAGE, len(self.finished)))]
        if self.finished:
            self.wake.set()  # the rest in the next message, at once
        return decisions, prefilled, finished


class PeerSync:
    """Sends this proxy's decisions to its peers (``pipeline.RouteListener``) and applies theirs."""

    def __init__(self, config: RoutingConfig, policy: Policy, metrics: Metrics,
                 key: str | None = None, instance: str | None = None,
                 prefill_ended: Callable[[Hashable], None] = lambda key: None,
                 clock: Clock | None = None,
                 on_record: Callable[[RequestRecord], None] | None = None) -> None:
        self.config = config
        self._clock = clock or MonotonicClock()
        # (when, how many) of the peers' decisions applied: the diagnosis's view of the fleet's
        # traffic beyond ours (``decisions_since``); bounded, so a count over a long window is a floor.
        self._heard: deque[tuple[float, int]] = deque(maxlen=MAX_BUFFERED)
        self.instance = instance or uuid.uuid4().hex
        self.policy, self.metrics, self._key = policy, metrics, key
        # Told when a peer's request has its first token (App: the pipeline's holds, which release
        # requests held for that prefix).
        self.prefill_ended = prefill_ended
        # diagnose.fleet_view: where the peers' finished requests go (App: the diagnosis window);
        # set, we share ours too (``share``). None: neither.
        self.on_record = on_record
        # routing.dp_ranks: where a peer's request went among a worker's DP ranks (App: the
        # pipeline's rank book, so this replica sends that prefix's followers to the same rank)
        self.on_rank: Callable[[str, RouteRequest, int], None] | None = None
        self._accepted = ApiKeys([key] if key else [])
        self._static = frozenset(p.rstrip("/") for p in config.peers)
        self._discovered: frozenset[str] = frozenset()
        self._myself: set[str] = set()  # peer URLs that answered with our own instance id
        self._links: dict[str, _Link] = {}
        self._session: aiohttp.ClientSession | None = None
        self._dns_task: asyncio.Task[None] | None = None
        self._inbound: set[web.WebSocketResponse] = set()
        # Our requests in flight, by request id -> worker (what peers hear as our load), and the
        # peers' open connections to us, per instance id (the last one closing = that peer is gone).
        self._mine: dict[str, str] = {}
        self._counts: dict[str, int] = {}  # the same, counted per worker
        self._peer_links: dict[str, int] = {}
        self._loads: dict[str, dict[str, int]] = {}  # peer -> its last in_flight (the gauge)

    @property
    def enabled(self) -> bool:
        return bool(self._static or self.config.peers_dns)

    @property
    def peers(self) -> list[str]:
        return sorted((self._static | self._discovered) - self._myself)

    # -- pipeline.RouteListener -------------------------------------------------------------------
    def routed(self, worker: str, route: RouteRequest, matched_blocks: int, rid: str,
               dp_rank: int | None = None) -> None:
        self._count(self._mine.pop(rid, None), -1)  # a retry moves it
        self._mine[rid] = worker
        self._count(worker, 1)
        if len(self._mine) > MAX_IN_FLIGHT:  # an end never told (a bug) must not grow the load forever
            oldest = next(iter(self._mine))
            self._count(self._mine.pop(oldest), -1)
        if not route.block_hashes:
            return  # no prompt to tell of; its load goes with the next message
        decision = Placement(worker, route, rid, uncached_tokens(route, matched_blocks), dp_rank)
        for link in self._links.values():
            if len(link.decisions) == MAX_BUFFERED:
                self.metrics.inc(self.metrics.peer_decisions_dropped)
            link.decisions.append(decision)
            link.wake.set()

    def prefilled(self, worker: str, rid: str) -> None:
        notice = Prefilled(worker, rid)
        for link in self._links.values():
            link.prefilled.append(notice)
            link.wake.set()

    def finished(self, worker: str, rid: str) -> None:
        # No message of its own: the count rides on the next decision's, or the link's refresh
        # (LOAD_REFRESH_S) sends it (a message per end cost 25% more messages in bench_peers).
        was = self._mine.pop(rid, None)
        if was is not None:
            self._count(was, -1)

    def share(self, record: RequestRecord) -> None:
        """One of our finished requests, for every peer's diagnosis (``diagnose.fleet_view``)."""
        if self.on_record is None:
            return  # not sharing (only our own records come here: DiagnosisService.observe)
        for link in self._links.values():
            if len(link.finished) == MAX_BUFFERED:
                self.metrics.inc(self.metrics.peer_records_dropped)
            # no wake: it rides on the next decision's message, or the link's refresh within
            # LOAD_REFRESH_S (a message per end cost 25% more messages in bench_peers)
            link.finished.append(record)

    def _count(self, worker: str | None, delta: int) -> None:
        if worker is None:
            return
        n = self._counts.get(worker, 0) + delta
        if n > 0:
            self._counts[worker] = n
        else:
            self._counts.pop(worker, None)

    def in_flight(self) -> dict[str, int]:
        """Our requests in flight per worker (what each message tells the peers)."""
        return dict(self._counts)

    def decisions_since(self, t: float) -> int:
        """Requests our peers routed (their decisions we applied) since clock time ``t``."""
        return sum(n for at, n in self._heard if at >= t)

    def peer_in_flight(self) -> dict[str, int]:
        """What our connected peers last said they have in flight, summed per worker."""
        return summed_in_flight(self._loads.values())

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, admin_port: int) -> None:
        """Start the peer links (and follow ``peers_dns``); ``admin_port``: ours, the peers' default."""
        if not self.enabled or self._session is not None:
            return
        headers = {INSTANCE_HEADER: self.instance}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        # Bound the connect, not the connection: a link lives as long as the peer does.
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.peer_timeout_s)
        self._session = aiohttp.ClientSession(headers=headers, timeout=timeout)
        self._sync_links()
        if self.config.peers_dns:
            dns = DnsSource(self.config.peers_dns, port=self.config.peers_port or admin_port,
                            interval_s=self.config.peers_dns_interval_s)
            self._dns_task = asyncio.get_running_loop().create_task(self._follow(dns))

    async def stop(self) -> None:
        """Close our links and the peers' connections to us (before the admin server stops)."""
        tasks = [link.task for link in self._links.values() if link.task is not None]
        if self._dns_task is not None:
            tasks.append(self._dns_task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._links.clear()
        self._dns_task = None
        for ws in list(self._inbound):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"radixgate is stopping")
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _sync_links(self) -> None:
        wanted = set(self.peers)
        for url in [u for u in self._links if u not in wanted]:
            link = self._links.pop(url)
            if link.task is not None:
                link.task.cancel()
        loop = asyncio.get_running_loop()
        for url in wanted - self._links.keys():
            link = self._links[url] = _Link(url)
            link.task = loop.create_task(self._send_loop(link))

    async def _follow(self, dns: DnsSource) -> None:
        async for urls in dns.watch():
            self._discovered = urls
            self._sync_links()
            log.info("peers from %s: %s", self.config.peers_dns, ", ".join(sorted(urls)) or "none")

    async def _send_loop(self, link: _Link) -> None:
        backoff = MIN_BACKOFF_S
        while True:
            outcome = await self._connect_and_send(link)
            self.metrics.inc(self.metrics.peer_messages, link.url, outcome)
            if outcome == "self":
                self._myself.add(link.url)
                self._links.pop(link.url, None)
                return
            log.debug("peer %s: %s", link.url, outcome)
            if link.connected:
                backoff, link.connected = MIN_BACKOFF_S, False
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    async def _connect_and_send(self, link: _Link) -> str:
        """Hold one connection to the peer and write to it until it breaks; why it ended."""
        assert self._session is not None
        heartbeat = self.config.peer_heartbeat_s or None
        try:
            async with self._session.ws_connect(link.url + PATH, heartbeat=heartbeat) as ws:
                link.connected = True
                link.told = None  # a new connection: the peer has no counts of ours on it yet
                link.wake.set()
                reader = asyncio.get_running_loop().create_task(_drain(ws, link))
                try:
                    while True:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(link.wake.wait(), LOAD_REFRESH_S)
                        link.wake.clear()
                        if self.config.peer_sync_interval_s > 0:
                            await asyncio.sleep(self.config.peer_sync_interval_s)
                        decisions, prefilled, finished = link.take()
                        if ws.closed:
                            return "closed"
                        counts = self.in_flight()
                        if decisions or prefilled or finished or counts != link.told:
                            sharing = finished if self.on_record is not None else None
                            await ws.send_bytes(encode(decisions, prefilled, self.instance, counts,
                                                       sharing, self._clock.now()))
                            link.told = counts
                            self.metrics.inc(self.metrics.peer_messages, link.url, "ok")
                finally:
                    reader.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await reader
        except aiohttp.WSServerHandshakeError as e:
            return "self" if e.status == 409 else f"http_{e.status}"
        except TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, ConnectionError):
            return "connect_error"

    # -- receiving --------------------------------------------------------------------------------
    async def handle(self, request: web.Request) -> web.StreamResponse:
        """``GET /peer/stream`` on the admin port: a peer's WebSocket."""
        if self._accepted and not self._accepted.accepts(presented_key(request.headers.get("Authorization"), None)):
            self.metrics.inc(self.metrics.peer_received, "unauthorized")
            return _error(401, "missing or wrong peer key (Authorization: Bearer <routing.peer_key_env>)")
        if request.headers.get(INSTANCE_HEADER) == self.instance:
            self.metrics.inc(self.metrics.peer_received, "self")
            return _error(409, "this is the connecting replica itself (it is listed among its own peers)")
        ws = web.WebSocketResponse(max_msg_size=MAX_BODY_BYTES)
        await ws.prepare(request)
        self._inbound.add(ws)
        # Its load is keyed by the connection's instance id (one without: by the connection).
        peer = request.headers.get(INSTANCE_HEADER) or f"connection-{id(ws)}"
        self._peer_links[peer] = self._peer_links.get(peer, 0) + 1
        try:
            async for msg in ws:
                if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                    break
                try:
                    message = decode(msg.data if isinstance(msg.data, bytes) else msg.data.encode(),
                                     self._clock.now())
                except BadRequest as e:
                    self.metrics.inc(self.metrics.peer_received, "bad_request")
                    await ws.close(code=WSCloseCode.INVALID_TEXT, message=e.message.encode()[:120])
                    break
                self._apply(message, peer)
            if ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
                self.metrics.inc(self.metrics.peer_received, "too_large")
        finally:
            self._inbound.discard(ws)
            left = self._peer_links.pop(peer, 1) - 1
            if left:
                self._peer_links[peer] = left
            else:  # its last connection: what it had in flight no longer counts
                self._loads.pop(peer, None)
                self.policy.on_peer_load(peer, {})
        return ws

    def _apply(self, message: Message, peer: str) -> None:
        if message.in_flight is not None:
            self._loads[peer] = message.in_flight
            self.policy.on_peer_load(peer, message.in_flight)
        for d in message.decisions:
            self.policy.on_peer_decision(d.worker, d.route, d.uncached, (message.sender, d.ref))
            if d.dp_rank is not None and self.on_rank is not None:
                self.on_rank(d.worker, d.route, d.dp_rank)
        for n in message.prefilled:
            key = (message.sender, n.ref)
            self.policy.on_peer_prefilled(n.worker, key)
            self.prefill_ended(key)
        self.metrics.inc(self.metrics.peer_received, "applied", amount=len(message.decisions))
        if message.finished is not None and self.on_record is not None:
            for record in message.finished:
                self.on_record(record)
            self.metrics.inc(self.metrics.peer_received, "finished", amount=len(message.finished))
        elif message.decisions:  # a peer that tells us none of its requests: count what we miss
            self._heard.append((self._clock.now(), len(message.decisions)))
        if message.prefilled:
            self.metrics.inc(self.metrics.peer_received, "prefilled", amount=len(message.prefilled))


async def _drain(ws: aiohttp.ClientWebSocketResponse, link: _Link) -> None:
    """Read the peer's side of a link until it ends (the peer closed it, or the heartbeat gave up on
    a silent peer), then wake the sender, so it reconnects now rather than at its next decision."""
    async for _ in ws:
        pass
    link.wake.set()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)
