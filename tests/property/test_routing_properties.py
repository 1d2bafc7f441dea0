"""Routing invariants under generated inputs (Hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.request import Dialect, GenerateRequest
from proxy.routing.base import Completion, NoWorkerAvailable, RouteRequest, WorkerSnapshot
from proxy.routing.consistent_hash import HashRing
from proxy.routing.prefix_index import WorkerIndex
from proxy.routing.prefix_key import build_route_request, prefix_tokens
from proxy.routing.registry import available, build_named

KW = {"block_tokens": 16, "chars_per_token": 4.0, "max_blocks": 512}
texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=3000)


def route(text: str, model: str = "m") -> RouteRequest:
    return build_route_request(GenerateRequest(dialect=Dialect.SGLANG, payload={}, model=model, text=text), **KW)


@settings(max_examples=60, deadline=None)
@given(texts, texts)
def test_a_prompt_extending_another_shares_all_its_block_hashes(base: str, extra: str) -> None:
    short, long = route(base), route(base + extra)
    assert long.block_hashes[: len(short.block_hashes)] == short.block_hashes


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=64, max_size=2000), st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=20))
def test_changing_the_model_changes_every_hash(text: str, m1: str, m2: str) -> None:
    if m1 == m2:
        return
    a, b = route(text, m1), route(text, m2)
    assert a.block_hashes and not set(a.block_hashes) & set(b.block_hashes)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=16, max_value=5000),
    st.lists(st.tuples(st.integers(0, 20), st.integers(0, 150), st.booleans()), max_size=40),
)
def test_the_index_never_holds_more_tokens_than_its_capacity(capacity: int, ops: list[tuple[int, int, bool]]) -> None:
    index = WorkerIndex(capacity)
    for tag, n, miss in ops:
        hashes = [tag * 10_000 + i for i in range(n)]
        touches = index.last_touches(hashes[: index.match(hashes).confirmed])
        index.record(hashes, 16)
        if miss:
            index.correct(16, touches, cached_tokens=0)
        index.record(hashes, 16, confirmed=True)
        assert index.tokens <= index.capacity == capacity
        assert index.tokens == sum(
            prefix_tokens(i + 1, 16) - prefix_tokens(i, 16) for t in range(21) for i in range(400) if t * 10_000 + i in index
        )


fleets = st.lists(
    st.builds(
        WorkerSnapshot,
        url=st.sampled_from([f"http://w{i}" for i in range(6)]),
        healthy=st.booleans(),
        in_flight=st.integers(0, 50),
        running=st.none() | st.integers(0, 64),
        queued=st.none() | st.integers(0, 64),
        waiting_uncached_tokens=st.none() | st.integers(0, 100_000),
        token_usage=st.none() | st.floats(0, 1),
        max_running_requests=st.none() | st.integers(1, 64),
        stale=st.booleans(),
        generation=st.integers(0, 2),
    ),
    min_size=1,
    max_size=6,
    unique_by=lambda w: w.url,
)


@settings(max_examples=40, deadline=None)
@given(fleets, st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000)), min_size=1, max_size=8))
def test_every_policy_names_only_healthy_workers(workers: list[WorkerSnapshot], prompts: list[tuple[int, int]]) -> None:
    healthy_urls = {w.url for w in workers if w.healthy}
    for name in sorted(available()):
        policy = build_named(name, {}, rng=random.Random(0))
        for group, length in prompts:
            request = route(f"group {group} " * (length // 8))
            if not healthy_urls:
                with pytest.raises(NoWorkerAvailable):
                    policy.select(request, workers)
                continue
            decision = policy.select(request, workers)
            assert decision.worker in healthy_urls, name
            assert decision.branch
            policy.on_complete(Completion(decision.worker, request, ok=True, prompt_tokens=request.prompt_tokens, cached_tokens=0, ttft=0.1))


@settings(max_examples=20, deadline=None)
@given(st.integers(3, 12), st.integers(0, 2**32))
def test_adding_one_worker_moves_about_one_nth_of_the_keys(n: int, seed: int) -> None:
    urls = [f"http://10.0.0.{i}:3000{seed % 7}" for i in range(n)]
    before, after = HashRing(urls, 150), HashRing([*urls, "http://10.0.1.1:30000"], 150)
    rng = random.Random(seed)
    keys = [rng.getrandbits(64) for _ in range(2000)]
    moved = [k for k in keys if before.home(k) != after.home(k)]
    # Only keys that now belong to the new worker move; about 1/(n+1) of them.
    assert all(after.home(k) == "http://10.0.1.1:30000" for k in moved)
    assert abs(len(moved) / len(keys) - 1 / (n + 1)) < 0.5 / (n + 1)


@settings(max_examples=20, deadline=None)
@given(st.integers(3, 12), st.integers(0, 2**32))
def test_removing_one_worker_moves_only_its_keys(n: int, seed: int) -> None:
    urls = [f"http://10.0.0.{i}:3000{seed % 7}" for i in range(n)]
    before, after = HashRing(urls, 150), HashRing(urls[1:], 150)
    rng = random.Random(seed)
    for k in (rng.getrandbits(64) for _ in range(500)):
        if before.home(k) != urls[0]:
            assert after.home(k) == before.home(k)
