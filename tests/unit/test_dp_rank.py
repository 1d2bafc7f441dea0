"""Which DP rank of a worker takes a request (proxy/routing/dp_rank.py), the per-rank state the
scrape reads for it (proxy/workers/scrape.py), and where each rank publishes its KV events."""

from __future__ import annotations

from collections import Counter

import pytest

from proxy.request import Dialect, GenerateRequest
from proxy.routing.dp_rank import RankBook, affinity_key, choose_rank
from proxy.routing.prefix_key import build_route_request
from proxy.workers.kv_events import offset_endpoint
from proxy.workers.scrape import parse_loads, parse_server_info

KW = {"block_tokens": 16, "chars_per_token": 4.0, "max_blocks": 2048}


def route(text: str):  # type: ignore[no-untyped-def]
    return build_route_request(GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", text=text), **KW)


def test_a_shared_head_is_one_key_and_keys_spread_evenly_over_the_ranks() -> None:
    system = "You are the support agent of shop number 7. " * 40  # well past the key's 256 tokens
    a, b = route(system + "Where is my order?"), route(system + "Cancel it, please.")
    assert affinity_key(a) == affinity_key(b) is not None
    assert affinity_key(route("short")) is None  # no full block
    ranks = Counter(choose_rank(k, 4) for k in range(2_000))
    assert set(ranks) == {0, 1, 2, 3} and min(ranks.values()) > 420  # 500 each, give or take
    assert all(choose_rank(k, 4) == choose_rank(k, 4) for k in range(50))  # stable


def test_a_rank_past_the_bound_is_passed_over_for_the_next_in_the_keys_order() -> None:
    key = 12345
    first = choose_rank(key, 4)
    busy = [2, 2, 2, 2]
    assert choose_rank(key, 4, busy, placed=first) == first  # balanced: its own rank
    busy[first] = 30  # mean 9: bound max(13.5, 13) — passed over
    second = choose_rank(key, 4, busy, placed=first)
    assert second != first and busy[second] <= 13.5
    busy[first] = 7  # mean 3.25: within max(4.9, 7.25), kept
    assert choose_rank(key, 4, busy, placed=first) == first
    assert choose_rank(None, 4, [5, 1, 7, 3]) == 1 and choose_rank(None, 4) == 0
    assert choose_rank(key, 4, [1, 2]) == first  # loads of another rank count: ignored


def test_a_new_head_goes_to_the_least_loaded_rank_and_its_followers_to_where_it_went() -> None:
    key = 777
    hashed = choose_rank(key, 4)
    loads = [3, 3, 3, 3]
    loads[hashed] = 5
    new = choose_rank(key, 4, loads, placed=None)  # not seen: not the hash's rank, the least loaded
    assert new != hashed and loads[new] == 3
    assert choose_rank(key, 4, [3, 3, 3, 3], placed=None) == hashed  # equal loads: the hash's order
    loads = [4, 4, 4, 4]
    assert choose_rank(key, 4, loads, placed=new) == new  # followers: where it was placed
    loads[new] = 40  # past the bound: the next in the hash's order
    assert choose_rank(key, 4, loads, placed=new) != new
    held = [0, 0, 0, 0]
    held[hashed] = 512
    assert choose_rank(key, 4, [4, 4, 4, 4], held, placed=new) == hashed  # the events know better


def test_the_rank_book_remembers_per_worker_and_forgets_the_least_recent_past_its_capacity() -> None:
    book = RankBook(capacity=2)
    book.put("a", 1, 3)
    book.put("b", 1, 0)
    assert (book.get("a", 1, 4), book.get("b", 1, 4), book.get("a", 2, 4), book.get("a", None, 4)) == (3, 0, None, None)
    assert book.get("a", 1, 2) is None  # placed on rank 3 when the worker had more ranks
    book.get("a", 1, 4)  # used: "b" is now the least recent
    book.put("a", 2, 1)
    assert (book.get("a", 1, 4), book.get("b", 1, 4), book.get("a", 2, 4)) == (3, None, 1)
    book.put("a", None, 2)  # a keyless prompt is not booked
    assert book.get("a", 2, 4) == 1


def test_the_book_places_a_new_head_by_load_and_keeps_its_followers_there() -> None:
    book, key = RankBook(), 777
    loads = [3, 3, 3, 3]
    loads[choose_rank(key, 4)] = 5
    first = book.place("w", key, 4, loads)
    assert loads[first] == 3 and book.get("w", key, 4) == first  # booked where it went
    assert book.place("w", key, 4, [0, 0, 0, 0]) == first  # a follower: not re-placed by load
    book.put("v", key, 3)
    assert book.place("v", key, 2, [9, 0]) == 1 and book.get("v", key, 4) == 1  # fewer ranks now: placed anew


def test_the_scrape_reads_ranks_and_their_loads() -> None:
    loads = {"loads": [{"dp_rank": i, "num_running_reqs": r, "num_waiting_reqs": w}
                       for i, (r, w) in enumerate([(3, 1), (0, 0), (5, 2), (1, 0)])]}
    state = parse_loads(loads)
    assert state.dp_outstanding == (4, 0, 7, 1) and state.running == 9
    assert parse_server_info({"dp_size": 4, "page_size": 16}).dp_size == 4


@pytest.mark.parametrize("ranks", [
    [0],  # one rank: nothing to choose
    [0, 0],  # a rank twice
    [0, 2],  # a gap
    [0, "1"],  # not an integer
])
def test_ranks_that_do_not_make_0_to_n_minus_1_give_no_per_rank_loads(ranks: list[object]) -> None:
    doc = {"loads": [{"dp_rank": r, "num_running_reqs": 1, "num_waiting_reqs": 0} for r in ranks]}
    assert parse_loads(doc).dp_outstanding is None


def test_a_dp_workers_kv_pool_is_its_ranks_pools_together_as_v1_loads_counts_it() -> None:
    sched = {"scheduler_info": {"max_total_num_tokens": 1000}}  # rank 0's, as SGLang answers
    ranks = [{"memory_usage": {"token_capacity": c}, "effective_max_running_requests_per_dp": 8}
             for c in (1000, 1000, 1000, 900)]
    assert parse_server_info({**sched, "dp_size": 4, "internal_states": ranks}).max_total_tokens == 3900
    assert parse_server_info({**sched, "dp_size": 4}).max_total_tokens == 4000  # ranks' own not listed
    assert parse_server_info({**sched, "dp_size": 4, "internal_states": ranks[:3]}).max_total_tokens == 4000
    assert parse_server_info({**sched, "dp_size": 1, "internal_states": ranks[:1]}).max_total_tokens == 1000
    assert parse_server_info(sched).max_total_tokens == 1000
    assert parse_loads({"loads": [{"dp_rank": r, "max_total_num_tokens": 1000} for r in range(4)]}
                       ).max_total_tokens == 4000


@pytest.mark.parametrize("dp", [0, -1, 10**9, True, "4", 2.0])
def test_a_dp_size_out_of_bounds_is_not_believed(dp: object) -> None:
    assert parse_server_info({"dp_size": dp}).dp_size is None


def test_the_rank_holding_most_of_the_prompt_comes_first_and_ties_keep_the_hash_order() -> None:
    key = 12345
    first = choose_rank(key, 4)
    other = (first + 1) % 4
    held = [0, 0, 0, 0]
    assert choose_rank(key, 4, matched=held) == first  # nothing held anywhere: the hash decides
    held[other] = 512
    assert choose_rank(key, 4, matched=held) == other  # found where it is, not recomputed
    held[first] = 512
    assert choose_rank(key, 4, matched=held) == first  # held on both: the hash breaks the tie
    held[first] = 256
    loads = [2, 2, 2, 2]
    loads[other] = 30  # the holder is past the bound: the next holder in the order takes it
    assert choose_rank(key, 4, loads, held) == first
    assert choose_rank(None, 4, [0, 0, 0, 0], [0, 0, 48, 0]) == 2  # a keyless prompt held on a rank
    assert choose_rank(key, 4, matched=[512, 0]) == first  # another rank count's holdings: ignored


@pytest.mark.parametrize(("endpoint", "rank", "expected"), [
    ("tcp://*:5557", 0, "tcp://*:5557"),
    ("tcp://*:5557", 3, "tcp://*:5560"),
    ("tcp://[::1]:6000", 2, "tcp://[::1]:6002"),
    ("tcp://10.0.0.7:65535", 1, None),  # past the last port
    ("tcp://127.0.0.1:0", 1, None),  # any free port: no rank's can be told
    ("inproc://cache", 2, "inproc://cache_dp2"),
    ("ipc:///tmp/kv", 1, None),  # the engines refuse it for a rank past 0
    ("ipc:///tmp/kv", 0, "ipc:///tmp/kv"),
])
def test_each_rank_publishes_at_the_configured_port_plus_its_rank(endpoint: str, rank: int, expected: str | None) -> None:
    assert offset_endpoint(endpoint, rank) == expected
