"""cache_aware: the SGLang router baseline (character tree, thresholds, eviction)."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError
from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import NoWorkerAvailable, RouteRequest, WorkerSnapshot
from proxy.routing.cache_aware import CacheAware, CacheAwareParams, CharTree, common_prefix_len
from proxy.routing.prefix_key import build_route_request

URLS = ["http://a", "http://b", "http://c"]


def workers(loads: dict[str, int] | None = None, down: tuple[str, ...] = ()) -> list[WorkerSnapshot]:
    loads = loads or {}
    return [WorkerSnapshot(u, in_flight=loads.get(u, 0), healthy=u not in down) for u in URLS]


def req(text: str, model: str = "m") -> RouteRequest:
    blocks = tuple(range(len(text) // 64))
    return RouteRequest(model=model, prompt_text=text, prompt_tokens=len(text) // 4, block_hashes=blocks)


@pytest.mark.parametrize(("a", "b", "n"), [("", "", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("abc", "x", 0), ("ab", "abcd", 2)])
def test_common_prefix_len(a, b, n) -> None:
    assert common_prefix_len(a, b) == n


def test_the_tree_matches_the_longest_inserted_prefix_and_names_its_tenant() -> None:
    tree = CharTree()
    tree.insert("hello world", "a", 1)
    tree.insert("hello there", "b", 2)
    assert tree.prefix_match("hello world!") == (11, "a")
    assert tree.prefix_match("hello th") == (8, "b")
    assert tree.prefix_match("help") == (3, "b")  # both share "hel"; the most recent wins
    assert tree.size == {"a": 11, "b": 11}  # a tenant counts every char on its path


def test_eviction_drops_the_tenants_least_recent_leaves_down_to_the_limit() -> None:
    tree = CharTree()
    tree.insert("aaaa1111", "a", 1)
    tree.insert("aaaa2222", "a", 2)
    tree.evict_tenant("a", 8)
    assert tree.size["a"] == 8
    assert tree.prefix_match("aaaa1111")[0] == 4
    assert tree.prefix_match("aaaa2222") == (8, "a")


def test_a_miss_goes_to_the_least_loaded_worker_and_a_hit_returns_to_it() -> None:
    policy = CacheAware(CacheAwareParams())
    first = policy.select(req("x" * 100), workers({"http://a": 2, "http://b": 0, "http://c": 1}))
    assert (first.worker, first.branch) == ("http://b", "miss")
    again = policy.select(req("x" * 100 + "y" * 20), workers({"http://a": 0, "http://b": 3, "http://c": 0}))
    assert (again.worker, again.branch) == ("http://b", "hit")
    assert again.matched_blocks > 0


def test_a_match_at_or_below_the_threshold_is_a_miss() -> None:
    policy = CacheAware(CacheAwareParams(cache_threshold=0.5))
    policy.select(req("p" * 50), workers({"http://a": 0, "http://b": 1, "http://c": 1}))
    decision = policy.select(req("p" * 50 + "q" * 50), workers({"http://a": 1, "http://b": 0, "http://c": 1}))
    assert (decision.worker, decision.branch) == ("http://b", "miss")


def test_ties_in_load_go_to_the_first_worker_like_the_router() -> None:
    policy = CacheAware(CacheAwareParams())
    picks = {policy.select(req(f"unique {i} " * 20), workers()).worker for i in range(10)}
    assert picks == {"http://a"}


def test_an_imbalanced_fleet_takes_the_least_loaded_even_on_a_hit() -> None:
    policy = CacheAware(CacheAwareParams(balance_abs_threshold=4, balance_rel_threshold=1.5))
    policy.select(req("s" * 100), workers({"http://b": 1, "http://c": 1}))
    decision = policy.select(req("s" * 100), workers({"http://a": 10, "http://b": 1, "http://c": 2}))
    assert (decision.worker, decision.branch) == ("http://b", "balance")


def test_the_mean_gate_spills_a_hit_only_past_the_fleet_mean_by_margin_and_ratio() -> None:
    # smg 1.13.0's gate: mean 6 of (12, 3, 3) -> margin max(4, 2 sqrt 6 = 4.9); 12 > 10.9 and > 9.
    policy = CacheAware(CacheAwareParams(gate="mean"))
    policy.select(req("g" * 100), workers())
    hot = policy.select(req("g" * 100), workers({"http://a": 12, "http://b": 3, "http://c": 3}))
    assert (hot.worker, hot.branch) == ("http://b", "spill")
    # (9, 3, 3): mean 5, 9 under 5 + 4.5 -> the holder keeps it, where the spread rule
    # (max - min 6 > 4, 9 > 1.5 x 3) would have balanced it away
    policy.select(req("k" * 100), workers())
    kept = policy.select(req("k" * 100), workers({"http://a": 9, "http://b": 3, "http://c": 3}))
    assert (kept.worker, kept.branch) == ("http://a", "hit")
    spread = CacheAware(CacheAwareParams(balance_abs_threshold=4))
    spread.select(req("g" * 100), workers())
    assert spread.select(req("g" * 100), workers({"http://a": 9, "http://b": 3, "http://c": 3})).branch == "balance"
    # a miss is no spill: the least loaded, whatever the loads
    miss = policy.select(req("m" * 100), workers({"http://a": 40, "http://b": 0, "http://c": 0}))
    assert (miss.worker, miss.branch) == ("http://b", "miss")


def test_smgs_overload_protection_leaves_out_workers_whose_scrape_is_over_a_threshold() -> None:
    # smg 1.13.0's defaults: 8 waiting requests or KV token usage 0.8 (scraped); off by default here
    smg = CacheAwareParams(gate="mean", overload_waiting=8, overload_usage=0.8)

    def scraped(**over: tuple[int | None, float | None]) -> list[WorkerSnapshot]:
        return [WorkerSnapshot(u, queued=over.get(u[-1], (0, 0.1))[0], token_usage=over.get(u[-1], (0, 0.1))[1])
                for u in URLS]
    policy = CacheAware(smg)
    assert policy.select(req("h" * 100), scraped()).worker == "http://a"
    # its prefix holder queues 8: the follower goes elsewhere (the least loaded of the rest)
    away = policy.select(req("h" * 100), scraped(a=(8, 0.2)))
    assert (away.worker, away.branch) == ("http://b", "miss")
    # b now holds it too (inserted under the pick); a at 0.8 usage is out, b is under: a hit on b
    assert policy.select(req("h" * 100), scraped(a=(0, 0.8))).worker == "http://b"
    # every worker over: the least loaded by our own count, whatever the tree says
    everyone = [WorkerSnapshot(u, in_flight=n, queued=9) for u, n in zip(URLS, (3, 5, 1), strict=True)]
    over = policy.select(req("h" * 100), everyone)
    assert (over.worker, over.branch) == ("http://c", "overload")
    # under 8 and 0.8, or never scraped (engines that report nothing), nobody is left out
    assert policy.select(req("h" * 100), scraped(a=(7, 0.79), b=(7, 0.79))).branch == "hit"
    blind = [WorkerSnapshot(u) for u in URLS]
    assert policy.select(req("h" * 100), blind).branch == "hit"
    # and with the protection off (the default), a worker over both keeps its prefix
    plain = CacheAware(CacheAwareParams(gate="mean"))
    plain.select(req("h" * 100), scraped())
    assert plain.select(req("h" * 100), scraped(a=(20, 0.95))).worker == "http://a"


def test_a_hit_on_an_unhealthy_tenant_falls_back_to_least_load() -> None:
    policy = CacheAware(CacheAwareParams())
    policy.select(req("z" * 100), workers())
    decision = policy.select(req("z" * 100), workers({"http://b": 1}, down=("http://a",)))
    assert (decision.worker, decision.branch) == ("http://c", "miss")


def routed(prompt: str | list[int] | list[dict[str, str]]) -> RouteRequest:
    """The pipeline's routing view of a text, token-id or chat prompt."""
    kind = "text" if isinstance(prompt, str) else "messages" if prompt and isinstance(prompt[0], dict) else "input_ids"
    request = GenerateRequest(dialect=Dialect.SGLANG, payload={}, model="m", **{kind: prompt})  # type: ignore[arg-type]
    return build_route_request(request, block_tokens=16, chars_per_token=4.0, max_blocks=2048)


SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 20}


@pytest.mark.parametrize(("why", "first", "follow_up"), [
    ("token ids extending earlier ids", list(range(1000, 1400)), [*range(1000, 1400), *range(7, 50)]),
    ("token ids past the last code point", [0x110000 + i for i in range(400)], [0x110000 + i for i in range(450)]),
    ("token ids in the surrogate range", list(range(0xD800, 0xD800 + 400)), list(range(0xD800, 0xD800 + 420))),
    ("a chat's next turn extending its conversation",
     [SYSTEM, {"role": "user", "content": "first question"}],
     [SYSTEM, {"role": "user", "content": "first question"}, {"role": "assistant", "content": "an answer"},
      {"role": "user", "content": "a follow-up"}]),
    ("text extending earlier text", "t" * 400, "t" * 400 + "more"),
])
def test_a_prompt_of_any_kind_returns_to_the_worker_that_holds_its_prefix(why: str, first, follow_up) -> None:
    policy = CacheAware(CacheAwareParams())
    home = policy.select(routed(first), workers({"http://a": 2, "http://b": 0, "http://c": 1}))
    assert (home.worker, home.branch) == ("http://b", "miss"), why
    again = policy.select(routed(follow_up), workers({"http://a": 0, "http://b": 3, "http://c": 0}))
    assert (again.worker, again.branch) == ("http://b", "hit"), why
    assert again.matched_blocks > 0, why


