"""How the ``ttft`` policy (``ttft_cost.py``, whose docstring gives the rules) orders workers whose
scores tie: the recent picks and cold placements it counts, and the rendezvous hash of a prompt's
head, which every proxy computes alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import xxhash

from proxy.routing.base import RouteRequest
from proxy.routing.consistent_hash import routing_key
from proxy.routing.ttft_estimate import Estimate
from proxy.routing.ttft_params import TtftParams

# Recent picks decay by this per decision (a window of ~64 decisions).
RECENT_WINDOW = 64
_RECENT_DECAY = 1.0 - 1.0 / RECENT_WINDOW
# Cold placements decay by this per cold decision.
COLD_WINDOW = 256
_COLD_DECAY = 1.0 - 1.0 / COLD_WINDOW


class PickHistory:
    """Decayed counts of recent picks and cold placements per worker, and their tie orders."""

    def __init__(self, params: TtftParams) -> None:
        self.params = params
        self._last_pick: dict[str, int] = {}
        # url -> (decayed count of recent picks, decision number it was last updated at)
        self._recent: dict[str, tuple[float, int]] = {}
        self._url_seeds: dict[str, int] = {}
        self._decisions = 0
        # url -> (decayed count of cold placements, cold decision number it was last updated at)
        self._cold: dict[str, tuple[float, int]] = {}
        self._cold_decisions = 0

    def picked(self, url: str) -> None:
        self._recent[url] = (self.recent_picks(url) + 1.0, self._decisions + 1)
        self._decisions += 1
        self._last_pick[url] = self._decisions

    def recent_picks(self, url: str) -> float:
        """Picks of ``url`` over roughly the last ``RECENT_WINDOW`` decisions (exponential decay)."""
        count, at = self._recent.get(url, (0.0, self._decisions))
        return count * _RECENT_DECAY ** (self._decisions - at)

    def cold_placements(self, url: str) -> float:
        count, at = self._cold.get(url, (0.0, self._cold_decisions))
        return count * _COLD_DECAY ** (self._cold_decisions - at)

    def count_cold(self, url: str) -> None:
        self._cold[url] = (self.cold_placements(url) + 1.0, self._cold_decisions + 1)
        self._cold_decisions += 1

    def tie_order(self, request: RouteRequest) -> Callable[[Estimate], tuple[int, float, int]]:
        """Longest match first; then the rendezvous hash of the prompt key, or least recent pick."""
        hashes = request.block_hashes
        recent = self.params.tie_break == "recent" or not (hashes or request.session_key)
        if recent:
            return lambda e: (-e.matched_blocks, self.recent_picks(e.url), self._last_pick.get(e.url, -1))
        key = routing_key(request, self.params.key_blocks).to_bytes(8, "little")
        if self.params.tie_break == "hash":
            return lambda e: (-e.matched_blocks, 0.0, xxhash.xxh3_64_intdigest(key, self._url_seed(e.url)))
        # rendezvous: several holders of the prefix share its load (a hash would pile one hot
        # prefix on one of them); among non-holders the hash keeps proxies' spill targets alike.
        cold = self.params.cold_blocks

        def order(e: Estimate) -> tuple[int, float, int]:
            if e.matched_blocks > cold:
                return (-e.matched_blocks, self.recent_picks(e.url), self._last_pick.get(e.url, -1))
            return (-e.matched_blocks, 0.0, xxhash.xxh3_64_intdigest(key, self._url_seed(e.url)))

        return order

    def cold_order(self, request: RouteRequest, tied: Sequence[Estimate], outstanding: Callable[[str], int],
                   load: Callable[[str], float] | None = None,
                   ) -> Callable[[Estimate], tuple[int, float, int, int, int]]:
        """Over the tied workers (of the first ``cold_choices`` in rendezvous order): with ``load``
        (``popularity``: the traffic the groups placed on each bring), the least first; then the
        fewest of our requests ``outstanding``, then cold placements within ``cold_slack`` of the
        fewest, then the rendezvous order."""
        key = routing_key(request, self.params.key_blocks).to_bytes(8, "little")
        rank = {e.url: xxhash.xxh3_64_intdigest(key, self._url_seed(e.url)) for e in tied}
        choices = sorted(tied, key=lambda e: rank[e.url])[: self.params.cold_choices or None]
        counts = {e.url: self.cold_placements(e.url) for e in choices}
        bound = min(counts.values()) + self.params.cold_slack
        waiting = {e.url: outstanding(e.url) for e in choices}
        traffic = {e.url: load(e.url) for e in choices} if load is not None else {}
        return lambda e: (int(e.url not in counts), traffic.get(e.url, 0.0), waiting.get(e.url, 0),
                          int(counts.get(e.url, bound + 1) > bound), rank[e.url])

    def _url_seed(self, url: str) -> int:
        seed = self._url_seeds.get(url)
        if seed is None:
            seed = self._url_seeds[url] = xxhash.xxh3_64_intdigest(url.encode())
        return seed

    def forget(self, present: Iterable[str]) -> None:
        """Drop the counts of workers not in ``present`` (their hash seeds are kept: pure)."""
        keep = set(present)
        for table in (self._last_pick, self._recent, self._cold):
            for url in [u for u in table if u not in keep]:
                del table[url]
