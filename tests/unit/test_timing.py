from proxy.clock import ManualClock
from proxy.timing import RequestTiming


def test_stages_are_none_until_both_marks_exist() -> None:
    t = RequestTiming(received=10.0)
    assert t.ttft is None and t.e2e is None and t.admission_wait is None


def test_token_marks_give_ttft_gaps_and_decode() -> None:
    clock = ManualClock(100.0)
    t = RequestTiming(received=clock.now())
    clock.advance(0.5)
    t.admitted = clock.now()
    t.dispatched = clock.now()
    clock.advance(0.2)
    t.mark_token(clock.now())
    for gap in (0.01, 0.03, 0.02):
        clock.advance(gap)
        t.mark_token(clock.now())
    t.done = clock.now()
    assert t.admission_wait == 0.5
    assert abs((t.ttft or 0) - 0.7) < 1e-9
    assert [round(g, 6) for g in t.token_gaps] == [0.01, 0.03, 0.02]
    assert abs((t.itl_max or 0) - 0.03) < 1e-9
    assert abs((t.decode or 0) - 0.06) < 1e-9
    assert t.proxy_overhead == 0.0


def test_uncached_tokens_subtracts_the_cache_hit() -> None:
    t = RequestTiming(received=0.0, prompt_tokens=100, cached_tokens=64)
    assert t.uncached_prompt_tokens == 36


def test_a_prefix_hold_is_its_own_stage_not_proxy_overhead() -> None:
    t = RequestTiming(received=0.0, admitted=0.1, dispatched=0.45, prefix_hold=0.3)
    assert abs((t.proxy_overhead or 0) - 0.05) < 1e-9
    assert t.stages()["prefix_hold"] == 0.3
    assert RequestTiming(received=0.0).stages()["prefix_hold"] is None