def test_text_and_token_ids_never_match_each_other() -> None:
    policy = CacheAware(CacheAwareParams())
    policy.select(routed("x" * 400), workers({"http://a": 1, "http://c": 1}))  # b
    # The same code points, as token ids: another key space.
    ids = policy.select(routed([ord("x")] * 400), workers({"http://b": 1, "http://c": 1}))
    assert (ids.worker, ids.branch) == ("http://a", "miss")
    assert policy.tree("m").prefix_match("x" * 400) == (400, "http://b")
    assert policy.tree("m", "ids").prefix_match("x" * 400) == (400, "http://a")


def test_an_empty_prompt_misses() -> None:
    policy = CacheAware(CacheAwareParams())
    policy.select(req(""), workers())
    assert policy.select(req(""), workers({"http://a": 1})).branch == "miss"


def test_each_model_has_its_own_tree() -> None:
    policy = CacheAware(CacheAwareParams())
    policy.select(req("m" * 100, model="one"), workers({"http://b": 1, "http://c": 1}))
    decision = policy.select(req("m" * 100, model="two"), workers({"http://a": 1, "http://c": 1}))
    assert (decision.worker, decision.branch) == ("http://b", "miss")


def test_workers_that_leave_are_removed_from_the_trees() -> None:
    policy = CacheAware(CacheAwareParams())
    policy.select(req("k" * 100), workers())
    policy.on_worker_change(workers()[1:])
    assert "http://a" not in policy.tree("m").size
    assert policy.tree("m").prefix_match("k" * 100) == (0, None)


def test_no_healthy_worker_raises() -> None:
    with pytest.raises(NoWorkerAvailable):
        CacheAware(CacheAwareParams()).select(req("x"), workers(down=tuple(URLS)))


@pytest.mark.parametrize(
    ("field", "value"),
    [("cache_threshold", 1.5), ("balance_abs_threshold", -1), ("balance_rel_threshold", 0.5), ("max_tree_size", 0),
     ("gate", "max"), ("overload_waiting", -1), ("overload_usage", 1.5)],
)
def test_bad_params_name_their_field(field, value) -> None:
    with pytest.raises(ConfigError, match=f"routing.params.{field}"):
        CacheAwareParams(**{field: value}).validate()
