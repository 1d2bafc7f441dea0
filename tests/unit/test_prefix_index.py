"""Prefix index: bounded per-worker LRU of block hashes, corrected by reports."""

from __future__ import annotations

import pytest

from proxy.routing.base import WorkerSnapshot
from proxy.routing.prefix_index import FleetCache, Match, PrefixIndex, WorkerIndex
from proxy.routing.prefix_key import prefix_tokens

BT = 16


def chain(tag: int, n: int) -> list[int]:
    """Distinct fake chained hashes: prompt ``tag``'s first n blocks."""
    return [tag * 1_000_000 + i for i in range(n)]


def test_an_empty_index_matches_nothing() -> None:
    assert WorkerIndex(1000).match(chain(1, 5)) == Match(0, 0)


def test_a_recorded_prompt_matches_fully_and_its_extension_matches_its_length() -> None:
    index = WorkerIndex(10_000)
    index.record(chain(1, 5), BT)
    assert index.match(chain(1, 5)) == Match(5, 0)
    assert index.match(chain(1, 9)).blocks == 5
    assert index.match(chain(2, 9)).blocks == 0


def test_recorded_tokens_follow_the_block_layout() -> None:
    index = WorkerIndex(10**7)
    index.record(chain(1, 100), BT)
    assert index.tokens == prefix_tokens(100, BT)
    index.record(chain(1, 50), BT)  # a prefix already held adds nothing
    assert index.tokens == prefix_tokens(100, BT)


def test_capacity_evicts_tails_before_heads() -> None:
    index = WorkerIndex(10 * BT)
    index.record(chain(1, 8), BT)
    index.record(chain(2, 4), BT)  # 12 blocks > 10: two blocks of prompt 1 go, its tail first
    assert index.tokens <= 10 * BT
    assert index.match(chain(1, 8)).blocks == 6
    assert index.match(chain(2, 4)).blocks == 4


def test_a_prefix_used_again_survives_eviction_of_older_prompts() -> None:
    index = WorkerIndex(12 * BT)
    shared = chain(9, 4)
    index.record([*shared, *chain(1, 4)], BT)
    index.record([*chain(2, 4)], BT)
    index.record([*shared, *chain(3, 4)], BT)  # 4 + 4 + 4 + 4 = 16 > 12
    assert index.match(shared).blocks == 4
    assert index.match([*shared, *chain(1, 4)]).blocks == 4  # prompt 1's tail went first


def test_a_finished_request_confirms_its_blocks() -> None:
    index = PrefixIndex(10_000)
    index.record("w", chain(1, 4), BT)
    assert index.match("w", chain(1, 4)) == Match(4, 0)
    index.complete("w", chain(1, 4), BT, touches=(), cached_tokens=0)
    assert index.match("w", chain(1, 6)) == Match(4, 4)


def routed(index: WorkerIndex, hashes: list[int]) -> tuple[int, ...]:
    """Route a prompt: the touches of its confirmed blocks before this routing touches them."""
    touches = index.last_touches(hashes[: index.match(hashes).confirmed])
    index.record(hashes, BT)
    return touches


def test_an_unpredicted_eviction_forgets_everything_older_than_the_missing_block() -> None:
    index = WorkerIndex(10**6)
    shared = chain(9, 4)
    index.record([*shared, *chain(1, 4)], BT, confirmed=True)  # old
    index.record(chain(2, 4), BT, confirmed=True)  # touched after the shared prefix...
    index.record(chain(3, 4), BT, confirmed=True)
    touches = routed(index, [*shared, *chain(4, 2)])
    # ...but the worker had evicted the shared prefix from block 2 on: all older than it goes.
    assert index.correct(BT, touches, cached_tokens=2 * BT)
    assert index.match([*shared, *chain(1, 4)]).blocks == 4  # block 0..3 touched by this request
    assert chain(1, 1)[0] not in index  # prompt 1's tail was older than the missing block
    assert index.match(chain(2, 4)).blocks == 4 and index.match(chain(3, 4)).blocks == 4
    assert index.tokens == sum(16 for h in [*shared, *chain(4, 2), *chain(2, 4), *chain(3, 4)] if h in index)


