"""Engine-state parsers against captured exposition text and JSON (tests/fixtures)."""

import json
from pathlib import Path

import pytest

from proxy.workers.scrape import (
    ENGINE_METRICS,
    EngineState,
    generation_change,
    parse_get_load,
    parse_loads,
    parse_models,
    parse_prometheus,
    parse_server_info,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_prometheus_text_from_a_busy_worker_gives_its_load_and_shape() -> None:
    s = parse_prometheus(fixture_text("simworker_metrics_busy.prom"))
    assert (s.running, s.queued) == (4, 6)
    assert s.used_tokens == 1044
    assert s.max_total_tokens == 384063
    assert s.page_size == 16
    assert s.evictable_tokens == 0
    assert s.token_usage == pytest.approx(0.002718304028245366)
    assert s.cache_hit_rate == 0.0


def test_prometheus_ranks_are_summed_ratios_averaged_and_page_size_read_from_cache_config_info() -> None:
    s = parse_prometheus(fixture_text("sglang_dp2_metrics.prom"))
    assert (s.running, s.queued) == (32, 3)
    assert s.token_usage == pytest.approx(0.6)
    assert s.cache_hit_rate == pytest.approx(0.5)
    assert s.page_size == 64
    assert s.prompt_tokens_total == 1.5e6
    assert s.max_total_tokens is None  # not in that exposition: unknown, never zero


def test_every_engine_metric_maps_to_an_engine_state_field() -> None:
    fields = set(EngineState.__dataclass_fields__)
    assert {field for field, _ in ENGINE_METRICS.values()} <= fields
    assert all(name.startswith("sglang:") for name in ENGINE_METRICS)


def test_v1_loads_json_gives_running_waiting_and_uncached_tokens() -> None:
    s = parse_loads(json.loads(fixture_text("simworker_v1_loads_busy.json")))
    assert (s.running, s.queued, s.waiting_uncached_tokens) == (4, 2, 4)
    assert s.max_running_requests == 4
    assert s.max_total_tokens == 384063
    assert s.cache_hit_rate == pytest.approx(0.9917)


def test_v1_loads_sums_dp_ranks() -> None:
    doc = {"loads": [{"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "token_usage": 0.2},
                     {"dp_rank": 1, "num_running_reqs": 5, "num_waiting_reqs": 0, "token_usage": 0.4}]}
    s = parse_loads(doc)
    assert (s.running, s.queued) == (8, 1)
    assert s.token_usage == pytest.approx(0.3)


def test_v1_loads_without_ranks_is_an_error_not_an_idle_worker() -> None:
    with pytest.raises(ValueError):
        parse_loads({"loads": []})


def test_get_load_array_of_older_releases() -> None:
    s = parse_get_load(json.loads(fixture_text("simworker_get_load_busy.json")))
    assert s.running is not None and s.queued is not None and s.used_tokens is not None


def test_server_info_gives_limits_page_size_startup_and_model() -> None:
    s = parse_server_info(json.loads(fixture_text("simworker_server_info.json")))
    assert s.max_running_requests == 4
    assert s.page_size == 16
    assert s.max_total_tokens == 384063
    assert s.startup_time == pytest.approx(1795954538.8429017)
    assert s.model == "meta-llama/Llama-3.1-8B-Instruct"


def test_scraped_load_overrides_static_info_only_where_it_reports() -> None:
    info = EngineState(max_running_requests=64, page_size=16, startup_time=1.0)
    merged = info.merged(EngineState(running=3, queued=1))
    assert (merged.running, merged.queued, merged.max_running_requests, merged.page_size) == (3, 1, 64, 16)


def test_models_from_openai_list() -> None:
    assert parse_models({"object": "list", "data": [{"id": "a"}, {"id": "b"}]}) == ("a", "b")
    assert parse_models({"nope": 1}) == ()


@pytest.mark.parametrize(
    ("prev", "cur", "expected"),
    [
        (None, EngineState(startup_time=1.0), None),
        (EngineState(startup_time=1.0), EngineState(startup_time=1.0), None),
        (EngineState(startup_time=1.0), EngineState(startup_time=2.0), "restart"),
        (EngineState(prompt_tokens_total=100.0), EngineState(prompt_tokens_total=5.0), "restart"),
        (EngineState(evictable_tokens=500), EngineState(evictable_tokens=0, running=0, queued=0), "flush"),
        (EngineState(evictable_tokens=500), EngineState(evictable_tokens=0, running=2, queued=0), None),
    ],
)
def test_generation_change_detects_restarts_and_flushes(prev: EngineState | None, cur: EngineState,
                                                        expected: str | None) -> None:
    assert generation_change(prev, cur) == expected


def test_server_info_carries_the_workers_kv_events_config() -> None:
    from proxy.workers.scrape import parse_server_info

    raw = '{"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'
    assert parse_server_info({"kv_events_config": raw}).kv_events_config == raw
    assert parse_server_info({"kv_events_config": None}).kv_events_config is None
    assert parse_server_info({"kv_events_config": 5}).kv_events_config is None
