"""The simulated engine's prefix cache as transformers' block manager keeps it (proxy/sim/blocks.py):
hash-chained pages, released in sequence order, the most recently released taken first."""

from __future__ import annotations

import pytest

from proxy.sim.blocks import BlockCache
from proxy.sim.radix import PoolExhausted, RadixCache
from proxy.sim.scheduler import Scheduler, SchedulerLimits, SimRequest

PS = 2


def run_request(cache: BlockCache, prompt: list[int], output: list[int]) -> None:
    """One request as the scheduler drives the cache: match and hold the cached head, compute the
    rest privately, cache the prompt at the prefill's end, release the sequence at the end."""
    match = cache.match_prefix(prompt)
    cache.inc_lock(match.node)
    held = len(prompt) - match.length
    cache.alloc(held + len(output))
    cache.insert(prompt, held)
    node = cache.match_prefix(prompt).node
    cache.inc_lock(node)
    cache.dec_lock(match.node)
    cache.release(node, prompt + output, len(output))


def test_a_prompt_matches_block_by_block_up_to_the_first_missing_block() -> None:
    cache = BlockCache(100, PS)
    run_request(cache, [1, 2, 3, 4, 5, 6], [])
    assert cache.match_prefix([1, 2, 3, 4, 9, 9]).length == 4
    assert cache.match_prefix([1, 2, 3]).length == 2  # whole pages only
    assert cache.match_prefix([9, 2, 3, 4]).length == 0  # a block is named by its whole chain
    assert cache.peek_prefix_len([1, 2, 3, 4, 5, 6, 7]) == 6
    assert cache.tree_tokens == 6 and cache.evictable_tokens == 6 and cache.private_tokens == 0


def test_a_finished_request_is_taken_back_from_its_last_block() -> None:
    cache = BlockCache(8, PS)
    run_request(cache, [1, 1, 2, 2], [3, 3])  # released in order: its output's block last
    cache.alloc(6)  # room for three pages, two from the cache
    assert cache.match_prefix([1, 1, 2, 2, 3, 3]).length == 2  # the tail went first, the head stayed
    assert cache.tree_tokens == 2


def test_a_held_block_is_never_taken_and_a_rematched_one_goes_to_the_back() -> None:
    cache = BlockCache(8, PS)
    run_request(cache, [1, 1], [])
    run_request(cache, [2, 2], [])
    held = cache.match_prefix([2, 2]).node
    cache.inc_lock(held)
    with pytest.raises(PoolExhausted):
        cache.alloc(8)
    cache.alloc(6)  # takes [1, 1], the only free block, and the two empty pages
    assert cache.match_prefix([1, 1]).length == 0 and cache.match_prefix([2, 2]).length == 2
    cache.free(6)
    run_request(cache, [3, 3], [])
    cache.dec_lock(held)  # [2, 2] released after [3, 3]: now the most recent
    cache.alloc(6)
    assert cache.match_prefix([2, 2]).length == 0 and cache.match_prefix([3, 3]).length == 2


def test_a_shared_prefix_released_last_goes_before_the_older_tail_that_hangs_from_it() -> None:
    # Request a ends while b, of the same group, still holds the prefix: a's tail is released
    # first, the prefix only when b ends, so the prefix is the more recent and is taken before
    # a's tail, which stays in the pool unreachable. A radix tree takes leaves only.
    cache = BlockCache(10, PS)
    prefix, a_tail, b_tail = [7, 7, 8, 8], [1, 1], [2, 2]
    run_request(cache, prefix, [])
    b = cache.match_prefix(prefix + b_tail)
    cache.inc_lock(b.node)  # b runs, holding the prefix
    run_request(cache, prefix + a_tail, [])  # a runs and ends
    cache.alloc(2)
    cache.release(b.node, prefix + b_tail, 2)  # b ends: b's tail released after the prefix
    cache.alloc(8)  # room for four pages, taken from the end: b's tail, then the prefix
    assert cache.match_prefix(prefix + a_tail).length == 0  # a's tail, though cached, is unreachable
    assert cache.tree_tokens == 2  # it is still there
    radix = RadixCache(10, PS, most_recent_first=True)
    for ids in (prefix + a_tail, prefix + b_tail):
        held = len(ids) - radix.match_prefix(ids).length
        radix.alloc(held)
        radix.insert(ids, held)
    radix.alloc(6)
    assert radix.match_prefix(prefix).length == 4  # the radix tree's prefix outlives its leaves


def test_a_block_computed_twice_is_kept_once() -> None:
    cache = BlockCache(20, PS)
    a = cache.match_prefix([5, 5, 6, 6])
    b = cache.match_prefix([5, 5, 6, 6])
    cache.alloc(4)
    cache.alloc(4)  # both compute the prefix, neither found it
    assert cache.insert([5, 5, 6, 6], 4) == 4
    assert cache.insert([5, 5, 6, 6], 4) == 0  # the second copy is freed
    assert cache.private_tokens == 0 and cache.tree_tokens == 4
    assert a.length == b.length == 0


def test_the_block_cache_publishes_what_it_stores_and_takes() -> None:
    cache = BlockCache(4, PS)
    cache.events = []
    run_request(cache, [1, 1, 2, 2], [])
    stored = [e for e in cache.events if e[0] == "BlockStored"]
    assert len(stored) == 1 and len(stored[0][1]) == 2 and stored[0][2] is None and stored[0][3] == [1, 1, 2, 2]
    cache.alloc(4)
    removed = [h for e in cache.events if e[0] == "BlockRemoved" for h in e[1]]
    assert removed == stored[0][1][::-1]  # the last block first
    cache.reset()
    assert cache.events[-1] == ["AllBlocksCleared"]


def test_the_scheduler_runs_on_the_block_cache_and_gives_every_token_back() -> None:
    cache = BlockCache(4000, 16)
    sched = Scheduler(cache, SchedulerLimits(max_running_requests=4, chunked_prefill_size=1024,
                                             max_prefill_tokens=4000, max_queued_requests=None))
    prefix = list(range(100, 900))
    reqs = [SimRequest(rid=str(i), input_ids=prefix + [5000 + i] * 40, max_new_tokens=20) for i in range(12)]
    for r in reqs:
        sched.submit(r, 0.0)
    steps = 0
    while (step := sched.next_step(float(steps))) is not None:
        sched.finish_step(step, float(steps))
        steps += 1
        assert steps < 10_000
    assert all(r.state == "finished" and len(r.output_ids) == 20 for r in reqs)
    assert sum(r.cached_tokens >= 800 for r in reqs) >= 8  # the group's prefix found, not recomputed
    assert cache.private_tokens == 0 and cache.protected_tokens == 0
    assert cache.tree_tokens <= 4000 and cache.tree_tokens % 16 == 0
    # the last request's sequence is cached whole: prompt and output, in whole pages
    last = reqs[-1]
    seq = last.input_ids + last.output_ids
    assert cache.match_prefix(seq).length == len(seq) - len(seq) % 16
