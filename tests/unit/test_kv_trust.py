"""Whether a KV event stream shows the prompts its engine prefilled (pure: a table and a time)."""

from __future__ import annotations

from proxy.routing.kv_index import EngineBlocks
from proxy.workers.kv_events import Removed, Stored
from proxy.workers.kv_trust import StreamTrust

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
    trust.check(table, now=10.0)
    assert trust.trusted  # 3 misses: fewer than min_probes
    trust.expect(PROMPT, now=10.0, table=table)
    trust.check(table, now=10.5)
    assert trust.trusted  # not due yet
    trust.check(table, now=11.0)
    assert not trust.trusted and trust.status()["probes"] == 4 and trust.status()["confirmed"] == 0
    stored(table, PROMPT)
    for i in range(8):
        trust.expect(PROMPT, now=20.0 + i, table=table)
    trust.check(table, now=40.0)
    assert trust.trusted and trust.status()["recent_confirmed"] == 8


def test_a_clear_since_the_prefill_makes_a_probe_moot_and_short_prompts_prove_nothing() -> None:
    table = EngineBlocks()
    trust = StreamTrust(grace_s=1.0, window=8, min_probes=1)
    trust.expect(PROMPT, now=0.0, table=table)
    table.clear()  # the engine flushed before the probe came due
    trust.expect(PROMPT[:10], now=0.0, table=table)
    trust.check(table, now=5.0)
    assert trust.status()["probes"] == 0 and trust.trusted