def test_a_report_within_one_block_of_the_prediction_is_not_an_eviction() -> None:
    index = WorkerIndex(10**6)
    index.record(chain(1, 10), BT, confirmed=True)
    index.record(chain(2, 10), BT, confirmed=True)
    touches = routed(index, chain(1, 12))
    assert not index.correct(BT, touches, cached_tokens=9 * BT + 1)
    assert index.match(chain(2, 10)).blocks == 10


def test_a_report_a_few_percent_short_of_a_long_prediction_is_estimate_error_not_an_eviction() -> None:
    # 64 blocks (1,024 tokens here) predicted; a text prompt's estimate 5% off is not evidence,
    # a third missing is.
    index = WorkerIndex(10**6)
    index.record(chain(1, 64), BT, confirmed=True)
    index.record(chain(2, 10), BT, confirmed=True)
    touches = routed(index, chain(1, 66))
    predicted = prefix_tokens(len(touches), BT)
    assert not index.correct(BT, touches, cached_tokens=int(0.95 * predicted))
    assert index.match(chain(2, 10)).blocks == 10
    assert index.correct(BT, touches, cached_tokens=int(0.66 * predicted))


def test_unconfirmed_matches_teach_nothing() -> None:
    index = WorkerIndex(10**6)
    index.record(chain(2, 10), BT)
    touches = routed(index, chain(2, 10))
    assert touches == ()
    assert not index.correct(BT, touches, cached_tokens=0)
    assert len(index) == 10


def test_the_finished_request_stays_confirmed_after_an_eviction() -> None:
    index = PrefixIndex(10**6)
    index.record("w", chain(1, 8), BT)
    index.complete("w", chain(1, 8), BT, touches=(), cached_tokens=None)
    touches = index.last_touches("w", chain(1, 8))
    index.record("w", chain(1, 8), BT)
    assert index.complete("w", chain(1, 8), BT, touches=touches, cached_tokens=0)
    assert index.match("w", chain(1, 8)) == Match(8, 8)


def test_the_fleet_cache_counts_what_one_big_cache_would_hold() -> None:
    cache = FleetCache(10**6)
    assert cache.observe(chain(1, 10), BT, 500) == 0
    assert cache.observe(chain(1, 12), BT, 500) == 10 * BT
    assert cache.observe(chain(1, 12), BT, 100) == 100  # never more than the prompt


def test_a_new_generation_resets_the_worker_and_a_new_kv_size_resizes_it() -> None:
    index = PrefixIndex()
    index.sync([WorkerSnapshot("w", max_total_tokens=10_000)])
    index.record("w", chain(1, 10), BT)
    index.sync([WorkerSnapshot("w", max_total_tokens=5 * BT)])
    assert index.worker("w").tokens <= 5 * BT
    assert index.match("w", chain(1, 10)).blocks == 5
    index.sync([WorkerSnapshot("w", max_total_tokens=5 * BT, generation=1)])
    assert index.match("w", chain(1, 10)).blocks == 0


def test_workers_that_left_are_dropped_only_when_asked() -> None:
    index = PrefixIndex()
    index.sync([WorkerSnapshot("a"), WorkerSnapshot("b")])
    index.sync([WorkerSnapshot("a")])
    assert "b" in index
    index.sync([WorkerSnapshot("a")], drop_missing=True)
    assert index.urls() == ["a"]


def test_an_unscraped_worker_gets_the_default_capacity() -> None:
    index = PrefixIndex(default_capacity_tokens=1234)
    index.sync([WorkerSnapshot("a")])
    assert index.worker("a").kv_tokens == 1234


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64, 65, 300])
def test_match_finds_every_held_prefix_length(n) -> None:
    index = WorkerIndex(10**9)
    index.record(chain(1, n), BT)
    assert index.match(chain(1, 400)).blocks == n
