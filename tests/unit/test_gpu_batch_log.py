"""The GPU engine shim's batch log: the scheduler's batches, each with when its outputs landed."""

from __future__ import annotations

from dataclasses import dataclass

from loadtests.gpu.batch_log import FIELDS, BatchLog, describe, kv_pressure, wrap


@dataclass
class Future:  # the fields of transformers' FutureRequestState that the log reads
    query_length: int
    has_new_token: bool


def test_a_batch_is_its_decodes_its_prefill_chunks_and_the_prompts_they_finish() -> None:
    batch = [Future(1, True), Future(1, True), Future(3000, True), Future(8000, False)]
    assert describe(batch) == (2, 2, 1)  # the 8,000-token chunk leaves its prompt unfinished


def test_each_batch_ends_once_and_the_log_is_read_once() -> None:
    log = BatchLog()
    log.scheduled(1.0, 2, 1, 3002, 6000, 1, 900, 3, 3, 0)
    log.ended(1.25)
    log.ended(1.30)  # a second update for the same batch moves nothing
    log.scheduled(1.26, 3, 0, 3, 9000, 0, 899, 3, 3, 0)  # still running when read
    got = log.drain()
    assert [dict(zip(FIELDS, b, strict=True))["end"] for b in got] == [1.25, None]
    assert got[0][2:5] == [2, 1, 3002]
    assert log.drain() == []


class FakeCache:
    def get_num_free_blocks(self) -> int:
        return 700


class FakeScheduler:  # the parts of transformers' FIFOScheduler the log reads
    def __init__(self, result: object) -> None:
        self.result, self.cache = result, FakeCache()
        self.waiting_requests, self.active_requests, self.starved_requests = {"a": 1, "b": 2}, {"c": 3}, []

    def schedule_batch(self, token_budget: int, cache_budget: int) -> object:
        assert (token_budget, cache_budget) == (8192, 48000)
        return self.result


class FakeProcessor:
    def update_batch(self) -> str:
        return "applied"


def wrapped() -> tuple[type[FakeScheduler], type[FakeProcessor], BatchLog]:
    """Fresh stand-in classes with the log wrapped around them (wrap patches the classes)."""
    class Scheduler(FakeScheduler):
        pass

    class Processor(FakeProcessor):
        pass

    log = BatchLog()
    wrap(Scheduler, Processor, log)
    return Scheduler, Processor, log


def test_wrapped_scheduler_logs_its_batches_and_passes_everything_through() -> None:
    scheduler, processor, log = wrapped()
    batch = [Future(1, True), Future(2900, True)]
    sched = scheduler((batch, False, 2901, 3100))
    assert sched.schedule_batch(cache_budget=48000, token_budget=8192) == (batch, False, 2901, 3100)  # keywords too
    assert processor().update_batch() == "applied"
    (row,) = log.drain()
    entry = dict(zip(FIELDS, row, strict=True))
    assert (entry["decodes"], entry["prefills"], entry["q_tokens"], entry["kv_read"]) == (1, 1, 2901, 3100)
    assert (entry["free_blocks"], entry["waiting"], entry["active"], entry["starved"]) == (700, 2, 1, 0)
    assert entry["end"] is not None and entry["end"] >= entry["t"]


def test_a_batch_the_log_cannot_read_still_reaches_the_engine() -> None:
    scheduler, _, log = wrapped()
    odd = ("not", "the", "shape")  # another release's return value
    assert scheduler(odd).schedule_batch(8192, 48000) == odd
    assert log.drain() == []


def test_kv_pressure_reads_the_fewest_free_blocks_and_the_starved_steps() -> None:
    log = BatchLog()
    for free, starved in ((900, 0), (12, 0), (0, 2), (40, 0)):
        log.scheduled(1.0, 2, 0, 2, 100, 0, free, 0, 2, starved)
    assert kv_pressure(log.drain()) == (4, 0, 1)
    assert kv_pressure([]) == (0, None, 0)
