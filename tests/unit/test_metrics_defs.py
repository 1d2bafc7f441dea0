"""Metric definitions: names, units, bounded labels, named bucket sets, and worker label removal."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram

from proxy.telemetry.fastmetrics import FastCounter, FastHistogram
from proxy.telemetry.metrics import BUCKETS, Metrics

AnyMetric = Counter | Histogram | FastCounter | FastHistogram

ALLOWED_LABELS = {"worker", "frontend", "outcome", "cause", "policy", "branch", "stage", "state", "direction", "peer", "index", "secret"}  # peer: from routing.peers (config); index: events | approximate; secret: api_keys | tls
UNIT_SUFFIXES = ("_seconds", "_total", "_ratio", "_requests", "_tokens", "_bytes")


def metric_objects(m: Metrics) -> list[AnyMetric]:
    return [v for v in vars(m).values() if isinstance(v, AnyMetric)]


def exercise(m: Metrics) -> None:
    """Give every metric one labelled child so the registry exposes its samples."""
    for metric in metric_objects(m):
        if isinstance(metric, FastCounter | FastHistogram):
            names = metric.labelnames
        else:
            names = metric._labelnames  # prometheus_client keeps them private
        child = metric.labels(*[f"v-{n}" for n in names])
        if isinstance(metric, Histogram | FastHistogram):
            child.observe(0.001)
        else:
            child.inc()


def test_every_metric_is_prefixed_has_a_unit_and_help() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    exercise(m)
    families = list(reg.collect())
    assert len(families) == len(metric_objects(m))
    for fam in families:
        assert fam.name.startswith("radixgate_"), fam.name
        assert fam.documentation, fam.name
        full = fam.name + ("_total" if fam.type == "counter" else "")
        assert full.endswith(UNIT_SUFFIXES), full


def test_labels_are_from_the_bounded_set() -> None:
    reg = CollectorRegistry()
    exercise(Metrics(reg))
    for fam in reg.collect():
        for sample in fam.samples:
            assert set(sample.labels) - {"le"} <= ALLOWED_LABELS, (fam.name, sample.labels)


def test_histogram_buckets_are_named_sets() -> None:
    reg = CollectorRegistry()
    exercise(Metrics(reg))
    named = {tuple(v) for v in BUCKETS.values()}
    histograms = [f for f in reg.collect() if f.type == "histogram"]
    assert histograms
    for fam in histograms:
        bounds = tuple(float(s.labels["le"]) for s in fam.samples
                       if s.name.endswith("_bucket") and s.labels["le"] != "+Inf")
        assert bounds in named, fam.name


def test_bucket_sets_span_llm_latencies() -> None:
    assert BUCKETS["proxy"][0] <= 0.0001
    assert BUCKETS["ttft"][0] <= 0.005 and BUCKETS["ttft"][-1] >= 300
    assert BUCKETS["e2e"][-1] >= 1800
    for bounds in BUCKETS.values():
        assert list(bounds) == sorted(set(bounds))


def test_forgetting_a_worker_removes_its_label_sets_only() -> None:
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.inc(m.prompt_tokens, "http://a", amount=5, worker="http://a")
    m.inc(m.prompt_tokens, "http://b", amount=7, worker="http://b")
    m.observe(m.ttft, 0.1, "http://a", "http", worker="http://a")
    m.forget_worker("http://a")
    assert reg.get_sample_value("radixgate_prompt_tokens_total", {"worker": "http://a"}) is None
    assert reg.get_sample_value("radixgate_ttft_seconds_count", {"worker": "http://a", "frontend": "http"}) is None
    assert reg.get_sample_value("radixgate_prompt_tokens_total", {"worker": "http://b"}) == 7
    # What still ends on it after it left reports under worker="left", never re-creating its series.
    m.inc(m.prompt_tokens, "http://a", amount=3, worker="http://a")
    assert reg.get_sample_value("radixgate_prompt_tokens_total", {"worker": "http://a"}) is None
    assert reg.get_sample_value("radixgate_prompt_tokens_total", {"worker": "left"}) == 3
    m.know_worker("http://a")
    m.inc(m.prompt_tokens, "http://a", amount=1, worker="http://a")  # a worker that comes back starts fresh
    assert reg.get_sample_value("radixgate_prompt_tokens_total", {"worker": "http://a"}) == 1


def test_fast_histogram_exposes_cumulative_buckets_count_and_sum() -> None:
    reg = CollectorRegistry()
    h = FastHistogram("radixgate_test_seconds", "t", ["worker"], buckets=(0.1, 1.0), registry=reg)
    h.labels("a").observe_many([0.05, 0.1, 0.5, 7.0])
    get = reg.get_sample_value
    assert get("radixgate_test_seconds_bucket", {"worker": "a", "le": "0.1"}) == 2  # le is inclusive
    assert get("radixgate_test_seconds_bucket", {"worker": "a", "le": "1.0"}) == 3
    assert get("radixgate_test_seconds_bucket", {"worker": "a", "le": "+Inf"}) == 4
    assert get("radixgate_test_seconds_count", {"worker": "a"}) == 4
    assert get("radixgate_test_seconds_sum", {"worker": "a"}) == 7.65


def test_fast_counter_exposes_total_and_refuses_to_go_down() -> None:
    reg = CollectorRegistry()
    c = FastCounter("radixgate_test_total", "t", ["cause"], registry=reg)
    c.labels("x").inc(2)
    assert reg.get_sample_value("radixgate_test_total", {"cause": "x"}) == 2
    with pytest.raises(ValueError):
        c.labels("x").inc(-1)
