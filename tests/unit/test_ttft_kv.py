"""ttft's KV-wait term: room in a worker's KV pool by the proxy's own books (``ttft_kv.py``)."""

from __future__ import annotations

import pytest

from proxy.routing.base import Completion, FirstToken, RouteRequest, WorkerSnapshot
from proxy.routing.prefix_key import prefix_tokens
from proxy.routing.ttft_cost import TtftCost, TtftParams
from proxy.routing.ttft_estimate import InFlight, PendingWork
from proxy.routing.ttft_kv import KvReads
from proxy.routing.ttft_model import Features

URLS = ["http://a", "http://b", "http://c", "http://d"]
BT = 32
POOL = 48_000


def prompt(tag: int, blocks: int, shared: int = 0, shared_tag: int = 999) -> RouteRequest:
    hashes = tuple(shared_tag * 10**6 + i for i in range(shared)) + tuple(tag * 10**6 + i for i in range(shared, blocks))
    return RouteRequest(model="m", block_hashes=hashes, block_tokens=BT, prompt_tokens=prefix_tokens(blocks, BT))


def fleet() -> list[WorkerSnapshot]:
    """Engines that report nothing but their static shape (the GPU fleet's minimal mode)."""
    return [WorkerSnapshot(u, max_total_tokens=POOL, page_size=BT) for u in URLS]


def test_no_wait_before_any_completion_or_without_a_known_pool() -> None:
    kv = KvReads()
    assert kv.wait(held=60_000, own=3_000, capacity=POOL) == 0.0  # nothing learned yet
    kv.observe(32, 9.0)
    assert kv.wait(held=60_000, own=3_000, capacity=None) == 0.0
    assert kv.wait(held=60_000, own=3_000, capacity=0) == kv.wait(held=60_000, own=3_000, capacity=-5) == 0.0


def test_the_wait_is_the_share_of_a_decode_that_frees_the_overflow() -> None:
    kv = KvReads()
    kv.observe(32, 9.0)
    assert kv.context(3_000) == 3_032
    assert kv.wait(held=40_000, own=3_000, capacity=POOL) == 0.0  # it fits
    # 6,000 tokens over a 48,000-token pool, which frees its size once per decode's 9 s
    assert kv.wait(held=51_000, own=3_000, capacity=POOL) == pytest.approx(9.0 * 6_000 / POOL)
    # a queue far past the pool is capped at a few decodes, not extrapolated
    assert kv.wait(held=1_000_000, own=3_000, capacity=POOL) == pytest.approx(9.0 * 4)


def test_output_length_and_decode_time_are_learned_from_completions() -> None:
    kv = KvReads()
    kv.observe(None, 3.0)  # no token count: ignored
    assert kv.mean_decode_s == 0.0
    kv.observe(100, 10.0)
    for _ in range(200):
        kv.observe(20, 2.0)
    assert kv.mean_output_tokens == pytest.approx(20, abs=0.5)
    assert kv.mean_decode_s == pytest.approx(2.0, abs=0.05)


def test_prompts_in_flight_follow_dispatch_retry_and_completion_and_count_peers_at_our_size() -> None:
    pending = PendingWork(max_tracked_per_worker=64)
    x = Features(0, 0, 0, 0)
    r1, r2 = prompt(1, 40), prompt(2, 80)
    pending.add("http://a", InFlight(r1, x, (), ()))
    pending.add("http://a", InFlight(r2, x, (), ()))
    assert pending.prompts_in_flight("http://a") == (r1.prompt_tokens + r2.prompt_tokens, 2)
    pending.add("http://b", InFlight(r2, x, (), ()))  # r2 retried on b
    assert pending.prompts_in_flight("http://a") == (r1.prompt_tokens, 1)
    assert pending.prompts_in_flight("http://b") == (r2.prompt_tokens, 1)
    pending.set_peer_load("peer", {"http://a": 3, "http://c": 2})
    assert pending.prompts_in_flight("http://a") == (4 * r1.prompt_tokens, 4)
    # where we have none, a peer's requests count at the mean of all ours
    assert pending.prompts_in_flight("http://c") == (round(2 * (r1.prompt_tokens + r2.prompt_tokens) / 2), 2)
    assert pending.pop("http://a", r1) is not None
    pending.set_peer_load("peer", {})
    assert pending.prompts_in_flight("http://a") == (0, 0)


