"""consistent_hash: ring lookup, bounded load, session keys."""

from __future__ import annotations

import pytest

from proxy.config import ConfigError
from proxy.routing.base import NoWorkerAvailable, RouteRequest, WorkerSnapshot
from proxy.routing.consistent_hash import ConsistentHash, ConsistentHashParams, HashRing, routing_key

URLS = [f"http://w{i}" for i in range(4)]


def workers(loads: dict[str, int] | None = None, **overrides: dict[str, object]) -> list[WorkerSnapshot]:
    loads = loads or {}
    out = []
    for url in URLS:
        fields: dict[str, object] = {"in_flight": loads.get(url, 0), **overrides.get(url, {})}
        out.append(WorkerSnapshot(url, **fields))  # type: ignore[arg-type]
    return out


def req(blocks: tuple[int, ...] = (), session: str | None = None, text: str = "") -> RouteRequest:
    return RouteRequest(model="m", block_hashes=blocks, session_key=session, prompt_text=text)


def test_the_same_key_goes_home_every_time() -> None:
    policy = ConsistentHash(ConsistentHashParams())
    picks = {policy.select(req((11, 12, 13)), workers()).worker for _ in range(5)}
    assert len(picks) == 1
    assert policy.select(req((11, 12, 13)), workers()).branch == "home"


def test_independent_replicas_agree_without_talking() -> None:
    a, b = ConsistentHash(ConsistentHashParams()), ConsistentHash(ConsistentHashParams())
    for key in range(50):
        assert a.select(req((key,)), workers()).worker == b.select(req((key,)), list(reversed(workers()))).worker


def test_the_key_is_the_hash_of_the_first_key_blocks() -> None:
    assert routing_key(req((1, 2, 3, 4)), 2) == 2
    assert routing_key(req((1, 2)), 16) == 2
    assert routing_key(req((1, 2, 3), session="s"), 2) == routing_key(req((9,), session="s"), 2)
    assert routing_key(req(text="short a"), 4) != routing_key(req(text="short b"), 4)


def test_prompts_sharing_the_first_key_blocks_share_a_worker() -> None:
    policy = ConsistentHash(ConsistentHashParams(key_blocks=2))
    first = policy.select(req((5, 6, 100)), workers()).worker
    assert policy.select(req((5, 6, 200, 300)), workers()).worker == first


def test_a_full_home_spills_to_the_next_worker_on_the_ring() -> None:
    policy = ConsistentHash(ConsistentHashParams(load_factor=1.25))
    home = policy.select(req((42,)), workers()).worker
    decision = policy.select(req((42,)), workers({home: 10}))
    assert decision.branch == "spill"
    assert decision.worker != home
    ring = HashRing(URLS, 150)
    assert decision.worker == ring.walk(42)[1]


def test_an_unhealthy_home_moves_only_its_own_keys() -> None:
    policy = ConsistentHash(ConsistentHashParams())
    before = {k: policy.select(req((k,)), workers()).worker for k in range(200)}
    down = URLS[0]
    after = {k: policy.select(req((k,)), workers(**{down: {"healthy": False}})).worker for k in range(200)}
    moved = [k for k in before if before[k] != after[k]]
    assert moved and all(before[k] == down for k in moved)


def test_stale_workers_are_treated_as_full() -> None:
    policy = ConsistentHash(ConsistentHashParams())
    home = policy.select(req((7,)), workers()).worker
    assert policy.select(req((7,)), workers(**{home: {"stale": True}})).worker != home


def test_when_all_are_full_the_least_loaded_wins() -> None:
    policy = ConsistentHash(ConsistentHashParams())
    stale = {u: {"stale": True} for u in URLS}
    decision = policy.select(req((7,)), workers({URLS[2]: 0, URLS[0]: 3, URLS[1]: 3, URLS[3]: 3}, **stale))
    assert (decision.worker, decision.branch) == (URLS[2], "overloaded")


def test_one_healthy_worker_takes_everything_and_none_raises() -> None:
    policy = ConsistentHash(ConsistentHashParams())
    sick = {u: {"healthy": False} for u in URLS[1:]}
    assert policy.select(req((1,)), workers(**sick)).branch == "only"
    with pytest.raises(NoWorkerAvailable):
        policy.select(req((1,)), workers(**{u: {"healthy": False} for u in URLS}))


@pytest.mark.parametrize("field", ["virtual_nodes", "key_blocks", "load_factor"])
def test_bad_params_name_their_field(field) -> None:
    with pytest.raises(ConfigError, match=f"routing.params.{field}"):
        ConsistentHashParams(**{field: 0}).validate()
