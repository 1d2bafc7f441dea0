"""The pure limit rules: token bucket, per-client rate limiter, connection gate, client identity."""

from __future__ import annotations

import pytest

from proxy.limits import ConnectionGate, RateLimiter, TokenBucket, client_identity


def test_a_full_bucket_grants_burst_requests_then_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, tokens=3.0, updated=0.0)
    assert [bucket.take(0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take(0.0) == pytest.approx(0.5)  # one token per 0.5 s


def test_tokens_refill_at_the_rate_and_never_beyond_the_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, tokens=0.0, updated=0.0)
    assert bucket.take(0.25) == pytest.approx(0.25)  # half a token so far
    assert bucket.take(0.5) == 0.0
    bucket.take(100.0)  # a long idle spell refills to the burst only
    assert bucket.tokens == pytest.approx(2.0)


def test_a_clock_going_backwards_refills_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, tokens=0.0, updated=10.0)
    assert bucket.take(5.0) == pytest.approx(1.0)


def test_each_client_has_its_own_bucket() -> None:
    limiter = RateLimiter(rate=1.0, burst=2, max_clients=10)
    assert [limiter.check("a", 0.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(1.0)]
    assert limiter.check("b", 0.0) == 0.0
    assert limiter.check("a", 1.0) == 0.0


def test_the_table_is_bounded_and_forgets_the_least_recently_seen_client() -> None:
    limiter = RateLimiter(rate=1.0, burst=1, max_clients=2)
    limiter.check("a", 0.0)
    limiter.check("b", 0.0)
    limiter.check("a", 0.0)  # a is now the most recent
    limiter.check("c", 0.0)  # b goes
    assert len(limiter) == 2
    assert limiter.check("a", 0.0) > 0  # a kept its (empty) bucket
    assert limiter.check("b", 0.0) == 0.0  # b comes back with a full one


@pytest.mark.parametrize("rate,burst,clients", [(0.0, 1, 1), (1.0, 0, 1), (1.0, 1, 0)])
def test_a_limiter_needs_positive_settings(rate: float, burst: int, clients: int) -> None:
    with pytest.raises(ValueError):
        RateLimiter(rate, burst, clients)


def test_the_connection_gate_counts_and_refuses_beyond_its_limit() -> None:
    gate = ConnectionGate(2)
    assert gate.try_enter() and gate.try_enter()
    assert not gate.try_enter() and gate.refused == 1
    gate.leave()
    assert gate.try_enter() and gate.open == 2


def test_a_gate_with_limit_zero_never_refuses() -> None:
    gate = ConnectionGate(0)
    assert all(gate.try_enter() for _ in range(10_000))


def test_a_client_is_its_key_when_it_has_one_and_the_key_is_not_kept_in_clear() -> None:
    ident = client_identity("sk-secret-key", "10.0.0.1")
    assert ident.startswith("key:") and "sk-secret-key" not in ident
    assert ident == client_identity("sk-secret-key", "10.0.0.2")  # same key, another address
    assert client_identity(None, "10.0.0.1") == "peer:10.0.0.1"