def learn_a_decode(policy: TtftCost) -> None:
    """One finished request: 32 tokens decoded in 9 s."""
    warm = prompt(500, 55)
    url = policy.select(warm, fleet()).worker
    policy.on_complete(Completion(url, warm, True, warm.prompt_tokens, None, 0.3, 32, 9.0))


def decode(policy: TtftCost, request: RouteRequest, url: str) -> str:
    """``request``'s first token came back from ``url``: it decodes there now."""
    policy.on_first_token(FirstToken(url, request, request.prompt_tokens, None))
    return url


@pytest.mark.parametrize("kv_wait", [True, False])
def test_a_follower_leaves_a_holder_with_no_room_once_waiting_costs_more_than_recomputing(kv_wait: bool) -> None:
    # The GPU fleet's tail: one engine that drew 16-18 requests of ~3,000 tokens at once (its
    # 48k pool read whole) made 4-6 more wait there 4-5 s while another ran 12 with none waiting.
    # (the fleet-mean gate off: with every request on one of four workers it fires at the sixth)
    policy = TtftCost(TtftParams(kv_wait=kv_wait, spill_over_mean=0.0))
    learn_a_decode(policy)
    group = [prompt(1 + i, 55, shared=50, shared_tag=7) for i in range(30)]
    home = decode(policy, group[0], policy.select(group[0], fleet()).worker)
    stayed = 1
    for r in group[1:]:  # the group's requests pile up on its holder, all still decoding
        d = policy.select(r, fleet())
        if d.worker != home:
            assert d.branch == "spill"
            break
        decode(policy, r, home)
        stayed += 1
    if not kv_wait:
        assert stayed == len(group)
        return
    # 16 fit the pool (16 x 2,976 tokens); past it the wait grows by a 16th of a 9 s decode per
    # request, and the follower leaves once that exceeds recomputing its 2,944 tokens elsewhere
    assert 17 <= stayed <= 22
    assert policy.estimate(group[stayed], fleet()[URLS.index(home)]).features.kv_wait > 0.5


def test_between_workers_both_without_room_the_spill_guard_keeps_the_holder() -> None:
    policy = TtftCost(TtftParams(kv_wait=True))
    learn_a_decode(policy)
    groups = [[prompt(100 * g + i, 55, shared=50, shared_tag=g) for i in range(17)] for g in range(4)]
    homes = []
    for g in groups:  # four groups, one per worker, each filling its worker's pool
        homes.append(decode(policy, g[0], policy.select(g[0], fleet()).worker))
        for r in g[1:16]:
            decode(policy, r, policy.select(r, fleet()).worker)
    assert len(set(homes)) == 4
    last = policy.select(groups[0][16], fleet())
    assert (last.worker, last.branch) == (homes[0], "affinity")



def test_the_pools_together_fit_or_not() -> None:
    kv = KvReads()
    assert kv.fleet_fits([(40_000, POOL), (10_000, POOL)], own=3_000)
    assert not kv.fleet_fits([(60_000, POOL), (35_000, POOL)], own=3_000)  # 98,000 > 96,000
    assert kv.fleet_fits([(60_000, POOL), (35_000, None)], own=3_000)  # a pool of unknown size: no gate


