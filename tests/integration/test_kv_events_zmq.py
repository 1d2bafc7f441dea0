"""The KV event subscriber against a real ZeroMQ publisher on 127.0.0.1 (PUB + ROUTER replay, the
engines' wire): live updates, gaps filled by replay, gaps it cannot fill, engine restarts, and
publishers that send what is not a KV event stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import msgpack
import pytest

from proxy.clock import MonotonicClock
from proxy.routing.kv_index import EngineBlocks
from proxy.sim.kv_publish import KvEventsSettings, KvPublisher
from proxy.workers.kv_events import EventLimits
from proxy.workers.kv_subscriber import KvSubscriber, stop

pytestmark = pytest.mark.asyncio

def publisher(*, replay: bool = True) -> KvPublisher:
    return KvPublisher(KvEventsSettings("tcp://127.0.0.1:0", "tcp://127.0.0.1:0" if replay else None))


CLEARED = msgpack.packb([1.0, [["AllBlocksCleared"]]])


def stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = 4) -> bytes:
    return bytes(msgpack.packb([time.time(), [["BlockStored", hashes, parent, tokens, size, None]]]))


def removed(hashes: list[int]) -> bytes:
    return bytes(msgpack.packb([time.time(), [["BlockRemoved", hashes]]]))


async def until(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def joined(pub: KvPublisher, sub: KvSubscriber) -> None:
    """PUB drops what it sends before the subscription reaches it: send clears until one lands."""
    deadline = time.monotonic() + 5
    while sub.stats.batches == 0:
        assert time.monotonic() < deadline, "subscriber never joined"
        await pub.publish(CLEARED)
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def following(*, replay: bool = True, **kw: object) -> AsyncIterator[tuple[KvPublisher, KvSubscriber, EngineBlocks]]:
    """A publisher, and a subscriber following it into a table, joined before the test goes on."""
    async with publisher(replay=replay) as pub:
        table = EngineBlocks()
        sub = subscriber(pub, table, **kw)
        task = asyncio.create_task(sub.run())
        try:
            await joined(pub, sub)
            yield pub, sub, table
        finally:
            await stop(task)


def subscriber(pub: KvPublisher, table: EngineBlocks, **kw: object) -> KvSubscriber:
    return KvSubscriber("http://w", pub.endpoint, table, MonotonicClock(), replay_endpoint=pub.replay_endpoint,
                        wall_clock=time.time, **kw)  # type: ignore[arg-type]


async def test_blocks_stored_and_removed_on_the_engine_show_in_the_table() -> None:
    async with following() as (pub, sub, table):
        await pub.publish(stored([1, 2], None, list(range(8))))
        await pub.publish(stored([3], 2, [8, 9, 10, 11]))
        await until(lambda: len(table) == 3)
        assert table.matched_tokens(list(range(14))) == 12
        await pub.publish(removed([3]))
        await until(lambda: len(table) == 2)
        assert table.matched_tokens(list(range(14))) == 8
        assert sub.state == "live" and sub.usable and sub.stats.gaps == 0
        assert sub.stats.lag_s is not None and sub.stats.lag_s < 5


async def test_a_late_joiner_replays_the_engines_history() -> None:
    async with publisher() as pub:
        # Sent before anyone subscribed: PUB drops them, the replay buffer keeps them.
        await pub.publish(stored([1, 2], None, list(range(8))))
        await pub.publish(stored([3], 2, [8, 9, 10, 11]))
        table = EngineBlocks()
        sub = subscriber(pub, table)
        task = asyncio.create_task(sub.run())
        try:
            await joined(pub, sub)
            # The first batch it got was a clear (seq >= 2): history 0..1 replayed, then the clear.
            assert pub.replays >= 1 and sub.stats.replayed >= 2 and sub.state == "live"
            await pub.publish(stored([1, 2], None, list(range(8))))
            await until(lambda: len(table) == 2)
        finally:
            await stop(task)


async def test_a_gap_is_filled_from_the_replay_socket() -> None:
    async with following() as (pub, sub, table):
        replayed = sub.stats.replayed  # joining may have replayed the clears PUB dropped
        base = pub.seq
        pub.buffer.append((base, stored([1, 2], None, list(range(8)))))  # "lost" on the PUB socket
        pub.seq += 1
        await pub.publish(stored([3], 2, [8, 9, 10, 11]))
        await until(lambda: len(table) == 3)
        assert sub.stats.gaps == 1 and sub.stats.replayed == replayed + 1 and sub.stats.resyncs == 0
        assert table.matched_tokens(list(range(12))) == 12


async def test_a_gap_without_replay_clears_the_table_and_it_refills() -> None:
    async with following(replay=False) as (pub, sub, table):
        await pub.publish(stored([1, 2], None, list(range(8))))
        await until(lambda: len(table) == 2)
        pub.seq += 3  # three batches lost
        await pub.publish(stored([7], None, [50, 51, 52, 53]))
        await until(lambda: sub.stats.resyncs == 1)
        # Cleared (what was lost may have removed blocks), then the new batch applied.
        assert sub.state == "resynced" and sub.usable and len(table) == 1
        assert table.matched_tokens(list(range(8))) == 0 and table.matched_tokens([50, 51, 52, 53]) == 4


async def test_an_engine_restart_is_seen_by_its_sequence_going_back() -> None:
    async with following(replay=False) as (pub, sub, table):
        await pub.publish(stored([1, 2], None, list(range(8))))
        await until(lambda: len(table) == 2)
        await pub.publish(stored([9], None, [70, 71, 72, 73]), seq=0)
        await until(lambda: sub.stats.restarts == 1)
        assert len(table) == 1 and table.matched_tokens([70, 71, 72, 73]) == 4


async def test_what_is_not_a_kv_event_stream_is_counted_and_never_applied() -> None:
    async with following(limits=EventLimits(max_payload_bytes=4096)) as (pub, sub, table):
        await pub.publish(stored([1, 2], None, list(range(8))))
        await until(lambda: len(table) == 2)
        await pub.pub.send_multipart([b"", b"\x00" * 8])  # two frames
        await until(lambda: sub.stats.errors == 1)
        assert sub.state == "failed" and not sub.usable and len(table) == 0
        await pub.publish(b"\x93garbage")
        await until(lambda: sub.stats.errors == 2)
        # Over the transport cap: ZeroMQ drops it (and the connection, which it re-opens).
        await pub.publish(stored([5], None, list(range(4))) + b"\x00" * 10_000)
        await asyncio.sleep(0.3)
        assert len(table) == 0 and sub.stats.errors == 2  # never decoded
        await until(lambda: _published_until_seen(pub, sub), 10)
        # The history it would replay holds the garbage: it starts over from what comes next.
        assert sub.state == "resynced" and sub.usable


def _published_until_seen(pub: KvPublisher, sub: KvSubscriber) -> bool:
    if sub.usable:
        return True
    asyncio.get_running_loop().create_task(pub.publish(CLEARED))
    return False
