"""Whether a worker's KV event stream shows what its engine stores.

A stream can be live and still wrong: a publisher that stopped looking at the cache, an engine
that hashes or tokenizes prompts differently from the proxy, blocks published on a tier routing
ignores. Its silence then reads as "not cached" on that worker, and after the engine's first
``AllBlocksCleared`` as "evicted" for every prompt the proxy placed there: affinity collapses (on
the GPU fleet, a shim whose publisher failed: prefix reuse 68% → 26%, TTFT p95 1.3 s → 8.3 s).

So every prompt the proxy saw prefilled on the worker (a streamed answer's first token) is a
probe: ``grace_s`` later, its leading block must be held in the worker's table or reported
removed since. Below ``min_ratio`` of the last ``window`` probes (at least ``min_probes``), the
stream is not trusted and routing reads the approximate index, until probes confirm again. A
stream is trusted until probes say otherwise: an engine that publishes is taken at its word.
Pure: the caller passes the time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


class Table(Protocol):
    @property
    def clears(self) -> int: ...

    def seen(self, token_ids: Sequence[int]) -> bool | None: ...


class AnyOf:
    """The tables of one worker's data-parallel ranks as a probe of a prompt whose rank routing
    did not name reads them: the engine stored it on the rank its controller chose, so it shows
    if any rank's table shows it; a clear on any rank makes the probes made before it moot. A
    prompt sent to a named rank (``routing.dp_ranks``) is probed on that rank's table alone: any
    rank's would let one rank's stream vouch for another's."""

    def __init__(self, tables: Sequence[Table]) -> None:
        self.tables = tables

    @property
    def clears(self) -> int:
        return sum(t.clears for t in self.tables)

    def seen(self, token_ids: Sequence[int]) -> bool | None:
        answers = [t.seen(token_ids) for t in self.tables]
        if any(answers):
            return True
        return None if all(a is None for a in answers) else False


@dataclass(frozen=True, slots=True)
class Probe:
    due: float
    token_ids: Sequence[int]
    table: Table  # where it must show: the rank's it was sent to, or any of the worker's ranks
    clears: int  # the table's clears when it was made: a clear since makes it moot


class StreamTrust:
    def __init__(self, grace_s: float = 2.0, window: int = 32, min_probes: int = 8, min_ratio: float = 0.5,
                 max_pending: int = 1024) -> None:
        self.grace_s, self.min_probes, self.min_ratio = grace_s, min_probes, min_ratio
        self._pending: deque[Probe] = deque(maxlen=max_pending)
        self._results: deque[bool] = deque(maxlen=window)
        self.probes = 0  # resolved, over the stream's life
        self.confirmed = 0

    def expect(self, token_ids: Sequence[int], now: float, table: Table) -> None:
        """The engine prefilled ``token_ids``: its table should show them within ``grace_s``."""
        self._pending.append(Probe(now + self.grace_s, token_ids, table, table.clears))

    def check(self, now: float) -> None:
        """Resolve the probes whose time has come (they were made in time order)."""
        while self._pending and self._pending[0].due <= now:
            probe = self._pending.popleft()
            if probe.clears != probe.table.clears:
                continue  # the engine flushed since: its silence about this prompt proves nothing
            seen = probe.table.seen(probe.token_ids)
            if seen is None:
                continue  # shorter than one block: nothing to see
            self._results.append(seen)
            self.probes += 1
            self.confirmed += seen

    @property
    def trusted(self) -> bool:
        n = len(self._results)
        return n < self.min_probes or sum(self._results) >= self.min_ratio * n

    def status(self) -> dict[str, Any]:
        return {"trusted": self.trusted, "recent": len(self._results), "recent_confirmed": sum(self._results),
                "probes": self.probes, "confirmed": self.confirmed}
