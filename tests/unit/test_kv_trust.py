"""Whether a KV event stream shows the prompts its engine prefilled (pure: a table and a time), and
how a worker of several data-parallel ranks answers routing from its ranks' streams."""

from __future__ import annotations

from proxy.clock import ManualClock
from proxy.routing.kv_index import EngineBlocks
from proxy.workers.kv_events import Removed, Stored
from proxy.workers.kv_fleet import WorkerKv
from proxy.workers.kv_subscriber import KvSubscriber
from proxy.workers.kv_trust import AnyOf, StreamTrust

PROMPT = list(range(1, 200))


def stored(table: EngineBlocks, ids: list[int], block: int = 16) -> None:
    """The engine stores ``ids``' full blocks (hashes of our own making, chained from the root)."""
    n = len(ids) // block
    table.apply(Stored(hashes=list(range(1000, 1000 + n)), parent=None, token_ids=ids[: n * block],
                       block_size=block, medium=None))


def test_seen_means_the_leading_block_was_told_held_or_removed() -> None:
    table = EngineBlocks()
    assert table.seen(PROMPT) is False  # nothing ever stored
    assert table.seen(PROMPT[:20]) is None  # too short to tell on any engine's pages
    stored(table, PROMPT)
    assert table.seen(PROMPT) is True
    assert table.seen([9] * 64) is False
    assert table.seen([9] * 8) is None  # under one 16-token page
    table.apply(Removed(hashes=[1000], medium=None))
    assert table.seen(PROMPT) is True  # removed since: the stream did tell of it


def test_a_stream_that_shows_nothing_is_doubted_after_enough_probes_and_trusted_again_when_it_shows() -> None:
    table = EngineBlocks()
    trust = StreamTrust(grace_s=1.0, window=8, min_probes=4, min_ratio=0.5)
    for i in range(3):
        trust.expect(PROMPT, now=float(i), table=table)
    trust.check(now=10.0)
    assert trust.trusted  # 3 misses: fewer than min_probes
    trust.expect(PROMPT, now=10.0, table=table)
    trust.check(now=10.5)
    assert trust.trusted  # not due yet
    trust.check(now=11.0)
    assert not trust.trusted and trust.status()["probes"] == 4 and trust.status()["confirmed"] == 0
    stored(table, PROMPT)
    for i in range(8):
        trust.expect(PROMPT, now=20.0 + i, table=table)
    trust.check(now=40.0)
    assert trust.trusted and trust.status()["recent_confirmed"] == 8


def test_a_clear_since_the_prefill_makes_a_probe_moot_and_short_prompts_prove_nothing() -> None:
    table = EngineBlocks()
    trust = StreamTrust(grace_s=1.0, window=8, min_probes=1)
    trust.expect(PROMPT, now=0.0, table=table)
    table.clear()  # the engine flushed before the probe came due
    trust.expect(PROMPT[:10], now=0.0, table=table)
    trust.check(now=5.0)
    assert trust.status()["probes"] == 0 and trust.trusted


def test_a_workers_ranks_are_checked_together_a_prompt_shows_if_any_rank_stored_it() -> None:
    ranks = [EngineBlocks() for _ in range(3)]
    both = AnyOf(ranks)
    assert both.seen(PROMPT) is False and both.seen(PROMPT[:10]) is None
    stored(ranks[2], PROMPT)  # the controller put it on rank 2
    assert both.seen(PROMPT) is True
    trust = StreamTrust(grace_s=1.0, window=8, min_probes=1)
    trust.expect(PROMPT, now=0.0, table=both)
    trust.expect([7] * 64, now=0.0, table=both)
    ranks[0].clear()  # a flush on any rank since the prefills: their probes prove nothing
    trust.check(now=5.0)
    assert trust.status()["probes"] == 0
    trust.expect([7] * 64, now=6.0, table=both)  # on no rank
    trust.expect(PROMPT, now=6.0, table=both)
    trust.check(now=10.0)
    assert trust.status()["probes"] == 2 and trust.status()["confirmed"] == 1


def test_a_worker_of_several_ranks_answers_only_when_every_rank_is_known() -> None:
    clock = ManualClock()
    tables = [EngineBlocks() for _ in range(2)]
    trust = StreamTrust()
    view = WorkerKv()
    view.subscribers = [KvSubscriber("http://w", f"tcp://127.0.0.1:{5557 + r}", t, clock, trust=trust, rank=r,
                                     trust_table=AnyOf(tables)) for r, t in enumerate(tables)]
    stored(tables[1], PROMPT)
    assert view.match(PROMPT) is None and view.route_state() == "connecting"  # no batch yet
    view.subscribers[0].state = "live"
    assert view.match(PROMPT) is None and view.route_state() == "connecting"  # rank 1 not yet
    view.subscribers[1].state = "resynced"
    assert view.route_state() == "resynced" and view.rank_matches(PROMPT) == [0, 192]
    m = view.match(PROMPT)
    assert m is not None and m.tokens == 0  # its controller may send it to rank 0: no promise
    view.best_rank = True  # routing.dp_ranks sends it to the rank that holds it
    m = view.match(PROMPT)
    assert m is not None and m.tokens == 192
    status = view.status()
    assert status is not None and status["source"] == "events" and status["blocks"] == 12
    assert [r["state"] for r in status["ranks"]] == ["live", "resynced"]
    view.subscribers[0].state = "failed"
    assert view.match(PROMPT) is None and view.route_state() == "failed"


def test_a_prompt_sent_to_a_named_rank_is_probed_on_that_ranks_table_alone() -> None:
    clock = ManualClock()
    tables = [EngineBlocks() for _ in range(2)]
    trust = StreamTrust(grace_s=1.0, window=8, min_probes=1)
    subs = [KvSubscriber("http://w", f"tcp://127.0.0.1:{5557 + r}", t, clock, trust=trust, rank=r,
                         trust_table=AnyOf(tables)) for r, t in enumerate(tables)]
    stored(tables[1], PROMPT)  # only rank 1's stream tells of it
    subs[0].prefilled(PROMPT, named=True)  # routing named rank 0: rank 1's stream cannot vouch for it
    subs[1].prefilled(PROMPT, named=True)
    subs[0].prefilled(PROMPT)  # no rank named: it shows if any rank's does
    clock.advance(2.0)
    assert subs[0].trusted and (trust.status()["probes"], trust.status()["confirmed"]) == (3, 2)
    # A flush of rank 0 makes moot what was probed there or on any rank, not rank 1's own probes.
    for r in (0, 1):
        subs[r].prefilled(PROMPT, named=True)
    subs[1].prefilled(PROMPT)
    tables[0].clear()
    clock.advance(2.0)
    assert subs[1].trusted and (trust.status()["probes"], trust.status()["confirmed"]) == (4, 3)
