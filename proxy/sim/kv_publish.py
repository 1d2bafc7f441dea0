"""KV cache events from the simulated worker, on the engines' wire (``proxy.workers.kv_events``).

As SGLang's ``ZmqEventPublisher``: a PUB socket sends ``[topic, seq, payload]`` per scheduler
step that changed the cache, a ROUTER socket replays buffered batches from a sequence number and
ends with -1; the payload is SGLang's array layout ``[ts, [event, ...], dp_rank]`` with events
``["BlockStored", hashes, parent, token_ids, block_size, None]``, ``["BlockRemoved", hashes]``,
``["AllBlocksCleared"]``. Configured as SGLang's ``--kv-events-config`` JSON
(``{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}``); an
endpoint with ``*`` or ``ipc://`` binds, otherwise connects, as the engines do. The loop that
publishes is the simulator's own (the engines use a thread; the wire is the same). A worker with
data-parallel ranks has a publisher per rank, on the ports plus the rank (``publishers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from proxy.workers.kv_events import END_SEQ, offset_endpoint


@dataclass(frozen=True)
class KvEventsSettings:
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    buffer_steps: int = 10_000
    # Bind even an address the engines' rule would connect to: ports this simulator picked.
    bind: bool = False

    @classmethod
    def parse(cls, raw: str) -> KvEventsSettings:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("publisher", "zmq") not in ("zmq", "null"):
            raise ValueError('--kv-events-config: expected {"publisher": "zmq", "endpoint": ...}')
        return cls(str(doc.get("endpoint", cls.endpoint)), doc.get("replay_endpoint"), str(doc.get("topic", "")),
                   int(doc.get("buffer_steps", cls.buffer_steps)))

    def offset(self, rank: int) -> KvEventsSettings:
        """Rank ``rank`` (a data-parallel rank, or a worker of a multi-worker process) listens on
        the ports after the first's, as the engines offset theirs; port 0 stays any free port."""
        def shift(endpoint: str | None) -> str | None:
            return (offset_endpoint(endpoint, rank) or endpoint) if endpoint else endpoint
        return dataclasses.replace(self, endpoint=shift(self.endpoint) or self.endpoint,
                                   replay_endpoint=shift(self.replay_endpoint))

    def for_ranks(self, ranks: int) -> KvEventsSettings:
        """These settings with any port 0 made a free port that has ``ranks - 1`` free ports after
        it, so that every data-parallel rank can publish at its offset (``publishers``)."""
        if ranks < 2:
            return self
        def pick(endpoint: str | None) -> str | None:
            if endpoint and endpoint.startswith("tcp://") and endpoint.endswith(":0"):
                return f"{endpoint[:-2].replace('*', '127.0.0.1')}:{free_ports(ranks)}"
            return endpoint
        endpoint, replay = pick(self.endpoint) or self.endpoint, pick(self.replay_endpoint)
        if (endpoint, replay) == (self.endpoint, self.replay_endpoint):
            return self
        return dataclasses.replace(self, endpoint=endpoint, replay_endpoint=replay, bind=True)


def free_ports(n: int, attempts: int = 50) -> int:
    """The first of ``n`` consecutive TCP ports free on loopback now (a later bind may still lose
    a race: ``publishers`` tries again)."""
    for _ in range(attempts):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            if base + n > 65_536:
                continue
            try:
                for k in range(1, n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", base + k))
            except OSError:
                continue
            return base
    raise OSError(f"no {n} consecutive free ports on 127.0.0.1")


def publishers(settings: KvEventsSettings, ranks: int, attempts: int = 5) -> list[KvPublisher]:
    """One publisher per data-parallel rank, rank r at the configured ports plus r (SGLang's
    layout: each rank's scheduler publishes its own cache)."""
    for attempt in range(attempts):
        concrete = settings.for_ranks(ranks)
        opened: list[KvPublisher] = []
        try:
            for r in range(ranks):
                opened.append(KvPublisher(concrete.offset(r), dp_rank=r))
            return opened
        except zmq.ZMQError:
            for pub in opened:
                pub.discard()
            if attempt == attempts - 1 or concrete == settings:  # fixed ports: no other to try
                raise
    raise AssertionError("unreachable")


def offset_config(raw: str, rank: int) -> str:
    """``--kv-events-config`` for worker ``rank`` of a multi-worker process."""
    shifted = KvEventsSettings.parse(raw).offset(rank)
    return json.dumps({"publisher": "zmq", "endpoint": shifted.endpoint, "replay_endpoint": shifted.replay_endpoint,
                       "topic": shifted.topic, "buffer_steps": shifted.buffer_steps})


def encode_batch(events: list[list[Any]], dp_rank: int = 0, ts: float | None = None) -> bytes:
    return bytes(msgpack.packb([time.time() if ts is None else ts, events, dp_rank]))


class KvPublisher:
    def __init__(self, settings: KvEventsSettings, dp_rank: int = 0) -> None:
        self.settings, self.dp_rank = settings, dp_rank
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        try:
            self.endpoint = self._open(self.pub, settings.endpoint, settings.bind)
            if settings.replay_endpoint:
                self.router = self.ctx.socket(zmq.ROUTER)
                self.router.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = self._open(self.router, settings.replay_endpoint, settings.bind)
        except zmq.ZMQError:
            self.discard()  # a port taken: nothing of this publisher stays open
            raise
        self.topic = settings.topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=settings.buffer_steps)
        self.replays = 0
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _open(sock: zmq.asyncio.Socket, endpoint: str, bind: bool = False) -> str:
        """Bind (``bind``, ``*``, ``ipc://``, port 0 = any free port) or connect; returns where it is."""
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            host = endpoint[len("tcp://"):-2].replace("*", "127.0.0.1")
            return f"tcp://{host}:{sock.bind_to_random_port(f'tcp://{host}')}"
        if bind or "*" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            sock.bind(endpoint)
            return endpoint.replace("*", "127.0.0.1")
        sock.connect(endpoint)
        return endpoint

    async def __aenter__(self) -> KvPublisher:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        if self.router is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="kv-events replay")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.discard()

    def discard(self) -> None:
        """Close the sockets (of a publisher never started, or whose task is done)."""
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)
        self.ctx.term()

    async def publish(self, payload: bytes, seq: int | None = None) -> int:
        """Send one batch (the next sequence number unless given); returns its number."""
        if seq is not None:
            self.seq = seq
        n = self.seq
        self.seq += 1
        await self.pub.send_multipart([self.topic, n.to_bytes(8, "big"), payload])
        self.buffer.append((n, payload))
        return n

    async def publish_events(self, events: list[list[Any]]) -> int:
        return await self.publish(encode_batch(events, self.dp_rank))

    async def _serve_replay(self) -> None:
        assert self.router is not None
        while True:
            frames = await self.router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue
            client, _, start = frames
            self.replays += 1
            first = int.from_bytes(start, "big")
            for n, payload in list(self.buffer):
                if n >= first:
                    await self.router.send_multipart([client, b"", n.to_bytes(8, "big"), payload])
            await self.router.send_multipart([client, b"", END_SEQ, b""])
