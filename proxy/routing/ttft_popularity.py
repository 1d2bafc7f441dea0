"""How much traffic the prompt groups placed on each worker bring (the ``ttft`` policy's
``popularity`` placement), pure bookkeeping.

Where a phase's tail comes from on the GPU fleet (runs 29-32): the engine that drew the popular
groups. A new group is placed by what is outstanding at its first request, which says nothing of
how many requests that group, or the ones already placed there, will bring. A proxy that runs for
hours sees the same system prompts come back (after a flush, a restart of an engine, an eviction),
and so knows their popularity: each prompt key (the hash of the prompt's first ``key_blocks``
blocks, as the rendezvous order uses: 256 tokens at page 16, so a system prompt names its group
and a prompt shorter than that is a group of its own) has a decayed count of its requests, and
each worker the sum of the counts of the keys placed on it since its cache last started empty (a
new generation). A new key then goes where that sum is least: the groups' traffic, not their
number or what is outstanding this instant, is spread. A key never seen counts its own requests
from its first one on, so within one phase the sum is the traffic each worker's groups brought
so far.

In the simulator (``fleet_sim --rounds 3 --prompts ids``, seeds 1-8, the GPU fleet's engines) it
placed better at the knee (4.5/s: TTFT p95 geometric mean 0.89x / 0.81x / 0.98x the default's
over the three rounds, better in 4-6 seeds of 8, worse in none) and no worse past it (6/s: 1.02x /
0.97x / 0.95x, 3 worse in each round); seeds 9-16 and text prompts alike (about 0.9x at the knee,
even past it, ``proxy/sim/FIDELITY-RECORD.md``); on the GPU runs' own seed-9 traces, where the simulator
matched the GPU within ±30%, better in 11 of 12 rounds (text at 4.5/s: 2,993 / 1,174 / 3,212 ms
-> 1,193 / 1,389 / 1,782). On the GPU fleet (2026-12-02, runs 33-35, seed 9, three rounds per
router placed anew, ``loadtests/results/gpu-fleet-popularity-{1,2,3}``), pooled TTFT p95 against
the rule without it and smg 1.13.0: text at 4.5/s 1,648 against 2,215 and 2,302 ms (every round
under every smg round), token ids at 6/s 3,616 against 3,522 and 3,064, text with full reports at
6/s 3,087 against 3,524 and 3,320: better at the knee, even past it, as the simulator said. On
by default since. Tried off again on new token-id traces where the simulator had turned to
favour off (run 72, ``gpu-fleet-popularity-5``): off / on 0.86x, 1.07x, 1.08x, so it stays on.

Cost: O(1) per request (counts kept in inflated units with one shared scale, so decay touches
nothing), O(keys placed on a worker) when that worker's generation changes; at most ``MAX_KEYS``
keys, the least recently seen dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from proxy.routing.base import WorkerSnapshot

# A key's count halves over ~0.7 x WINDOW requests of the whole traffic.
WINDOW = 2048
_GROWTH = 1.0 / (1.0 - 1.0 / WINDOW)
MAX_KEYS = 4096
_RENORMALIZE_AT = 1e12


class Popularity:
    def __init__(self) -> None:
        self._scale = 1.0  # what one request adds now, in the stored (inflated) units
        self._counts: OrderedDict[int, float] = OrderedDict()
        self._placed: dict[int, str] = {}
        self._tokens: dict[int, int] = {}  # a placed key's prompt tokens when it was placed
        self._load: dict[str, float] = {}
        self._generation: dict[str, int] = {}

    def sync(self, workers: Sequence[WorkerSnapshot]) -> None:
        """A worker whose cache started empty again (new generation) holds none of its keys."""
        for w in workers:
            seen = self._generation.setdefault(w.url, w.generation)
            if seen != w.generation:
                self._generation[w.url] = w.generation
                self.drop(w.url)

    def drop(self, url: str) -> None:
        for key in [k for k, u in self._placed.items() if u == url]:
            del self._placed[key]
            self._tokens.pop(key, None)
        self._load.pop(url, None)

    def place(self, key: int, url: str, tokens: int = 0) -> None:
        """``key`` is placed on ``url`` now (a cold decision): its traffic counts there from now on;
        ``tokens``: its prompt's, what its prefix takes of that worker's KV pool (at most)."""
        count = self._counts.get(key, 0.0)
        old = self._placed.get(key)
        if old is not None:
            self._load[old] = self._load.get(old, 0.0) - count
        self._placed[key] = url
        self._tokens[key] = tokens
        self._load[url] = self._load.get(url, 0.0) + count

    def hot_tokens(self, url: str, min_count: float = 0.5) -> int:
        """The prompt tokens of the keys placed on ``url`` that are still requested (a decayed count
        of at least ``min_count``: half is one request within the last ~0.7 x WINDOW): the prefixes
        its cache would lose to an eviction and recompute. O(keys placed); asked only when a spill
        is weighed."""
        floor = min_count * self._scale
        return sum(self._tokens.get(k, 0) for k, u in self._placed.items()
                   if u == url and self._counts.get(k, 0.0) >= floor)

    def seen(self, key: int) -> None:
        """One request of ``key`` (wherever it went): its count, and its placed worker's load."""
        self._scale *= _GROWTH
        self._counts[key] = self._counts.pop(key, 0.0) + self._scale
        url = self._placed.get(key)
        if url is not None:
            self._load[url] = self._load.get(url, 0.0) + self._scale
        if len(self._counts) > MAX_KEYS:
            old, count = self._counts.popitem(last=False)
            where = self._placed.pop(old, None)
            self._tokens.pop(old, None)
            if where is not None:
                self._load[where] = self._load.get(where, 0.0) - count
        if self._scale > _RENORMALIZE_AT:
            self._renormalize()

    def load(self, url: str) -> float:
        """The decayed request count of the keys placed on ``url`` (requests, of the recent window)."""
        return max(0.0, self._load.get(url, 0.0) / self._scale)

    def count(self, key: int) -> float:
        return self._counts.get(key, 0.0) / self._scale

    def keep(self, present: set[str]) -> None:
        """Forget the placements on workers not in ``present`` (their keys' counts stay)."""
        for url in [u for u in {*self._generation, *self._load} if u not in present]:
            self.drop(url)
            self._generation.pop(url, None)

    def _renormalize(self) -> None:
        s = self._scale
        for key in self._counts:
            self._counts[key] /= s
        for url in self._load:
            self._load[url] /= s
        self._scale = 1.0
