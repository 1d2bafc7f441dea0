"""The simulated worker's continuous-batching scheduler: admission, chunked prefill, decode, KV."""

from __future__ import annotations

import pytest

from proxy.sim.radix import RadixCache
from proxy.sim.scheduler import (
    QUEUE_FULL_MESSAGE,
    InvalidRequest,
    QueueFull,
    Scheduler,
    SchedulerLimits,
    SimRequest,
)


def make(capacity: int = 10_000, page_size: int = 1, **limits: object) -> Scheduler:
    defaults: dict[str, object] = {"max_running_requests": 8, "chunked_prefill_size": 1000,
                                   "max_prefill_tokens": 4000, "max_queued_requests": None}
    defaults.update(limits)
    return Scheduler(RadixCache(capacity, page_size), SchedulerLimits(**defaults))  # type: ignore[arg-type]


def request(rid: str, prompt: int, out: int = 4, base: int = 0, stop: tuple[str, ...] = ()) -> SimRequest:
    return SimRequest(rid=rid, input_ids=[base + i for i in range(prompt)], max_new_tokens=out, stop=stop)


def run_to_end(s: Scheduler, limit: int = 10_000) -> int:
    steps = 0
    while (step := s.next_step(float(steps))) is not None:
        s.finish_step(step, float(steps))
        steps += 1
        assert steps < limit
    return steps


