"""The simulated worker's radix cache: page-aligned matching, insertion, locking, LRU eviction."""

from __future__ import annotations

import pytest

from proxy.sim.radix import PoolExhausted, RadixCache


def cached(cache: RadixCache, ids: list[int]) -> None:
    """Put ids in the tree the way a request does: allocate privately, then insert."""
    held = len(ids) - cache.match_prefix(ids).length
    cache.alloc(held)
    cache.insert(ids, held)


def test_an_empty_tree_matches_nothing() -> None:
    cache = RadixCache(100)
    assert cache.match_prefix([1, 2, 3]).length == 0


def test_a_cached_sequence_matches_its_prefixes_and_extensions() -> None:
    cache = RadixCache(100)
    cached(cache, [1, 2, 3, 4])
    assert cache.match_prefix([1, 2]).length == 2
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]).length == 4
    assert cache.match_prefix([1, 9]).length == 1
    assert cache.match_prefix([9]).length == 0


def test_a_partial_match_splits_the_edge_and_branches_keep_their_shared_prefix() -> None:
    cache = RadixCache(100)
    cached(cache, [1, 2, 3, 4])
    cached(cache, [1, 2, 7, 8])
    assert cache.tree_tokens == 6  # 1,2 shared + 3,4 + 7,8
    assert cache.node_count() == 3
    assert cache.match_prefix([1, 2, 7, 8]).length == 4
    assert cache.match_prefix([1, 2, 3, 4]).length == 4


@pytest.mark.parametrize(
    ("page_size", "query", "expected"),
    [
        (1, [1, 2, 3, 4, 5, 9], 5),
        (2, [1, 2, 3, 4, 5, 9], 4),
        (4, [1, 2, 3, 4, 5, 9], 4),
        (4, [1, 2, 3, 9], 0),
        (8, [1, 2, 3, 4, 5, 6, 7, 8], 0),  # the cached sequence is shorter than one page
    ],
)
def test_matches_are_rounded_down_to_whole_pages(page_size: int, query: list[int], expected: int) -> None:
    cache = RadixCache(100, page_size=page_size)
    ids = [1, 2, 3, 4, 5, 6, 7]
    aligned = len(ids) - len(ids) % page_size
    cache.alloc(aligned)
    cache.insert(ids, aligned)
    assert cache.tree_tokens == aligned
    assert cache.match_prefix(query).length == expected
    assert cache.peek_prefix_len(query) == expected


def test_insert_frees_private_tokens_that_duplicate_cached_ones() -> None:
    cache = RadixCache(100)
    cached(cache, [1, 2, 3])
    cache.alloc(5)  # a second request computed 1..5 without a hit
    added = cache.insert([1, 2, 3, 4, 5], 5)
    assert added == 2
    assert cache.tree_tokens == 5
    assert cache.private_tokens == 0
    assert cache.available_tokens == 95


def test_alloc_evicts_least_recently_used_leaves_first() -> None:
    cache = RadixCache(10)
    cached(cache, [1, 1, 1, 1])
    cached(cache, [2, 2, 2, 2])
    cache.match_prefix([1, 1, 1, 1])  # touch the first: the second is now the LRU leaf
    cache.alloc(4)
    assert cache.match_prefix([1, 1, 1, 1]).length == 4
    assert cache.match_prefix([2, 2, 2, 2]).length == 0
    assert cache.tree_tokens + cache.private_tokens <= cache.capacity


def test_an_engine_that_hands_out_the_most_recently_freed_blocks_evicts_the_newest_leaf() -> None:
    # transformers' continuous batching (the GPU fleet's engine) reuses the last freed blocks
    # first: an old prefix survives while the one just used goes.
    cache = RadixCache(10, most_recent_first=True)
    cached(cache, [1, 1, 1, 1])
    cached(cache, [2, 2, 2, 2])
    cache.match_prefix([1, 1, 1, 1])  # touch the first: it is now the most recent leaf
    cache.alloc(4)
    assert cache.match_prefix([1, 1, 1, 1]).length == 0
    assert cache.match_prefix([2, 2, 2, 2]).length == 4


def test_locked_nodes_and_their_ancestors_are_never_evicted() -> None:
    cache = RadixCache(8)
    cached(cache, [1, 2, 3, 4])
    cached(cache, [1, 2, 5, 6])
    node = cache.match_prefix([1, 2, 3, 4]).node
    cache.inc_lock(node)
    assert cache.protected_tokens == 4  # 1,2 (shared ancestor) + 3,4
    assert cache.evict(100) == 2  # only the unlocked branch 5,6 goes
    assert cache.match_prefix([1, 2, 3, 4]).length == 4
    with pytest.raises(PoolExhausted):
        cache.alloc(5)
    cache.dec_lock(node)
    assert cache.protected_tokens == 0
    cache.alloc(5)
    assert cache.tree_tokens + cache.private_tokens <= cache.capacity


def test_eviction_climbs_to_parents_that_become_leaves() -> None:
    cache = RadixCache(100)
    cached(cache, [1, 2, 3, 4])
    cached(cache, [1, 2, 5, 6])
    assert cache.evict(6) == 6
    assert cache.tree_tokens == 0


def test_unlocking_an_unlocked_node_is_an_error() -> None:
    cache = RadixCache(10)
    cached(cache, [1, 2])
    with pytest.raises(ValueError):
        cache.dec_lock(cache.match_prefix([1, 2]).node)


def test_reset_empties_the_tree_but_keeps_private_allocations() -> None:
    cache = RadixCache(10)
    cached(cache, [1, 2, 3])
    cache.alloc(2)
    cache.reset()
    assert cache.tree_tokens == 0
    assert cache.private_tokens == 2
    assert cache.match_prefix([1, 2, 3]).length == 0
