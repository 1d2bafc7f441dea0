"""Peer messages (pure): round trip, every malformed field named; and our load as the peers hear it."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import proxy.peers as peers
from proxy.config_sections import RoutingConfig
from proxy.errors import BadRequest
from proxy.peers import MAX_BLOCKS, MAX_WORKERS, Message, Placement, Prefilled, decode, encode
from proxy.routing.base import RouteRequest
from proxy.routing.round_robin import RoundRobin
from proxy.telemetry.metrics import Metrics

routes = st.builds(
    RouteRequest,
    model=st.text(max_size=20),
    block_hashes=st.lists(st.integers(0, 2**64 - 1), max_size=40).map(tuple),
    block_tokens=st.integers(1, 4096),
    prompt_tokens=st.integers(0, 10**6),
    stream=st.booleans(),
)


decisions = st.builds(Placement, st.text(min_size=1, max_size=30), routes, st.text(max_size=10), st.integers(0, 10**6),
                      st.none() | st.integers(0, 63))
notices = st.builds(Prefilled, st.text(max_size=30), st.text(max_size=10))


loads = st.none() | st.dictionaries(st.text(min_size=1, max_size=30), st.integers(0, 10**6), max_size=8)


@given(st.lists(decisions, max_size=20), st.lists(notices, max_size=20), loads)
def test_messages_survive_the_wire(ds: list[Placement], ns: list[Prefilled], load: dict[str, int] | None) -> None:
    assert decode(encode(ds, ns, "me", load)) == Message("me", ds, ns, load)


def test_a_message_from_an_older_peer_tells_no_load() -> None:
    assert decode(one()).in_flight is None


def test_a_decision_from_an_older_peer_without_stream_is_not_streamed() -> None:
    assert decode(one()).decisions[0].route.stream is False


def test_a_decision_from_an_older_peer_names_no_rank() -> None:
    assert decode(one()).decisions[0].dp_rank is None
    assert decode(one(dp_rank=3)).decisions[0].dp_rank == 3


def one(**change: object) -> bytes:
    d = {"worker": "http://w", "model": "m", "block_tokens": 16, "prompt_tokens": 32, "blocks": [1, 2], **change}
    return json.dumps({"v": 1, "decisions": [d]}).encode()


@pytest.mark.parametrize(("body", "field"), [
    (b"{nope", "body"),
    (b"[]", "body"),
    (b'{"v": 2, "decisions": []}', "v"),
    (b'{"v": 1, "decisions": {}}', "decisions"),
    (b'{"v": 1, "from": 7, "decisions": []}', "from"),
    (b'{"v": 1, "decisions": [3]}', "decisions[0]"),
    (one(worker=""), "decisions[0].worker"),
    (one(model=None), "decisions[0].model"),
    (one(block_tokens=0), "decisions[0].block_tokens"),
    (one(block_tokens=True), "decisions[0].block_tokens"),
    (one(prompt_tokens=-1), "decisions[0].prompt_tokens"),
    (one(blocks="12"), "decisions[0].blocks"),
    (one(blocks=[2**64]), "decisions[0].blocks"),
    (one(blocks=[1.5]), "decisions[0].blocks"),
    (one(blocks=list(range(MAX_BLOCKS + 1))), "decisions[0].blocks"),
    (one(uncached=-3), "decisions[0].uncached"),
    (one(ref=5), "decisions[0].ref"),
    (one(stream="yes"), "decisions[0].stream"),
    (one(dp_rank=-1), "decisions[0].dp_rank"),
    (one(dp_rank=True), "decisions[0].dp_rank"),
    (one(dp_rank=1.0), "decisions[0].dp_rank"),
    (one(dp_rank=10**6), "decisions[0].dp_rank"),
    (b'{"v": 1, "prefilled": {}}', "prefilled"),
    (b'{"v": 1, "prefilled": [{"worker": "http://w"}]}', "prefilled[0]"),
    (b'{"v": 1, "in_flight": [1]}', "in_flight"),
    (b'{"v": 1, "in_flight": {"": 1}}', "in_flight"),
    (b'{"v": 1, "in_flight": {"http://w": -1}}', "in_flight['http://w']"),
    (b'{"v": 1, "in_flight": {"http://w": "3"}}', "in_flight['http://w']"),
    (json.dumps({"v": 1, "in_flight": {f"http://w{i}": 1 for i in range(MAX_WORKERS + 1)}}).encode(), "in_flight"),
])
def test_a_malformed_message_names_its_field(body: bytes, field: str) -> None:
    with pytest.raises(BadRequest) as e:
        decode(body)
    assert e.value.message.startswith(field + ":"), e.value.message


def test_our_load_as_peers_hear_it_follows_routes_retries_and_ends() -> None:
    sync = peers.PeerSync(RoutingConfig(), RoundRobin(), Metrics(CollectorRegistry()))
    route = RouteRequest(model="m", block_hashes=(1, 2), block_tokens=16, prompt_tokens=32)
    sync.routed("http://a", route, 0, "r1")
    sync.routed("http://a", route, 0, "r2")
    sync.routed("http://b", RouteRequest(model="m"), 0, "r3")  # no prompt to tell of, still a load
    assert sync.in_flight() == {"http://a": 2, "http://b": 1}
    sync.routed("http://b", route, 0, "r1")  # r1 failed on a and was retried on b
    assert sync.in_flight() == {"http://a": 1, "http://b": 2}
    sync.finished("http://b", "r1")
    sync.finished("http://b", "r1")  # told twice: counted once
    sync.finished("http://a", "r2")
    assert sync.in_flight() == {"http://b": 1}


def test_our_load_is_bounded_when_ends_go_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "MAX_IN_FLIGHT", 3)
    sync = peers.PeerSync(RoutingConfig(), RoundRobin(), Metrics(CollectorRegistry()))
    for i in range(5):
        sync.routed("http://a" if i < 2 else "http://b", RouteRequest(model="m"), 0, f"r{i}")
    assert sync.in_flight() == {"http://b": 3}  # the two oldest dropped