@pytest.mark.parametrize("others", [8, 15])
def test_a_follower_leaves_for_room_only_while_the_pools_together_have_room(others: int) -> None:
    # Past the knee every pool is full: a follower moved for room recomputes its prefix to fill
    # another pool in turn (GPU runs 40-42). The three other workers run 15 requests each (the
    # scrape) and hold ``others`` of our peers' in their pools; one more fits each of them alone
    # either way, but at 15 the holder's overflow does not fit the fleet's pools together.
    policy = TtftCost(TtftParams(kv_wait=True, spill_over_mean=0.0))
    warm = prompt(500, 55)
    url = policy.select(warm, fleet()).worker
    policy.on_complete(Completion(url, warm, True, warm.prompt_tokens, None, 0.3, 32, 3.0))  # 32 tokens in 3 s
    group = [prompt(1 + i, 55, shared=50, shared_tag=7) for i in range(30)]
    home = decode(policy, group[0], policy.select(group[0], fleet()).worker)
    policy.pending.set_peer_load("peer", {u: others for u in URLS if u != home})
    on_home, branch = 1, "affinity"
    for r in group[1:]:
        scrape = [WorkerSnapshot(u, max_total_tokens=POOL, page_size=BT, queued=0,
                                 running=on_home if u == home else 15) for u in URLS]
        d = policy.select(r, scrape)
        if d.worker != home:
            branch = d.branch
            break
        decode(policy, r, home)
        on_home += 1
    if others == 8:  # room in the fleet: it leaves once waiting for room costs more than recomputing
        assert branch == "spill" and 17 <= on_home <= 24
    else:
        assert on_home == len(group)


def test_blocks_in_flight_count_a_shared_prefix_once_and_follow_dispatch_retry_and_completion() -> None:
    pending = PendingWork(max_tracked_per_worker=64, count_blocks=True)
    x = Features(0, 0, 0, 0)
    a1, a2 = prompt(1, 55, shared=50, shared_tag=7), prompt(2, 55, shared=50, shared_tag=7)
    other = prompt(3, 55)
    shared, whole = prefix_tokens(50, BT), a1.prompt_tokens
    pending.add("http://a", InFlight(a1, x, (), ()))
    assert pending.distinct_in_flight("http://a") == (whole, 1)
    # a second request of the group adds only its own blocks past the shared 50
    assert pending.new_tokens("http://a", a2) == whole - shared
    assert pending.new_tokens("http://a", other) == other.prompt_tokens
    pending.add("http://a", InFlight(a2, x, (), ()))
    assert pending.distinct_in_flight("http://a") == (2 * whole - shared, 2)
    assert pending.prompts_in_flight("http://a") == (2 * whole, 2)  # contexts whole, for comparison
    pending.add("http://b", InFlight(a2, x, (), ()))  # a2 retried on b
    assert pending.distinct_in_flight("http://a") == (whole, 1)
    assert pending.distinct_in_flight("http://b") == (whole, 1)
    pending.set_peer_load("peer", {"http://a": 2})  # peers' requests at our mean distinct share
    assert pending.distinct_in_flight("http://a") == (3 * whole, 3)
    pending.set_peer_load("peer", {})
    assert pending.pop("http://a", a1) is not None and pending.pop("http://b", a2) is not None
    assert pending.distinct_in_flight("http://a") == pending.distinct_in_flight("http://b") == (0, 0)
    assert pending.new_tokens("http://a", a1) == whole


@pytest.mark.parametrize("counts", ["contexts", "blocks"])
def test_a_group_sharing_its_prefix_fits_where_an_engine_stores_the_prefix_once(counts: str) -> None:
    # SGLang's radix cache (and vLLM's blocks) hold a prefix shared by many requests once: 30
    # 2,944-token prompts sharing the first 2,304 take ~22k tokens of a 48k pool (outputs
    # included), not 30 whole contexts (~89k). Counted whole they look out of room: the group splits.
    policy = TtftCost(TtftParams(kv_wait=True, kv_wait_counts=counts, spill_over_mean=0.0))
    learn_a_decode(policy)
    group = [prompt(1 + i, 55, shared=50, shared_tag=7) for i in range(30)]
    home = decode(policy, group[0], policy.select(group[0], fleet()).worker)
    stayed = 1
    for r in group[1:]:
        if policy.select(r, fleet()).worker != home:
            break
        decode(policy, r, home)
        stayed += 1
    if counts == "contexts":
        assert 17 <= stayed <= 22
    else:
        assert stayed == len(group)
        assert policy.estimate(group[-1], fleet()[URLS.index(home)]).features.kv_wait == 0


def test_kv_wait_counts_is_validated() -> None:
    from proxy.config import ConfigError
    with pytest.raises(ConfigError, match="kv_wait_counts"):
        TtftParams(kv_wait_counts="tokens").validate()
