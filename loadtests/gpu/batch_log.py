"""The engine's own batches, as its scheduler formed them: what each step ran and what it cost.

``StepTimes`` (engine_server.py) sees steps only through the outputs they stream; this log reads
the scheduler itself, so the simulator's step forming (``proxy/sim/scheduler.py``, ``hf_fifo``)
can be compared with the engine's batch by batch: how many requests decoded, how many prompts
(and tokens) were prefilled beside them, the KV the step read, the free blocks and the queue left
after it, and how long it took (scheduled to outputs applied; the loop is synchronous without
CUDA graphs, so one step's end is the next one's start less the loop's own time).

``python -m loadtests.gpu.batch_log RESULTS...``: how near the committed runs' engines came to
running out of KV blocks (``kv_pressure``).

``install(log)`` wraps transformers' ``FIFOScheduler.schedule_batch`` and
``ContinuousBatchProcessor.update_batch`` (5.17: ``generation/continuous_batching``); a release
without them leaves the engine as it is and says so in the engine's log.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("engine_server")

FIELDS = ["t", "end", "decodes", "prefills", "q_tokens", "kv_read", "first_tokens", "free_blocks", "waiting",
          "active", "starved"]


class BatchLog:
    """One entry per scheduled batch: ``FIELDS``. Marked by the engine's generation thread, drained
    by the server's loop once per phase; thread-safe."""

    def __init__(self, maxlen: int = 200_000) -> None:
        self._batches: deque[list[Any]] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def scheduled(self, now: float, decodes: int, prefills: int, q_tokens: int, kv_read: int, first_tokens: int,
                  free_blocks: int, waiting: int, active: int, starved: int) -> None:
        with self._lock:
            self._batches.append([round(now, 4), None, decodes, prefills, q_tokens, kv_read, first_tokens,
                                  free_blocks, waiting, active, starved])

    def ended(self, now: float) -> None:
        """The latest batch's outputs are applied (a second call for it changes nothing)."""
        with self._lock:
            if self._batches and self._batches[-1][1] is None:
                self._batches[-1][1] = round(now, 4)

    def drain(self) -> list[list[Any]]:
        with self._lock:
            out = list(self._batches)
            self._batches.clear()
        return out


def describe(batch: list[Any]) -> tuple[int, int, int]:
    """(decodes, prompts being prefilled, of which finish their prompt this step) of a scheduled
    batch of ``FutureRequestState``: a one-token query is a decode (or a prompt's last token,
    which costs the same), anything longer a prefill chunk."""
    decodes = sum(1 for f in batch if f.query_length == 1)
    prefills = len(batch) - decodes
    first = sum(1 for f in batch if f.query_length > 1 and f.has_new_token)
    return decodes, prefills, first


def install(batches: BatchLog) -> bool:
    try:
        from transformers.generation.continuous_batching import continuous_api, scheduler
        fifo, processor = scheduler.FIFOScheduler, continuous_api.ContinuousBatchProcessor
        if not (hasattr(fifo, "schedule_batch") and hasattr(processor, "update_batch")):
            raise AttributeError("FIFOScheduler.schedule_batch / ContinuousBatchProcessor.update_batch")
    except (ImportError, AttributeError) as e:
        log.warning("batch log off: this transformers has no %s", e)
        return False
    wrap(fifo, processor, batches)
    return True


def wrap(fifo: Any, processor: Any, batches: BatchLog) -> None:
    """Log every batch ``fifo.schedule_batch`` returns and when ``processor.update_batch`` applied
    its outputs. Arguments pass through as given, and nothing the log does reaches the
    generation loop: a failure there would stop the engine."""
    schedule, update = fifo.schedule_batch, processor.update_batch
    failed: list[bool] = []

    def logged_schedule(sched: Any, *args: Any, **kwargs: Any) -> Any:
        result = schedule(sched, *args, **kwargs)
        try:
            batch, _fast, q_tokens, kv_read = result
            if batch:
                decodes, prefills, first = describe(batch)
                batches.scheduled(time.perf_counter(), decodes, prefills, int(q_tokens), int(kv_read), first,
                                  int(sched.cache.get_num_free_blocks()), len(sched.waiting_requests),
                                  len(sched.active_requests), len(sched.starved_requests))
        except Exception:  # never into the generation loop
            if not failed:
                failed.append(True)
                log.exception("batch log: a batch could not be read; logging goes on for the next")
        return result

    def logged_update(proc: Any, *args: Any, **kwargs: Any) -> Any:
        out = update(proc, *args, **kwargs)
        batches.ended(time.perf_counter())
        return out

    fifo.schedule_batch = logged_schedule
    processor.update_batch = logged_update


def kv_pressure(batches: Iterable[Sequence[Any]]) -> tuple[int, int | None, int]:
    """(steps, the fewest free KV blocks after any, steps with a starved request) of logged
    batches. The simulator leaves out the engine's preemption, which only a failed block
    allocation starts: a log whose free blocks never reach 0 never preempted."""
    steps, fewest, starved = 0, None, 0
    free, hungry = FIELDS.index("free_blocks"), FIELDS.index("starved")
    for b in batches:
        steps += 1
        fewest = b[free] if fewest is None else min(fewest, b[free])
        starved += b[hungry] > 0
    return steps, fewest, starved


def main(argv: Sequence[str]) -> None:
    from loadtests.jsonl import exists, read_text

    total = [0, 0]
    for run in map(Path, argv):
        if not exists(run / "engines.jsonl"):
            continue
        got = kv_pressure(b for line in read_text(run / "engines.jsonl").splitlines()
                          for e in json.loads(line)["engines"] for b in e.get("batches") or [])
        if got[0]:
            print(f"{run.name}: {got[0]} steps, fewest free blocks {got[1]}, {got[2]} with a starved request")
            total = [total[0] + got[0], total[1] + got[2]]
    print(f"all: {total[0]} steps, {total[1]} with a starved request")


if __name__ == "__main__":
    main(sys.argv[1:])
