"""The GPU engine shim's step clock: outputs of one step, streamed together, count as one step."""

from __future__ import annotations

import threading

from loadtests.gpu.engine_server import StepTimes


def test_outputs_close_together_are_one_step_and_a_pause_starts_the_next() -> None:
    steps = StepTimes(gap_s=0.02)
    for t in (10.000, 10.001, 10.015, 10.030):  # one drain, paused once by a thread switch
        steps.mark(t)
    for t in (10.120, 10.121):  # the next step, 90 ms later
        steps.mark(t)
    assert steps.drain() == [[10.0, 4], [10.12, 2]]
    assert steps.drain() == []  # read once per phase


def test_marks_from_another_thread_are_all_counted() -> None:
    steps = StepTimes(gap_s=0.02)

    def mark() -> None:
        for k in range(1000):
            steps.mark(k * 0.1)  # each its own step

    threads = [threading.Thread(target=mark) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(n for _, n in steps.drain()) == 2000
