"""ttft's ``popularity`` placement: the traffic of the groups placed on each worker, and a new
group sent where it is least."""

from __future__ import annotations

import pytest

from proxy.routing import ttft_popularity
from proxy.routing.base import WorkerSnapshot
from proxy.routing.ttft_cost import TtftCost, TtftParams
from proxy.routing.ttft_popularity import Popularity
from tests.unit.test_ttft import URLS, finish, fleet, prompt


def test_a_workers_load_is_the_decayed_traffic_of_the_keys_placed_on_it() -> None:
    p = Popularity()
    p.place(1, "a")
    for _ in range(10):
        p.seen(1)
    p.place(2, "b")
    p.seen(2)
    p.seen(3)  # never placed: counted, on no worker
    decay = (1 - 1 / ttft_popularity.WINDOW)
    assert p.load("a") == pytest.approx(sum(decay ** k for k in range(2, 12)))
    assert p.load("b") == pytest.approx(decay)
    assert p.count(3) == pytest.approx(1.0)
    # placed elsewhere (its holder evicted it, a cold decision put it on b): its traffic moves along
    p.place(1, "b")
    assert p.load("a") == pytest.approx(0.0, abs=1e-9)
    assert p.load("b") == pytest.approx(p.count(1) + p.count(2))


def test_a_new_generation_empties_a_workers_placements_but_keeps_the_keys_counts() -> None:
    p = Popularity()
    p.sync([WorkerSnapshot("a", generation=0), WorkerSnapshot("b", generation=0)])
    p.place(1, "a")
    for _ in range(5):
        p.seen(1)
    before = p.count(1)
    p.sync([WorkerSnapshot("a", generation=1), WorkerSnapshot("b", generation=0)])  # a flushed
    assert p.load("a") == 0.0 and p.count(1) == before
    p.place(1, "b")  # placed anew: its whole history comes with it
    assert p.load("b") == pytest.approx(before)
    p.keep({"a"})  # b left the fleet
    assert p.load("b") == 0.0


def test_keys_are_bounded_and_counts_survive_renormalisation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ttft_popularity, "MAX_KEYS", 3)
    monkeypatch.setattr(ttft_popularity, "_RENORMALIZE_AT", 1.01)  # every few requests
    p = Popularity()
    p.place(1, "a")
    p.seen(1)
    for key in (2, 3, 4):  # key 1, least recently seen, is dropped with its load
        p.seen(key)
    assert p.count(1) == 0.0 and p.load("a") == pytest.approx(0.0, abs=1e-9)
    p.place(2, "a")
    for _ in range(50):
        p.seen(2)
    decay = (1 - 1 / ttft_popularity.WINDOW)
    # its first request came before keys 3 and 4; its whole count is a's load, through ~20 rescalings
    assert p.count(2) == pytest.approx(sum(decay ** k for k in range(50)) + decay ** 52, rel=1e-9)
    assert p.load("a") == pytest.approx(p.count(2), rel=1e-9)


def test_a_new_group_goes_where_the_groups_placed_bring_the_least_traffic() -> None:
    # group 1 (popular, 12 requests) was placed on a, groups 2 and 3 (one request each) on b, each
    # while only that worker was up; every request has finished, so nothing is outstanding. The
    # rule without popularity places a new group by its cold placements (a, with one group); with it
    # it goes to b, whose groups bring less traffic.
    a_only = [fleet()[0], WorkerSnapshot(fleet()[1].url, healthy=False)]
    b_only = [WorkerSnapshot(fleet()[0].url, healthy=False), fleet()[1]]
    both = fleet()[:2]

    def placed_then_new(params: TtftParams) -> str:
        policy = TtftCost(params)
        for tag, n, up in ((1, 12, a_only), (2, 1, b_only), (3, 1, b_only)):
            for k in range(n):
                r = prompt(tag * 100 + k, 24, shared=20, shared_tag=tag)  # a key (16 blocks) per group
                d = policy.select(r, up)
                finish(policy, r, d.worker, ttft=0.05)
        return policy.select(prompt(900, 24, shared=20, shared_tag=9), both).worker

    assert placed_then_new(TtftParams(popularity=False)) == URLS[0]
    assert placed_then_new(TtftParams(popularity=True)) == URLS[1]


def test_a_workers_hot_tokens_are_the_prompts_of_its_keys_still_requested() -> None:
    p = Popularity()
    p.place(1, "a", 2_400)
    p.seen(1)
    p.place(2, "a", 1_000)
    p.seen(2)
    p.place(3, "b", 500)
    p.seen(3)
    assert p.hot_tokens("a") == 3_400 and p.hot_tokens("b") == 500 and p.hot_tokens("c") == 0
    p.place(2, "b", 1_000)  # moved: its tokens go with it
    assert p.hot_tokens("a") == 2_400 and p.hot_tokens("b") == 1_500
    for _ in range(2 * ttft_popularity.WINDOW):  # key 1 asked again and again, the others not
        p.seen(1)
    assert p.hot_tokens("a") == 2_400 and p.hot_tokens("b") == 0  # no longer requested
    p.drop("a")  # its cache started empty
    assert p.hot_tokens("a") == 0
