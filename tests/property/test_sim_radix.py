"""Hypothesis state machine over the simulated worker's radix cache.

Requests arrive (match, lock, allocate, insert), finish (unlock) and the pool evicts; after every
step the pool never exceeds its capacity, matches are true page-aligned prefixes, locked paths are
never evicted, and the cached token counts agree with the tree.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from proxy.sim.radix import Node, PoolExhausted, RadixCache

sequences = st.lists(st.integers(0, 3), min_size=1, max_size=24)


def path_tokens(cache: RadixCache, node: Node) -> list[int]:
    parts: list[tuple[int, ...]] = []
    while node is not cache.root:
        parts.append(node.key)
        assert node.parent is not None
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def reachable(cache: RadixCache) -> list[Node]:
    nodes, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


class RadixMachine(RuleBasedStateMachine):
    @initialize(capacity=st.integers(8, 64), page_size=st.sampled_from([1, 2, 4]))
    def setup(self, capacity: int, page_size: int) -> None:
        self.cache = RadixCache(capacity, page_size)
        self.running: list[tuple[Node, list[int]]] = []

    @rule(ids=sequences)
    def run_request(self, ids: list[int]) -> None:
        cache = self.cache
        match = cache.match_prefix(ids)
        cache.inc_lock(match.node)
        aligned = len(ids) - len(ids) % cache.page_size
        need = aligned - match.length
        try:
            cache.alloc(need)
        except PoolExhausted:
            cache.dec_lock(match.node)
            return
        cache.insert(ids, need)
        node = cache.match_prefix(ids).node
        cache.inc_lock(node)
        cache.dec_lock(match.node)
        self.running.append((node, ids[:aligned]))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.running) - 1))
        node, _ = self.running.pop(index)
        self.cache.dec_lock(node)

    @rule(n=st.integers(1, 64))
    def evict(self, n: int) -> None:
        self.cache.evict(n)

    @rule(ids=sequences)
    def match_is_a_true_page_aligned_prefix(self, ids: list[int]) -> None:
        match = self.cache.match_prefix(ids)
        assert match.length % self.cache.page_size == 0
        assert 0 <= match.length <= len(ids)
        assert path_tokens(self.cache, match.node) == ids[: match.length]
        assert self.cache.peek_prefix_len(ids) == match.length

    @invariant()
    def capacity_is_never_exceeded(self) -> None:
        c = self.cache
        assert c.tree_tokens + c.private_tokens <= c.capacity
        assert c.available_tokens >= 0

    @invariant()
    def locked_paths_survive_and_are_counted(self) -> None:
        c = self.cache
        nodes = reachable(c)
        assert sum(len(n.key) for n in nodes) == c.tree_tokens
        assert sum(len(n.key) for n in nodes if n.lock_ref > 0) == c.protected_tokens
        assert all(len(n.key) % c.page_size == 0 and n.key for n in nodes)
        for node, ids in self.running:
            assert path_tokens(c, node) == ids
            assert c.match_prefix(ids).length == len(ids)


TestRadixMachine = RadixMachine.TestCase
TestRadixMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
