"""cache_aware: the SGLang router's cache-aware policy, for a like-for-like baseline.

Rule (sgl-router ``policies/cache_aware.rs`` with the 2025+ CLI defaults; after sglang PR
#14650 a miss goes to the least-loaded worker):
  1. ``load`` = our own in-flight count per worker (as the router's ``WorkerLoadGuard``).
     The fleet is imbalanced when ``max - min > balance_abs_threshold`` and
     ``max > min * balance_rel_threshold``; then the least-loaded healthy worker is taken
     (branch ``balance``) and the prompt is still inserted under it.
  2. Otherwise the prompt is matched against one approximate radix tree per model (``"default"``
     when unnamed) and prompt kind, built only from our own decisions: text (and chat, rendered
     turn by turn by ``prefix_key.render_messages``, so a follow-up turn extends its conversation)
     by characters; token ids by ids, each id one character of a string (the same tree code; a
     tree of its own, so text and ids never match each other). ``match_rate = matched chars /
     prompt chars``. Above ``cache_threshold`` the tenant of the deepest matched
     node is taken (branch ``hit``; the most recently used tenant there, where the router takes
     an arbitrary one), else the least-loaded healthy worker (branch ``miss``; ties go to the
     first in list order, as ``min_by_key``). Either way the text is inserted under the pick.
  3. Each tenant's character count is kept at most ``max_tree_size`` by evicting its least
     recently used leaves. The router does this on a 120 s timer; here it happens right after
     the insert that crosses the limit, since a policy reads no clock. Recency is a decision
     counter, not wall time. For token ids ``max_tree_size`` counts tokens.
  The router has no text for token-id prompts, so there they all miss (rate 0), as they did in
  this port before; here they get the same affinity as text.

``gate: mean`` is smg 1.13.0's rule instead of step 1 (its ``--balance-abs-threshold`` /
``--balance-rel-threshold`` help; its source past 1.9 is not public): no fleet-wide balance
branch; a *matched* worker is skipped for the least-loaded one (branch ``spill``) when its load
exceeds the healthy fleet's mean by ``margin = min(abs, max(min(4, abs), 2 sqrt(mean)))`` (two
standard deviations of an in-flight count at that mean, as a Poisson count swings) and exceeds
``rel x mean``. Its misses go to the least expected wait, which without engine reports is the
least in-flight, as here. On the GPU fleet (run 62, token ids at 6/s) smg 1.13.0's TTFT p95 was
0.78x this port's with the old gate: the simulator's stand-in for smg is this gate.

``overload_waiting`` / ``overload_usage`` (0 = off) add smg 1.13.0's worker-overload protection,
on in smg by default at 8 and 0.8 (its ``--worker-overload-*`` help): a worker whose scrape reports
that many waiting requests, or that KV token usage, is left out of the choice while another is
under (branch ``overload`` when none is). smg reads them on a 10-s poll; the routing simulator
renders that with the ``scrape_s=10`` key (``loadtests/gpu/fleet_sim.py``). On the GPU fleet with
engines reporting load it broke smg's prefix affinity (docs/gpu-fleet.md, runs 86-90).

Complexity: O(prompt chars) per decision for match and insert (edges compared with slice
equality, so the Python-level work is O(tree depth x log edge length)); memory O(distinct chars
inserted), bounded by ``max_tree_size`` per worker and tree.

When to choose it: only as a baseline. It ignores queue depth, prompt length and KV pressure,
and its load signal is one proxy's own counter (see sglang #21199, #14305).

Params (``CacheAwareParams``, defaults = sglang-router CLI): ``cache_threshold`` 0.3,
``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5, ``max_tree_size`` 2**26,
``gate`` spread, ``overload_waiting`` 0, ``overload_usage`` 0.
"""

from __future__ import annotations

import heapq
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.config import ConfigError
from proxy.routing.base import (
    Decision,
    IgnoresFeedback,
    NoWorkerAvailable,
    RouteRequest,
    WorkerSnapshot,
    healthy,
    past_mean,
)
from proxy.routing.prefix_key import blocks_within
from proxy.routing.registry import PolicySpec


