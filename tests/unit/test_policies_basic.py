"""round_robin, least_load and the policy registry."""

import random
from collections import Counter

import pytest

from proxy.config import ConfigError, RoutingConfig
from proxy.routing.base import NoWorkerAvailable, RouteRequest, WorkerSnapshot
from proxy.routing.least_load import LeastLoad, LeastLoadParams
from proxy.routing.registry import available, build_policy
from proxy.routing.round_robin import RoundRobin

REQ = RouteRequest(model="m")


def test_round_robin_takes_healthy_workers_in_turn() -> None:
    rr = RoundRobin()
    workers = [WorkerSnapshot("a"), WorkerSnapshot("b", healthy=False), WorkerSnapshot("c")]
    picks = [rr.select(REQ, workers).worker for _ in range(4)]
    assert picks == ["a", "c", "a", "c"]


def test_round_robin_without_healthy_workers_raises() -> None:
    with pytest.raises(NoWorkerAvailable):
        RoundRobin().select(REQ, [WorkerSnapshot("a", healthy=False)])


def test_least_load_prefers_the_lighter_of_the_sampled_pair() -> None:
    ll = LeastLoad(LeastLoadParams(), random.Random(1))
    workers = [WorkerSnapshot("busy", in_flight=10, queued=5), WorkerSnapshot("idle", in_flight=0, queued=0)]
    assert {ll.select(REQ, workers).worker for _ in range(20)} == {"idle"}


def test_least_load_counts_engine_queue_as_load() -> None:
    ll = LeastLoad(LeastLoadParams(), random.Random(1))
    workers = [WorkerSnapshot("a", in_flight=2, queued=9), WorkerSnapshot("b", in_flight=4, queued=0)]
    assert ll.select(REQ, workers).worker == "b"


def test_least_load_treats_stale_workers_as_saturated() -> None:
    ll = LeastLoad(LeastLoadParams(), random.Random(2))
    workers = [WorkerSnapshot("stale", stale=True), WorkerSnapshot("fresh", in_flight=50)]
    assert {ll.select(REQ, workers).worker for _ in range(20)} == {"fresh"}


def test_least_load_spreads_equal_workers_evenly() -> None:
    ll = LeastLoad(LeastLoadParams(), random.Random(3))
    workers = [WorkerSnapshot(u) for u in "abcd"]
    counts = Counter(ll.select(REQ, workers).worker for _ in range(4000))
    assert set(counts) == set("abcd")
    assert max(counts.values()) / min(counts.values()) < 1.2


def test_least_load_with_one_healthy_worker_takes_it() -> None:
    ll = LeastLoad(LeastLoadParams(), random.Random(0))
    d = ll.select(REQ, [WorkerSnapshot("a", healthy=False), WorkerSnapshot("b")])
    assert (d.worker, d.branch) == ("b", "only")


def test_registry_builds_policies_by_name() -> None:
    assert {"round_robin", "least_load"} <= set(available())
    policy = build_policy(RoutingConfig(policy="least_load", params={"choices": 3}), rng=random.Random(0))
    assert policy.name == "least_load"


def test_unknown_policy_fails_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"^routing\.policy: unknown policy 'nope'"):
        build_policy(RoutingConfig(policy="nope"), rng=random.Random(0))


@pytest.mark.parametrize(
    ("params", "pattern"),
    [
        ({"choices": "two"}, r"^routing\.params\.choices: expected an integer"),
        ({"choices": 1}, r"^routing\.params\.choices: must be >= 2"),
        ({"chioces": 2}, r"^routing\.params\.chioces: unknown field"),
    ],
)
def test_bad_policy_params_fail_naming_the_field(params: dict[str, object], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):
        build_policy(RoutingConfig(policy="least_load", params=params), rng=random.Random(0))
