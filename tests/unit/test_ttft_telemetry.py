"""Routing decision telemetry: predicted vs reported cached tokens, match lengths, available hits."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from proxy.diagnose.reuse import AvailableReuse
from proxy.pipeline import CompletedRequest
from proxy.routing.base import Decision, RouteRequest
from proxy.routing.prefix_key import prefix_tokens
from proxy.telemetry.metrics import Metrics
from proxy.timing import RequestTiming


def done(route: RouteRequest, matched: int, *, prompt: int, cached: int, outcome: str = "ok",
         matched_tokens: int | None = None) -> CompletedRequest:
    timing = RequestTiming(received=0.0, prompt_tokens=prompt, cached_tokens=cached)
    return CompletedRequest(
        rid="r", frontend="http", dialect="sglang", stream=False, worker="http://w0", status=200, outcome=outcome,
        cause=None, retries=0, policy="ttft", decision=Decision("http://w0", "affinity", matched_blocks=matched, matched_tokens=matched_tokens),
        route=route, admission="admitted", admission_wait=0.0, timing=timing, finish_reason="length")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_predicted_and_reported_cached_tokens_are_counted_in_the_workers_units() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    route = RouteRequest(model="m", block_hashes=tuple(range(10)), block_tokens=16, prompt_tokens=160)
    # Predicted 8 blocks = 128 of our 160 estimated tokens; the worker counts 320 tokens (x2).
    metrics.record(done(route, 8, prompt=320, cached=200))
    assert value(registry, "radixgate_routing_predicted_cached_tokens_total", policy="ttft", index="approximate") == 256
    assert value(registry, "radixgate_routing_reported_cached_tokens_total", policy="ttft", index="approximate") == 200
    assert value(registry, "radixgate_routing_cache_prediction_error_tokens_total", policy="ttft", index="approximate", direction="over") == 56
    assert value(registry, "radixgate_routing_prompt_tokens_total", policy="ttft", index="approximate") == 320


def test_predictions_from_kv_events_are_counted_apart_from_the_approximate_index() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    route = RouteRequest(model="m", block_hashes=tuple(range(10)), block_tokens=16, prompt_tokens=160)
    metrics.record(done(route, 8, prompt=160, cached=144, matched_tokens=144))  # an exact match, from events
    metrics.record(done(route, 8, prompt=160, cached=100))  # our own index's guess
    names = ("radixgate_routing_predicted_cached_tokens_total", "radixgate_routing_reported_cached_tokens_total")
    assert [value(registry, n, policy="ttft", index="events") for n in names] == [144, 144]
    assert [value(registry, n, policy="ttft", index="approximate") for n in names] == [128, 100]
    assert value(registry, "radixgate_routing_cache_prediction_error_tokens_total", policy="ttft", index="events",
                 direction="under") == 0
    assert value(registry, "radixgate_routing_cache_prediction_error_tokens_total", policy="ttft",
                 index="approximate", direction="over") == 28


def test_match_lengths_are_observed_in_tokens() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    route = RouteRequest(model="m", block_hashes=tuple(range(40)), block_tokens=16, prompt_tokens=10_000)
    metrics.record(done(route, 40, prompt=10_000, cached=0))
    assert value(registry, "radixgate_routing_match_tokens_sum", policy="ttft") == prefix_tokens(40, 16)
    assert value(registry, "radixgate_routing_match_tokens_count", policy="ttft") == 1


def test_available_hits_count_what_one_fleet_wide_cache_would_have_held() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    reuse = AvailableReuse(lambda: 10**6, metrics.count_available)  # as App wires it: a pipeline observer
    first = RouteRequest(model="m", block_hashes=(1, 2, 3, 4), block_tokens=16, prompt_tokens=64)
    again = RouteRequest(model="m", block_hashes=(1, 2, 3, 4, 5), block_tokens=16, prompt_tokens=80)
    for finished in (done(first, 0, prompt=64, cached=0), done(again, 0, prompt=80, cached=0)):
        metrics.record(finished)  # the second routed badly: the worker had none of it
        reuse.observe(finished)
    assert value(registry, "radixgate_routing_available_cached_tokens_total", policy="ttft") == 64
    assert value(registry, "radixgate_routing_reported_cached_tokens_total", policy="ttft", index="approximate") == 0


def test_failed_requests_count_their_match_but_not_the_hit_rates() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    route = RouteRequest(model="m", block_hashes=(1, 2), block_tokens=16, prompt_tokens=32)
    metrics.record(done(route, 2, prompt=32, cached=32, outcome="error"))
    assert value(registry, "radixgate_routing_match_tokens_count", policy="ttft") == 1
    assert value(registry, "radixgate_routing_prompt_tokens_total", policy="ttft", index="approximate") == 0
