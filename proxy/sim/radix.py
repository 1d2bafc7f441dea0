"""Token-level radix tree over a bounded KV pool, as SGLang's RadixCache.

- Edges hold token tuples; children are keyed by their first page (``page_size`` tokens), and
  every key is cut to a whole number of pages, so a match is always a multiple of ``page_size``.
- ``match_prefix`` walks the tree (splitting an edge where a match stops inside it) and returns the
  matched length and the deepest matched node; it refreshes the LRU stamp of the path.
- Reference counts: ``inc_lock(node)`` protects the node and all its ancestors (the KV a running
  request reads); only unreferenced leaves are evictable, oldest stamp first (LRU), or newest first
  (``most_recent_first``: transformers' continuous batching hands out the most recently freed
  blocks first, ``BlockManager._init_block_ids.popitem()``).
- The pool: ``capacity`` tokens = tokens cached in the tree + tokens held privately by running
  requests (``alloc``/``free``). ``alloc`` evicts as needed and fails rather than overfill.
  ``insert(ids, held)`` moves a request's privately held tokens into the tree; duplicates of
  tokens already cached are freed, as SGLang frees a duplicate prefix.

Costs: match and insert are O(len(ids)); eviction is O(nodes log nodes) per call.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import xxhash


def page_hashes(parent: int | None, tokens: tuple[int, ...] | list[int], page_size: int) -> Iterator[int]:
    """One hash per whole page of ``tokens``, each chained from the one before (the first from
    ``parent``): an engine's hashes are its own; any stable chain will do."""
    h = parent if parent is not None else 0
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = xxhash.xxh3_64_intdigest(array("I", tokens[start:start + page_size]).tobytes(), seed=h)
        yield h


def chain_hashes(parent: int | None, tokens: tuple[int, ...] | list[int], page_size: int) -> list[int]:
    return list(page_hashes(parent, tokens, page_size))


class Node:
    __slots__ = ("children", "hashes", "key", "last_access", "lock_ref", "parent")

    def __init__(self, key: tuple[int, ...], parent: Node | None) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.lock_ref = 0
        self.last_access = 0
        # One hash per page of ``key``, chained from the parent's last (only with ``events`` on).
        self.hashes: list[int] = []


@dataclass(frozen=True)
class Match:
    length: int
    node: Any  # what a request locks: a Node here, a blocks.Chain in BlockCache


class PoolExhausted(RuntimeError):
    """alloc asked for more tokens than free plus evictable."""


class KvPool:
    """What both prefix caches share (this tree, ``blocks.BlockCache``): a pool of ``capacity``
    tokens, those cached (``tree_tokens``, evictable unless a request holds them) and those held
    privately by running requests (``alloc``/``free``)."""

    tree_tokens: int

    def __init__(self, capacity: int, page_size: int) -> None:
        if capacity < 1 or page_size < 1:
            raise ValueError("capacity and page_size must be >= 1")
        self.capacity = capacity
        self.page_size = page_size
        self.private_tokens = 0
        # KV cache events as SGLang publishes them (``proxy/sim/kv_publish.py``), collected here
        # until the engine sends them after its step; None = off (no cost).
        self.events: list[list[Any]] | None = None

    @property
    def evictable_tokens(self) -> int:
        raise NotImplementedError

    def evict(self, n: int) -> int:
        raise NotImplementedError

    @property
    def available_tokens(self) -> int:
        return self.capacity - self.tree_tokens - self.private_tokens

    @property
    def used_tokens(self) -> int:
        """Tokens that cannot be reclaimed: private plus held (SGLang's num_used_tokens)."""
        return self.capacity - self.available_tokens - self.evictable_tokens

    def alloc(self, n: int) -> None:
        if n > self.available_tokens:
            self.evict(n - self.available_tokens)
        if n > self.available_tokens:
            raise PoolExhausted(f"need {n} tokens, {self.available_tokens} free after eviction")
        self.private_tokens += n

    def free(self, n: int) -> None:
        if n > self.private_tokens:
            raise ValueError("freeing more tokens than allocated")
        self.private_tokens -= n

    def _aligned(self, n: int) -> int:
        return n - n % self.page_size

    def _chain(self, parent: int | None, tokens: tuple[int, ...]) -> list[int]:
        return chain_hashes(parent, tokens, self.page_size)

    def announce(self, ids: list[int] | tuple[int, ...], node: Any, matched: int) -> list[int]:
        """BlockStored for the whole pages of ``ids`` past the ``matched`` prefix (ending at
        ``node``, whose ``hashes`` end with its last page's) before they are computed, as vLLM's scheduler stores a request's blocks when it
        allocates them (``allocate_slots``); the cache takes them when the prefill ends, and says so
        again then (the same hashes: a subscriber keeps one). Returns the hashes announced."""
        aligned = self._aligned(len(ids))
        if self.events is None or aligned <= matched:
            return []
        parent = node.hashes[-1] if node.hashes else None
        new = tuple(ids[matched:aligned])
        hashes = self._chain(parent, new)
        self.events.append(["BlockStored", hashes, parent, list(new), self.page_size, None])
        return hashes


