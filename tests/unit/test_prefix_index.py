"""Prefix index: bounded per-worker LRU of block hashes, corrected by reports."""

from __future__ import annotations

import pytest

from proxy.routing.base import WorkerSnapshot
from proxy.routing.prefix_index import (
    CAPACITY_RECOVERY,
    MIN_CAPACITY_FRACTION,
    SHRINK,
    Match,
    PrefixIndex,
    WorkerIndex,
)
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
    index.complete("w", chain(1, 4), BT, confirmed_blocks=0, cached_tokens=0)
    assert index.match("w", chain(1, 6)) == Match(4, 4)


def test_a_report_short_of_confirmed_blocks_shrinks_capacity_and_evicts_the_oldest() -> None:
    index = WorkerIndex(100 * BT)
    for tag in range(1, 6):
        index.record(chain(tag, 20), BT, confirmed=True)
    assert index.tokens == 100 * BT
    index.correct(BT, confirmed_blocks=20, cached_tokens=0)
    assert index.capacity == int(100 * BT * SHRINK)
    assert index.tokens <= index.capacity
    assert index.match(chain(1, 20)).blocks < 20  # the oldest prompt lost blocks
    assert index.match(chain(5, 20)).blocks == 20


def test_a_report_within_one_block_of_the_prediction_is_not_an_eviction() -> None:
    index = WorkerIndex(100 * BT)
    index.capacity = 50 * BT
    index.correct(BT, confirmed_blocks=10, cached_tokens=9 * BT + 1)
    assert index.capacity == 50 * BT + int(50 * BT * CAPACITY_RECOVERY)


def test_capacity_never_shrinks_below_its_floor() -> None:
    index = WorkerIndex(1000)
    for _ in range(100):
        index.correct(BT, confirmed_blocks=10, cached_tokens=0)
    assert index.capacity == int(1000 * MIN_CAPACITY_FRACTION)


def test_unconfirmed_matches_teach_nothing() -> None:
    index = WorkerIndex(1000)
    index.correct(BT, confirmed_blocks=0, cached_tokens=0)
    assert index.capacity == 1000


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