def test_admission_stops_at_max_running_requests() -> None:
    s = make(max_running_requests=2)
    for i in range(3):
        s.submit(request(f"r{i}", 10, base=100 * i), 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert [r.rid for r, _ in step.prefill] == ["r0", "r1"]
    assert [r.rid for r in s.waiting] == ["r2"]


def test_a_long_prompt_is_chunked_by_chunked_prefill_size() -> None:
    s = make(chunked_prefill_size=100)
    req = request("long", 250)
    s.submit(req, 0.0)
    chunks = []
    while req.state != "running":
        step = s.next_step(0.0)
        assert step is not None
        chunks.append([n for _, n in step.prefill])
        assert not step.decode
        s.finish_step(step, 0.0)
    assert chunks == [[100], [100], [50]]
    assert len(req.output_ids) == 1  # the last chunk yields the first token


def test_the_chunk_budget_is_shared_and_the_overflowing_request_is_the_chunked_one() -> None:
    s = make(chunked_prefill_size=100)
    s.submit(request("a", 60), 0.0)
    s.submit(request("b", 60, base=1000), 0.0)
    s.submit(request("c", 10, base=2000), 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert [(r.rid, n) for r, n in step.prefill] == [("a", 60), ("b", 40)]
    s.finish_step(step, 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert [(r.rid, n) for r, n in step.prefill] == [("b", 20), ("c", 10)]


def test_max_prefill_tokens_bounds_a_step_but_the_first_request_always_fits() -> None:
    s = make(chunked_prefill_size=-1, max_prefill_tokens=50)
    s.submit(request("big", 80), 0.0)
    s.submit(request("small", 10, base=1000), 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert [(r.rid, n) for r, n in step.prefill] == [("big", 80)]


def test_prefill_steps_come_before_decode_unless_mixed_chunk() -> None:
    for mixed in (False, True):
        s = make(enable_mixed_chunk=mixed)
        s.submit(request("a", 10), 0.0)
        step = s.next_step(0.0)
        assert step is not None
        s.finish_step(step, 0.0)
        s.submit(request("b", 10, base=1000), 0.0)
        step = s.next_step(0.0)
        assert step is not None
        assert [r.rid for r, _ in step.prefill] == ["b"]
        assert [r.rid for r in step.decode] == (["a"] if mixed else [])


def test_decode_generates_one_token_per_step_until_max_new_tokens() -> None:
    s = make()
    req = request("a", 10, out=5)
    s.submit(req, 0.0)
    steps = run_to_end(s)
    assert steps == 5  # one prefill step (first token) + four decode steps
    assert req.finish_reason == {"type": "length", "length": 5}
    assert len(req.output_ids) == 5
    assert s.cache.private_tokens == 0
    assert s.cache.protected_tokens == 0


def test_a_finished_request_leaves_prompt_and_output_cached_for_the_next() -> None:
    s = make()
    first = request("a", 100, out=8)
    s.submit(first, 0.0)
    run_to_end(s)
    assert s.cache.tree_tokens == 108
    again = SimRequest(rid="b", input_ids=first.input_ids + first.output_ids + [7, 7], max_new_tokens=1)
    s.submit(again, 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert again.cached_tokens == 108
    assert step.prefill == [(again, 2)]
    assert step.work.prefill[0].context_before == 108


def test_the_prefix_match_leaves_at_least_one_token_to_compute() -> None:
    s = make()
    s.submit(request("a", 20), 0.0)
    run_to_end(s)
    twin = request("b", 20)
    s.submit(twin, 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert twin.cached_tokens == 19
    assert step.prefill == [(twin, 1)]


def test_kv_headroom_reserves_every_admitted_request_output() -> None:
    s = make(capacity=100)
    s.submit(request("a", 30, out=30), 0.0)
    s.submit(request("b", 30, out=30, base=1000), 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert [r.rid for r, _ in step.prefill] == ["a"]  # b needs 60 > 100 - 60 reserved by a
    s.finish_step(step, 0.0)
    run_to_end(s)
    assert not s.has_work()  # b ran once a had finished
    assert s.cache.tree_tokens + s.cache.private_tokens <= 100


def test_a_full_pool_evicts_cached_prefixes_to_admit_new_work() -> None:
    s = make(capacity=100)
    s.submit(request("a", 60, out=10), 0.0)
    run_to_end(s)
    assert s.cache.tree_tokens == 70
    s.submit(request("b", 60, out=10, base=1000), 0.0)
    run_to_end(s)
    assert s.cache.tree_tokens <= 100
    assert s.cache.match_prefix(list(range(1000, 1060))).length == 60


def test_queue_full_past_max_queued_requests() -> None:
    s = make(max_queued_requests=2)
    s.submit(request("a", 5), 0.0)
    s.submit(request("b", 5), 0.0)
    with pytest.raises(QueueFull, match=QUEUE_FULL_MESSAGE):
        s.submit(request("c", 5), 0.0)


def test_requests_that_can_never_fit_are_rejected() -> None:
    s = make(capacity=50, context_length=40)
    with pytest.raises(InvalidRequest):
        s.submit(request("too-long", 45), 0.0)
    with pytest.raises(InvalidRequest):
        s.submit(request("too-big", 30, out=30), 0.0)


def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_keeps_arrival_order() -> None:
    for policy, expected in (("lpm", "hit"), ("fcfs", "miss")):
        s = make(max_running_requests=1, schedule_policy=policy)
        s.submit(request("seed", 50, out=1), 0.0)
        run_to_end(s)
        s.submit(request("miss", 50, base=5000), 0.0)
        s.submit(request("hit", 50), 0.0)
        step = s.next_step(0.0)
        assert step is not None
        assert step.prefill[0][0].rid == expected


def test_lpm_falls_back_to_fcfs_above_128_waiting() -> None:
    s = make(max_running_requests=1, schedule_policy="lpm")
    s.submit(request("seed", 50, out=1), 0.0)
    run_to_end(s)
    for i in range(129):
        s.submit(request(f"miss{i}", 50, base=10_000 + 100 * i), 0.0)
    s.submit(request("hit", 50), 0.0)
    step = s.next_step(0.0)
    assert step is not None
    assert step.prefill[0][0].rid == "miss0"


def test_a_stop_string_ends_the_request_and_trims_the_text() -> None:
    s = make()
    probe = request("probe", 10, out=6)
    s.submit(probe, 0.0)
    run_to_end(s)
    third_word = probe.output_text.split(" ")[2]
    req = request("stop", 10, out=6, stop=(third_word,))
    s.submit(req, 0.0)
    run_to_end(s)
    assert req.finish_reason == {"type": "stop", "matched": third_word}
    assert third_word not in req.output_text
    assert len(req.output_ids) <= 3


def test_abort_frees_the_slot_and_kv_of_running_and_waiting_requests() -> None:
    s = make(max_running_requests=1)
    a, b = request("a", 10, out=50), request("b", 10, out=50, base=1000)
    s.submit(a, 0.0)
    s.submit(b, 0.0)
    step = s.next_step(0.0)
    assert step is not None
    s.finish_step(step, 0.0)
    assert s.abort(a, 1.0) and s.abort(b, 1.0)
    assert not s.has_work()
    assert s.cache.private_tokens == 0 and s.cache.protected_tokens == 0
    assert a.finish_reason is not None and a.finish_reason["type"] == "abort"
    assert not s.abort(a, 2.0)


def test_flush_cache_refuses_while_requests_are_pending() -> None:
    s = make()
    s.submit(request("a", 10), 0.0)
    assert not s.flush_cache()
    run_to_end(s)
    assert s.cache.tree_tokens > 0
    assert s.flush_cache()
    assert s.cache.tree_tokens == 0


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pool_accounting_balances_after_mixed_traffic(page_size: int) -> None:
    s = make(capacity=600, page_size=page_size, max_running_requests=4, chunked_prefill_size=64)
    for i in range(12):
        s.submit(request(f"r{i}", 37 + 11 * i, out=9, base=(i % 3) * 1000), 0.0)
    run_to_end(s)
    assert s.cache.private_tokens == 0
    assert s.cache.protected_tokens == 0
    assert s.cache.tree_tokens <= 600
    assert s.cache.tree_tokens % page_size == 0


# -- hf_fifo: transformers' continuous batching FIFO scheduler ---------------------------------------
def hf(capacity: int = 10_000, **limits: object) -> Scheduler:
    return make(capacity, kind="hf_fifo", **limits)


def step_of(s: Scheduler, now: float = 0.0) -> tuple[list[tuple[str, int]], list[str]]:
    step = s.next_step(now)
    assert step is not None
    s.finish_step(step, now)
    return [(r.rid, n) for r, n in step.prefill], [r.rid for r in step.decode]


def test_hf_one_budget_takes_decodes_first_and_several_new_prompts_a_step() -> None:
    s = hf(chunked_prefill_size=250)
    s.submit(request("d", 10, out=10), 0.0)
    step_of(s)  # d prefilled: decoding from now on
    for i in range(3):
        s.submit(request(f"n{i}", 100, base=1000 * (i + 1)), 1.0)
    prefill, decode = step_of(s, 1.0)
    # The decode takes 1 token of the 250, then n0 (100), n1 (100), and n2 the 49 left: split anywhere.
    assert decode == ["d"] and prefill == [("n0", 100), ("n1", 100), ("n2", 49)]


def test_hf_kv_read_budget_skips_a_cache_hit_while_the_batch_holds_the_pool_and_lets_a_cold_prompt_pass() -> None:
    s = hf(kv_read_budget=1000)
    shared = request("first", 600, out=50)
    s.submit(shared, 0.0)
    step_of(s)  # "first" decodes from here with 600 tokens of context
    s.submit(request("hit", 700, out=4), 1.0)  # its first 600 tokens: the cached prompt of "first"
    s.submit(request("cold", 50, out=4, base=50_000), 1.0)
    prefill, decode = step_of(s, 1.0)
    # first reads 600 of the 1,000; the hit would read its 600 cached: skipped, not blocking "cold" (reads 0).
    assert decode == ["first"] and [rid for rid, _ in prefill] == ["cold"]
    hit = next(r for r in s.prefilling if r.rid == "hit")
    assert hit.cached_tokens == 600 and hit.first_token_at is None  # admitted, waiting for read budget
    # Without the budget's limit the hit runs in the same step.
    t = hf(kv_read_budget=None)
    t.submit(request("first", 600, out=50), 0.0)
    step_of(t)
    t.submit(request("hit", 700, out=4), 1.0)
    assert [rid for rid, _ in step_of(t, 1.0)[0]] == ["hit"]


def test_hf_at_most_max_running_requests_a_step_the_rest_wait() -> None:
    s = hf(max_running_requests=2)
    for i in range(3):
        s.submit(request(f"r{i}", 10, out=3, base=100 * i), 0.0)
    prefill, _ = step_of(s)
    assert [rid for rid, _ in prefill] == ["r0", "r1"]
    assert [r.rid for r in s.waiting] == ["r2"]


def test_hf_below_the_safety_margin_only_decodes_run_or_one_prefill_when_nothing_decodes() -> None:
    # transformers' FIFO scheduler: under the margin it stops at the first request that is not
    # decoding once anything is scheduled, and decodes come first: no prefill beside a decode.
    s = hf(capacity=1000, safety_margin=0.5)
    s.submit(request("big", 600, out=4), 0.0)
    step_of(s)  # 601 of 1,000 tokens in use: under half free
    for i in range(2):
        s.submit(request(f"n{i}", 20, out=2, base=10_000 * (i + 1)), 1.0)
    prefill, decode = step_of(s, 1.0)
    assert decode == ["big"] and prefill == []
    # nothing decoding: the first prefill runs, alone (here the rest of a chunked prompt)
    s = hf(capacity=1000, safety_margin=0.5, chunked_prefill_size=300)
    s.submit(request("big", 600, out=4), 0.0)
    assert [rid for rid, _ in step_of(s)[0]] == ["big"]  # its first chunk; its KV is held
    s.submit(request("n0", 20, out=2, base=10_000), 1.0)
    prefill, decode = step_of(s, 1.0)
    assert decode == [] and prefill == [("big", 300)]


def test_hf_the_safety_margin_counts_the_steps_own_admissions() -> None:
    # The engine looks at its free blocks before each request it schedules, so prompts that arrive
    # together stop entering once the earlier ones have taken the pool under the margin.
    s = hf(capacity=1000, safety_margin=0.5)
    for i in range(3):
        s.submit(request(f"n{i}", 300, out=2, base=10_000 * (i + 1)), 0.0)
    prefill, _ = step_of(s)
    # n0 sees 1,000 free, n1 700 (>= 500): both enter; n2 sees 400 and waits.
    assert [rid for rid, _ in prefill] == ["n0", "n1"]
    assert [r.rid for r in s.waiting] == ["n2"]


def stored(events: list) -> list[int]:
    return [h for e in events if e[0] == "BlockStored" for h in e[1]]


@pytest.mark.parametrize("at_schedule", [False, True])
def test_kv_events_name_a_prompt_after_its_prefill_as_sglang_or_when_scheduled_as_vllm(at_schedule: bool) -> None:
    # SGLang stores a prompt's blocks in its radix cache once the prefill ran; vLLM v1's scheduler
    # caches them when it allocates them (allocate_slots), before the forward: the same hashes,
    # a prefill's duration earlier, which is when another proxy replica can first see the prefix.
    s = make(page_size=16, chunked_prefill_size=32)
    s.cache.events = []
    s.store_at_schedule = at_schedule
    a = request("a", 100, out=2)
    s.submit(a, 0.0)
    step = s.next_step(0.0)  # admits a, computes its first 32-token chunk
    assert step is not None
    early = stored(s.cache.events)
    assert len(early) == (6 if at_schedule else 0)  # 96 tokens of whole 16-token pages
    run_to_end(s)
    assert set(stored(s.cache.events)) >= set(early) and len(set(stored(s.cache.events))) >= 6
    if at_schedule:  # the prefill's end stores the same blocks again, not other ones
        assert set(stored(s.cache.events)[:6]) == set(early)


def test_blocks_announced_at_schedule_are_withdrawn_if_the_prefill_never_ends() -> None:
    s = make(page_size=16, chunked_prefill_size=32)
    s.cache.events = []
    s.store_at_schedule = True
    shared = list(range(64))
    a = SimRequest(rid="a", input_ids=shared + list(range(1000, 1036)), max_new_tokens=2)
    s.submit(a, 0.0)
    step = s.next_step(0.0)
    assert step is not None
    s.finish_step(step, 0.0)
    announced = stored(s.cache.events)
    assert len(announced) == 6
    assert s.abort(a, 1.0)
    removed = [h for e in s.cache.events if e[0] == "BlockRemoved" for h in e[1]]
    assert removed == announced  # none reached the tree: every announced block is taken back
    assert s.cache.match_prefix(a.input_ids).length == 0


def test_blocks_announced_past_a_cached_prefix_are_the_only_ones_withdrawn() -> None:
    s = make(page_size=16, chunked_prefill_size=32)
    s.cache.events = []
    s.store_at_schedule = True
    shared = list(range(64))
    first = SimRequest(rid="b", input_ids=[*shared, 5000], max_new_tokens=1)
    s.submit(first, 0.0)
    run_to_end(s)
    before = len(s.cache.events)
    a = SimRequest(rid="a", input_ids=shared + list(range(1000, 1036)), max_new_tokens=2)
    s.submit(a, 10.0)
    assert s.next_step(10.0) is not None
    announced = stored(s.cache.events[before:])
    assert len(announced) == 2  # pages 4 and 5: the shared four are the tree's already
    assert s.abort(a, 11.0)
    assert [h for e in s.cache.events[before:] if e[0] == "BlockRemoved" for h in e[1]] == announced
    assert s.cache.match_prefix(shared).length == 64  # the cached prefix stays, unannounced


def test_the_event_timing_is_a_validated_config_field_with_a_flag_that_reaches_the_scheduler() -> None:
    from proxy.sim.__main__ import parse_args
    from proxy.sim.config import SimConfig
    from proxy.sim.engine import Engine
    from proxy.sim.fleet import cli_args

    with pytest.raises(ValueError, match="kv_events_at"):
        SimConfig(kv_events_at="forward").validate()
    config = SimConfig(port=0, kv_events_at="schedule")
    assert "--kv-events-at" in cli_args(config) and parse_args(cli_args(config)) == config
    assert Engine(config).scheduler.store_at_schedule
    assert not Engine(SimConfig()).scheduler.store_at_schedule
