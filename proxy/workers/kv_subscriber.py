"""Follow one worker's KV event stream (ZeroMQ SUB, replay through its ROUTER) into its table.

State, per worker (``state``, exported by ``/workers`` and a metric):
* ``connecting``: no batch yet. The table stays empty and routing uses the approximate index.
* ``live``: every batch since the first applied in order; the table is what the engine holds
  (less what it stored before we joined and the replay buffer no longer had).
* ``resynced``: a gap (a lost batch: PUB drops when a subscriber is slow or joins late) that the
  replay socket could not fill, or an engine restart (its sequence went back): the table was
  cleared and refills from the next batches. Blocks stored before then are unknown, so the table
  under-counts (a recompute, never a wrong promise); it is still the engine's truth for
  everything stored since, so routing keeps using it.
* ``failed``: the endpoint sent what is not a KV event stream (a malformed frame or batch); the
  table is cleared and not used until a well-formed batch arrives.
* ``unconfirmed`` (``route_state``; the transport is live or resynced): prompts the engine has
  prefilled do not show in the stream (``kv_trust.py``): a publisher that stopped looking, or
  blocks named by other tokens than the proxy's. Routing uses the approximate index until the
  stream confirms them again.
Gap repair: on a sequence number past the next expected one (or a first one past 0), ask the
replay socket for everything from the next expected one, apply what it returns in order, then the
batch that showed the gap. The replay is bounded by ``replay_timeout_s`` of the injected clock.

Hostile publishers: ``zmq.MAXMSGSIZE`` drops any message over the payload cap at the transport,
the receive high-water mark bounds the queue, a multipart of the wrong shape or an undecodable
batch is counted (``errors``) and never applied in part, and the table itself is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from proxy.clock import Clock
from proxy.routing.kv_index import EngineBlocks
from proxy.workers.kv_events import (
    DEFAULT_LIMITS,
    END_SEQ,
    Batch,
    EventError,
    EventLimits,
    decode_batch,
    decode_seq,
)
from proxy.workers.kv_trust import StreamTrust, Table

log = logging.getLogger("radixgate.kv_events")


@dataclass
class SubscriberStats:
    batches: int = 0
    events: int = 0
    gaps: int = 0
    replayed: int = 0
    resyncs: int = 0
    restarts: int = 0
    errors: int = 0
    reconnects: int = 0
    last_seq: int | None = None
    # Engine timestamp of the last batch and our clock when it arrived: the lag behind the engine.
    last_ts: float | None = None
    last_at: float | None = None
    lag_s: float | None = None
    notes: list[str] = field(default_factory=list)


class KvSubscriber:
    def __init__(self, url: str, endpoint: str, table: EngineBlocks, clock: Clock, *,
                 replay_endpoint: str | None = None, topic: str = "", limits: EventLimits = DEFAULT_LIMITS,
                 replay_timeout_s: float = 2.0, context: zmq.asyncio.Context | None = None,
                 wall_clock: Callable[[], float] | None = None, trust: StreamTrust | None = None,
                 rank: int = 0, trust_table: Table | None = None) -> None:
        """``rank``: the engine's data-parallel rank this stream is of. ``trust`` and
        ``trust_table``: what checks the stream against the prompts prefilled; the ranks of one
        worker share one, over all their tables (a prompt whose rank routing did not name lands
        on a rank it does not know)."""
        self.url, self.endpoint, self.replay_endpoint = url, endpoint, replay_endpoint
        self.rank = rank
        self.trust_table: Table = trust_table if trust_table is not None else table
        self.table, self.clock, self.limits = table, clock, limits
        self.topic = topic.encode()
        self.replay_timeout_s = replay_timeout_s
        self.state = "connecting"
        self.stats = SubscriberStats()
        self.trust = trust or StreamTrust()
        self._trusted = True
        self._ctx = context or zmq.asyncio.Context.instance()
        self._wall = wall_clock  # engines stamp batches with time.time(); the lag needs that clock
        self._sub: zmq.asyncio.Socket | None = None

    @property
    def usable(self) -> bool:
        """Whether routing should read the table (else: the approximate index)."""
        return self.state in ("live", "resynced") and self.trusted

    @property
    def trusted(self) -> bool:
        """Whether the stream shows the prompts the engine prefilled (probes due now resolved)."""
        self.trust.check(self.clock.now())
        trusted = self.trust.trusted
        if trusted != self._trusted:
            self._trusted = trusted
            s = self.trust.status()
            self._note(f"{s['recent_confirmed']} of the last {s['recent']} prompts prefilled there show in the "
                       f"stream: {'trusted again' if trusted else 'not trusted, routing uses the approximate index'}")
        return trusted

    @property
    def route_state(self) -> str:
        """``state``, or ``unconfirmed`` where the transport is fine but the content is not."""
        if self.state in ("live", "resynced") and not self.trusted:
            return "unconfirmed"
        return self.state

    def prefilled(self, token_ids: Sequence[int], named: bool = False) -> None:
        """The engine has prefilled this prompt (its first token came back): a probe, of this
        rank's table where the request named this rank, else of the worker's ``trust_table``."""
        self.trust.expect(token_ids, self.clock.now(), self.table if named else self.trust_table)

    def _socket(self, kind: int, address: str) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_payload_bytes + 64)
        sock.setsockopt(zmq.RCVHWM, 10_000)
        sock.connect(address)
        return sock

    async def run(self) -> None:
        """Until cancelled. A connection the transport dropped (a message over the cap) is not
        re-opened by ZeroMQ itself, so a socket monitor sees the drop and the SUB socket is made
        anew (``reconnects``); what was lost meanwhile shows as a gap."""
        while True:
            sub = self._sub = self._socket(zmq.SUB, self.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, self.topic)
            monitor = sub.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            poller = zmq.asyncio.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            try:
                dropped = False
                while not dropped:
                    for sock, _ in await poller.poll():
                        if sock is monitor:
                            await monitor.recv_multipart()
                            dropped = True
                        else:
                            await self.handle(await sub.recv_multipart())
            finally:
                sub.disable_monitor()
                monitor.close(linger=0)
                sub.close(linger=0)
            self.stats.reconnects += 1
            self._note("connection dropped (a message over the cap, or the engine went away): reconnecting")
            await asyncio.sleep(0.1)

    async def handle(self, frames: list[bytes]) -> None:
        try:
            if len(frames) != 3:
                raise EventError(f"expected [topic, seq, payload], got {len(frames)} frames")
            _, raw_seq, payload = frames
            seq = decode_seq(raw_seq)
            batch = decode_batch(payload, self.limits)
        except EventError as e:
            self._fail(str(e))
            return
        last = self.stats.last_seq
        if last is not None and seq <= last:
            if seq == last:
                return  # at-least-once: a repeat
            # The counter went back: a new engine process behind this address.
            self.stats.restarts += 1
            self._resync(f"sequence went back from {last} to {seq}: engine restarted")
        expected = 0 if self.stats.last_seq is None else self.stats.last_seq + 1
        if seq > expected:
            joining = self.state == "connecting"
            if not joining:
                self.stats.gaps += 1
            # Joining late, the replay buffer may still hold the engine's history from its start.
            if not await self._replay(expected, seq) and not joining:
                self._resync(f"batches {expected}..{seq - 1} lost and not replayed")
        self._apply(seq, batch)

    def _apply(self, seq: int, batch: Batch) -> None:
        for event in batch.events:
            self.table.apply(event)
        s = self.stats
        s.batches += 1
        s.events += len(batch.events)
        s.last_seq = seq
        s.last_ts, s.last_at = batch.ts, self.clock.now()
        if self._wall is not None:
            s.lag_s = max(0.0, self._wall() - batch.ts)
        if self.state in ("connecting", "failed"):
            self.state = "live"

    def _resync(self, why: str) -> None:
        self.table.clear()
        self.stats.resyncs += 1
        self.stats.last_seq = None
        self.state = "resynced"
        self._note(why)

    def _fail(self, why: str) -> None:
        self.stats.errors += 1
        self.table.clear()
        self.stats.last_seq = None
        self.state = "failed"
        self._note(why)

    def _note(self, why: str) -> None:
        log.warning("kv events of %s: %s", self.url, why)
        self.stats.notes = [*self.stats.notes[-9:], why]

    async def _replay(self, start: int, until: int) -> bool:
        """Apply batches ``start``..``until - 1`` from the replay socket; True if all came."""
        if self.replay_endpoint is None:
            return False
        sock = self._socket(zmq.DEALER, self.replay_endpoint)
        deadline = self.clock.now() + self.replay_timeout_s
        got: list[tuple[int, Batch]] = []
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                left = deadline - self.clock.now()
                if left <= 0 or not await sock.poll(timeout=max(1, int(left * 1000))):
                    return False
                frames = await sock.recv_multipart()
                if len(frames) != 3 or frames[0] != b"":
                    raise EventError("replay: expected [b'', seq, payload]")
                if frames[1] == END_SEQ:
                    break
                seq = decode_seq(frames[1])
                if start <= seq < until and len(got) < until - start:
                    got.append((seq, decode_batch(frames[2], self.limits)))
        except EventError as e:
            self.stats.errors += 1
            self._note(f"replay: {e}")
            return False
        finally:
            sock.close(linger=0)
        got.sort(key=lambda item: item[0])
        if [seq for seq, _ in got] != list(range(start, until)):
            return False  # the publisher's buffer no longer had them all
        for seq, batch in got:
            self._apply(seq, batch)
        self.stats.replayed += len(got)
        return True


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
