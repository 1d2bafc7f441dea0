"""The GPU engine shim's batch log: the scheduler's batches, each with when its outputs landed."""

from __future__ import annotations

from dataclasses import dataclass

from loadtests.gpu.batch_log import FIELDS, BatchLog, describe


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