@dataclass(frozen=True)
class CacheAwareParams:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 2**26
    gate: str = "spread"  # "spread": sglang-router's imbalance rule; "mean": smg 1.13.0's spill gate
    # smg 1.13.0's worker-overload protection (its defaults 8 and 0.8; 0 = off, as here): a worker
    # whose scrape reports at least this many waiting requests, or this KV token usage, is left
    # out while another is under; when all are over, the least loaded takes the request.
    overload_waiting: int = 0
    overload_usage: float = 0.0

    def validate(self) -> None:
        if self.gate not in ("spread", "mean"):
            raise ConfigError("routing.params.gate: must be spread or mean")
        if self.overload_waiting < 0:
            raise ConfigError("routing.params.overload_waiting: must be >= 0 (0 = off)")
        if not 0.0 <= self.overload_usage <= 1.0:
            raise ConfigError("routing.params.overload_usage: must be in [0, 1] (0 = off)")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ConfigError("routing.params.cache_threshold: must be in [0, 1]")
        if self.balance_abs_threshold < 0:
            raise ConfigError("routing.params.balance_abs_threshold: must be >= 0")
        if self.balance_rel_threshold < 1.0:
            raise ConfigError("routing.params.balance_rel_threshold: must be >= 1.0")
        if self.max_tree_size < 1:
            raise ConfigError("routing.params.max_tree_size: must be >= 1")


def common_prefix_len(a: str, b: str) -> int:
    """Length of the longest common prefix, by binary search over slice equality."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Node:
    __slots__ = ("children", "parent", "tenants", "text")

    def __init__(self, text: str, parent: _Node | None) -> None:
        self.text = text
        self.parent = parent
        self.children: dict[str, _Node] = {}
        # tenant -> last access (decision counter)
        self.tenants: dict[str, int] = {}


class CharTree:
    """Approximate radix tree of prompt characters, with per-tenant recency and sizes."""

    def __init__(self) -> None:
        self.root = _Node("", None)
        self.size: dict[str, int] = {}

    def prefix_match(self, text: str) -> tuple[int, str | None]:
        """(matched chars, the most recent tenant of the deepest matched node)."""
        node, pos, tenant = self.root, 0, None
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                break
            shared = common_prefix_len(child.text, text[pos : pos + len(child.text)])
            if shared == 0:
                break
            pos += shared
            node = child
            if shared < len(child.text):
                break
        if node.tenants:
            tenant = max(node.tenants.items(), key=lambda kv: kv[1])[0]
        return pos, tenant

    def insert(self, text: str, tenant: str, now: int) -> None:
        node, pos = self.root, 0
        node.tenants[tenant] = now
        while pos < len(text):
            child = node.children.get(text[pos])
            if child is None:
                leaf = _Node(text[pos:], node)
                node.children[text[pos]] = leaf
                self._claim(leaf, tenant, now)
                return
            shared = common_prefix_len(child.text, text[pos : pos + len(child.text)])
            if shared < len(child.text):
                child = self._split(child, shared)
            pos += shared
            node = child
            self._claim(node, tenant, now)

    def _claim(self, node: _Node, tenant: str, now: int) -> None:
        if tenant not in node.tenants:
            self.size[tenant] = self.size.get(tenant, 0) + len(node.text)
        node.tenants[tenant] = now

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` chars; return the new upper node."""
        parent = node.parent
        assert parent is not None
        upper = _Node(node.text[:at], parent)
        upper.tenants = dict(node.tenants)
        parent.children[upper.text[0]] = upper
        node.text = node.text[at:]
        node.parent = upper
        upper.children[node.text[0]] = node
        return upper

    def evict_tenant(self, tenant: str, max_size: int) -> None:
        """Drop the tenant's least recently used leaves until its size is at most ``max_size``."""
        if self.size.get(tenant, 0) <= max_size:
            return
        heap = [(n.tenants[tenant], id(n), n) for n in self._leaves(tenant)]
        heapq.heapify(heap)
        while heap and self.size[tenant] > max_size:
            _, _, node = heapq.heappop(heap)
            del node.tenants[tenant]
            self.size[tenant] -= len(node.text)
            parent = node.parent
            if not node.tenants and not node.children and parent is not None:
                del parent.children[node.text[0]]
            if parent is not None and parent is not self.root and tenant in parent.tenants:
                if not any(tenant in c.tenants for c in parent.children.values()):
                    heapq.heappush(heap, (parent.tenants[tenant], id(parent), parent))

    def remove_tenant(self, tenant: str) -> None:
        self.evict_tenant(tenant, -1)
        self.root.tenants.pop(tenant, None)
        self.size.pop(tenant, None)

    def _leaves(self, tenant: str) -> list[_Node]:
        out: list[_Node] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            below = [c for c in node.children.values() if tenant in c.tenants]
            if below:
                stack.extend(below)
            elif node is not self.root and tenant in node.tenants:
                out.append(node)
        return out