class RadixCache(KvPool):
    def __init__(self, capacity: int, page_size: int = 1, most_recent_first: bool = False) -> None:
        super().__init__(capacity, page_size)
        self._sign = -1 if most_recent_first else 1
        self.reset()

    def reset(self) -> None:
        """Empty the tree (flush_cache); private allocations are kept."""
        if self.events is not None:
            self.events.append(["AllBlocksCleared"])
        self.root = Node((), None)
        self.root.lock_ref = 1  # the root is never evicted
        self.tree_tokens = 0
        self.protected_tokens = 0
        self._tick = 0

    # -- pool accounting ---------------------------------------------------------------------
    @property
    def evictable_tokens(self) -> int:
        return self.tree_tokens - self.protected_tokens

    # -- tree ----------------------------------------------------------------------------------
    def _common(self, key: tuple[int, ...], ids: list[int] | tuple[int, ...], start: int) -> int:
        if len(ids) - start >= len(key) and key == tuple(ids[start : start + len(key)]):
            return len(key)  # the whole edge matches: one C-level comparison
        limit = min(len(key), len(ids) - start)
        i = 0
        while i < limit and key[i] == ids[start + i]:
            i += 1
        return self._aligned(i)

    def _stamp(self) -> int:
        self._tick += 1
        return self._tick

    def match_prefix(self, ids: list[int] | tuple[int, ...]) -> Match:
        node, pos, stamp = self.root, 0, self._stamp()
        node.last_access = stamp
        ps = self.page_size
        while len(ids) - pos >= ps:
            child = node.children.get(tuple(ids[pos : pos + ps]))
            if child is None:
                break
            n = self._common(child.key, ids, pos)
            partial = n < len(child.key)
            if partial:
                child = self._split(child, n)
            child.last_access = stamp
            node, pos = child, pos + n
            if partial:
                break
        return Match(pos, node)

    def _split(self, child: Node, at: int) -> Node:
        """Cut child's edge at ``at`` tokens; returns the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        upper = Node(child.key[:at], parent)
        pages = at // self.page_size  # matches stop on page boundaries
        upper.hashes, child.hashes = child.hashes[:pages], child.hashes[pages:]
        upper.lock_ref = child.lock_ref
        upper.last_access = child.last_access
        parent.children[child.key[: self.page_size]] = upper
        child.key = child.key[at:]
        child.parent = upper
        upper.children[child.key[: self.page_size]] = child
        return upper

    def insert(self, ids: list[int] | tuple[int, ...], held_private: int = 0) -> int:
        """Cache ``ids`` (cut to whole pages); returns the tokens newly added to the tree.

        ``held_private`` private tokens (the caller's KV for the uncached part) are released: the
        new ones become tree tokens, duplicates of cached tokens are freed.
        """
        ids = tuple(ids[: self._aligned(len(ids))])
        match = self.match_prefix(ids)
        added = len(ids) - match.length
        if added > held_private:
            raise ValueError(f"inserting {added} uncached tokens while holding only {held_private}")
        if added:
            leaf = Node(ids[match.length :], match.node)
            leaf.last_access = self._stamp()
            match.node.children[leaf.key[: self.page_size]] = leaf
            self.tree_tokens += added
            if self.events is not None:
                self._stored(leaf)
        self.private_tokens -= held_private
        return added

    def release(self, node: Node | None, ids: list[int] | tuple[int, ...], held_private: int) -> None:
        """A request ends holding ``node`` with ``ids`` (whole pages) computed: cache them, unlock."""
        if held_private > 0:
            self.insert(ids, held_private)
        if node is not None:
            self.dec_lock(node)

    def inc_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.protected_tokens += len(node.key)
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def dec_lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref <= 0:
                raise ValueError("unlocking a node that is not locked")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_tokens -= len(node.key)
            assert node.parent is not None
            node = node.parent

    def evict(self, n: int) -> int:
        """Evict unreferenced leaves, least (or most) recently used first, until ``n`` tokens are freed."""
        sign = self._sign
        heap = [(sign * leaf.last_access, id(leaf), leaf) for leaf in self._leaves() if leaf.lock_ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < n and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[: self.page_size]]
            self.tree_tokens -= len(leaf.key)
            if self.events is not None and leaf.hashes:
                self.events.append(["BlockRemoved", leaf.hashes])
            freed += len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (sign * parent.last_access, id(parent), parent))
        return freed

    def _stored(self, leaf: Node) -> None:
        """One BlockStored for the new leaf's pages, each hash chained over the page's tokens
        from its parent page's (an engine's hashes are its own; any stable chain will do)."""
        assert self.events is not None and leaf.parent is not None
        parent = leaf.parent.hashes[-1] if leaf.parent.hashes else None
        leaf.hashes.extend(self._chain(parent, leaf.key))
        self.events.append(["BlockStored", list(leaf.hashes), parent, list(leaf.key), self.page_size, None])

    def withdraw(self, ids: list[int] | tuple[int, ...], hashes: list[int]) -> None:
        """BlockRemoved for announced ``hashes`` (the last pages of ``ids``) that never reached
        the tree: their request ended before its prefill did."""
        if self.events is None or not hashes:
            return
        aligned = self._aligned(len(ids))
        first = aligned // self.page_size - len(hashes)  # the page the announced ones start at
        held = self.match_prefix(ids[:aligned]).length // self.page_size
        gone = hashes[max(0, held - first):]
        if gone:
            self.events.append(["BlockRemoved", gone])

    def _leaves(self) -> list[Node]:
        leaves, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves

    def node_count(self) -> int:
        count, stack = 0, list(self.root.children.values())
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.children.values())
        return count

    def peek_prefix_len(self, ids: list[int] | tuple[int, ...]) -> int:
        """Matched length without splitting edges or refreshing LRU stamps (for load reports)."""
        node, pos, ps = self.root, 0, self.page_size
        while len(ids) - pos >= ps:
            child = node.children.get(tuple(ids[pos : pos + ps]))
            if child is None:
                break
            n = self._common(child.key, ids, pos)
            pos += n
            if n < len(child.key):
                break
            node = child
        return pos