class CacheAware(IgnoresFeedback):
    name = "cache_aware"

    def __init__(self, params: CacheAwareParams) -> None:
        self.params = params
        self._trees: dict[str, CharTree] = {}
        self._decisions = 0

    def tree(self, model: str, kind: str = "text") -> CharTree:
        """The tree of ``model``'s prompts of ``kind`` ("text": text and chat; "ids": token ids)."""
        name = model or "default"
        key = name if kind == "text" else f"{name}\x00{kind}"
        return self._trees.setdefault(key, CharTree())

    def select(self, request: RouteRequest, workers: Sequence[WorkerSnapshot]) -> Decision:
        candidates = healthy(workers)
        if not candidates:
            raise NoWorkerAvailable("no healthy worker")
        self._decisions += 1
        p = self.params
        if request.prompt_ids:
            tree, text = self.tree(request.model, "ids"), ids_as_text(request.prompt_ids)
        else:
            tree, text = self.tree(request.model), request.prompt_text
        under = [w for w in candidates if not self._overloaded(w)]
        candidates = under or candidates
        loads = [w.in_flight for w in candidates]
        least = candidates[loads.index(min(loads))]
        if not under:  # every worker over smg's thresholds: the least loaded of them
            return self._decide(request, tree, text, least, "overload", 0, None)
        matched, tenant = 0, None
        if p.gate == "spread" and max(loads) - min(loads) > p.balance_abs_threshold \
                and max(loads) > min(loads) * p.balance_rel_threshold:
            chosen, branch = least, "balance"
        else:
            matched, tenant = tree.prefix_match(text)
            rate = matched / len(text) if text else 0.0
            by_url = {w.url: w for w in candidates}
            if rate > p.cache_threshold and tenant in by_url:
                chosen, branch = by_url[tenant], "hit"
                if p.gate == "mean" and past_mean(chosen.in_flight, loads, p.balance_rel_threshold,
                                                  p.balance_abs_threshold):
                    chosen, branch = least, "spill"
            else:
                chosen, branch = least, "miss"
        return self._decide(request, tree, text, chosen, branch, matched, tenant)

    def _overloaded(self, w: WorkerSnapshot) -> bool:
        """Over smg's worker-overload thresholds by the last scrape (never, unscraped)."""
        p = self.params
        return bool((p.overload_waiting and w.queued is not None and w.queued >= p.overload_waiting)
                    or (p.overload_usage and w.token_usage is not None and w.token_usage >= p.overload_usage))

    def _decide(self, request: RouteRequest, tree: CharTree, text: str, chosen: WorkerSnapshot, branch: str,
                matched: int, tenant: str | None) -> Decision:
        """The prompt inserted under the pick, whatever the branch, as the router does."""
        tree.insert(text, chosen.url, self._decisions)
        tree.evict_tenant(chosen.url, self.params.max_tree_size)
        # What the tree predicts the chosen worker holds, for the predicted-vs-reported metric.
        predicted = matched if tenant == chosen.url else 0
        return Decision(
            chosen.url,
            branch,
            matched_blocks=self._matched_blocks(request, predicted, len(text)),
            reason=f"load={chosen.in_flight} match_chars={matched}",
        )

    @staticmethod
    def _matched_blocks(request: RouteRequest, matched_chars: int, prompt_chars: int) -> int:
        if not prompt_chars or matched_chars <= 0:
            return 0
        tokens = math.floor(matched_chars * request.prompt_tokens / prompt_chars)
        return blocks_within(tokens, request.block_tokens, len(request.block_hashes))

    def on_worker_change(self, workers: Sequence[WorkerSnapshot]) -> None:
        present = {w.url for w in workers}
        for tree in self._trees.values():
            for tenant in [t for t in tree.size if t not in present]:
                tree.remove_tenant(tenant)


def ids_as_text(ids: Sequence[int]) -> str:
    """Token ids as a string of one character per id (code point = id), for the character tree.
    Ids past the last code point (no real vocabulary has them) wrap around: the tree is
    approximate anyway, and a wrapped id only ever costs a spurious match."""
    try:
        return array("I", ids).tobytes().decode("utf-32-le", "surrogatepass")
    except (OverflowError, UnicodeDecodeError, TypeError):
        return "".join(chr(i % 0x110000) for i in ids)


def _factory(params: CacheAwareParams, rng: random.Random) -> CacheAware:
    return CacheAware(params)


SPEC = PolicySpec("cache_aware", CacheAwareParams, _factory)
