"""The prefix cache as transformers' continuous batching keeps it: hash-chained blocks, not a tree.

The GPU fleet's engine (``loadtests/gpu/engine_server.py``) shares prefixes through
``BlockManager`` (``generation/continuous_batching/cache_allocators/block_manager.py``, read
2026-12-07), whose rules differ from a radix tree's in what they evict:

- A block is a page of tokens named by a hash chained from its parent's; a prompt matches block
  by block from its first, and stops at the first hash the pool does not hold.
- A request holds a reference on every block of its sequence. When it ends, its blocks are
  released **in sequence order** (``free_blocks``): each whose count falls to zero joins the end of
  one ordered set of free, still-hashed blocks (``_init_block_ids``).
- Room is made by taking the **last** of that set (``popitem()``): the most recently freed
  block, whether or not blocks that chain from it are still cached. A group's prefix, freed when
  its last running request ends, can go before older requests' tails that hang from it, which
  stay in the pool, unreachable, until their own turn (a radix tree evicts leaves only).
- A block taken from the set by a match leaves it, and joins its end again when next released.

Same interface as ``RadixCache`` (``Match.node`` is the matched chain); ``release`` ends a request
in the engine's order. Hashes and events as ``RadixCache`` makes them (``radix.page_hashes``).
"""

from __future__ import annotations

from typing import Any

from proxy.sim.radix import KvPool, Match, chain_hashes

MEMO_CHAINS = 256


class Chain:
    """The blocks (by hash) a match found, in sequence order: what a request holds."""

    __slots__ = ("hashes",)

    def __init__(self, hashes: list[int]) -> None:
        self.hashes = hashes


class BlockCache(KvPool):
    def __init__(self, capacity: int, page_size: int = 1) -> None:
        super().__init__(capacity, page_size)
        self._memo: dict[tuple[int, ...], list[int]] = {}
        self.reset()

    def reset(self) -> None:
        """Forget every block (flush_cache); private allocations are kept."""
        if self.events is not None:
            self.events.append(["AllBlocksCleared"])
        self._refs: dict[int, int] = {}  # hash -> requests holding the block (cached blocks only)
        self._free: dict[int, None] = {}  # cached blocks no request holds, in the order released
        self.tree_tokens = 0

    @property
    def protected_tokens(self) -> int:
        return self.tree_tokens - self.evictable_tokens

    @property
    def evictable_tokens(self) -> int:
        return len(self._free) * self.page_size

    def evict(self, n: int) -> int:
        """Take free blocks, the most recently released first, until ``n`` tokens are freed."""
        freed = 0
        while freed < n and self._free:
            h, _ = self._free.popitem()
            del self._refs[h]
            self.tree_tokens -= self.page_size
            if self.events is not None:
                self.events.append(["BlockRemoved", [h]])
            freed += self.page_size
        return freed

    # -- blocks -------------------------------------------------------------------------------
    def _hashes(self, ids: list[int] | tuple[int, ...]) -> list[int]:
        """The chain of ``ids``' whole pages. A request's pages are hashed at its match, its
        prompt's caching and its end, and a waiting one's at every look: the last few hundred
        chains are kept (a tuple's lookup is C work, a chain ~100 hashes in Python)."""
        key = tuple(ids[: self._aligned(len(ids))])
        chain = self._memo.get(key)
        if chain is None:
            if len(self._memo) >= MEMO_CHAINS:
                self._memo.clear()
            chain = self._memo[key] = chain_hashes(None, key, self.page_size)
        return chain

    def _walk(self, ids: list[int] | tuple[int, ...]) -> list[int]:
        """The cached blocks ``ids`` matches, from the first, to the first one missing."""
        out = []
        for h in self._hashes(ids):
            if h not in self._refs:
                break
            out.append(h)
        return out

    def match_prefix(self, ids: list[int] | tuple[int, ...]) -> Match:
        found = self._walk(ids)
        return Match(len(found) * self.page_size, Chain(found))

    def peek_prefix_len(self, ids: list[int] | tuple[int, ...]) -> int:
        return len(self._walk(ids)) * self.page_size

    def inc_lock(self, node: Any) -> None:
        for h in node.hashes:
            self._hold(h)

    def dec_lock(self, node: Any) -> None:
        for h in node.hashes:
            self._release(h)

    def _hold(self, h: int) -> None:
        refs = self._refs.get(h)
        if refs is None:
            return  # flushed while held
        if refs == 0:
            del self._free[h]
        self._refs[h] = refs + 1

    def _release(self, h: int) -> None:
        refs = self._refs.get(h)
        if refs is None:
            return  # flushed while held
        if refs <= 0:
            raise ValueError("releasing a block no request holds")
        self._refs[h] = refs - 1
        if refs == 1:
            self._free[h] = None

    def _store(self, ids: tuple[int, ...], hashes: list[int], held_private: int, hold_from: int | None) -> int:
        """Put ``ids``' pages (``hashes``, their chain) in the pool: blocks already cached are the
        pool's (the request's copies are freed, as the engine re-points a block whose hash
        exists), the rest become cached, free; those from ``hold_from`` on are then held by the
        caller. Returns the tokens added."""
        ps = self.page_size
        added = 0
        run: list[int] = []  # new blocks since the last cached one, for one BlockStored
        for i, h in enumerate(hashes):
            if h in self._refs:
                self._stored(run, hashes, ids, i - len(run))
                run = []
                continue
            self._refs[h] = 0
            self._free[h] = None
            self.tree_tokens += ps
            added += ps
            run.append(h)
        self._stored(run, hashes, ids, len(hashes) - len(run))
        if added > held_private:
            raise ValueError(f"inserting {added} uncached tokens while holding only {held_private}")
        if hold_from is not None:
            for h in hashes[hold_from:]:
                self._hold(h)
        self.private_tokens -= held_private
        return added

    def _stored(self, run: list[int], hashes: list[int], ids: tuple[int, ...], first: int) -> None:
        if self.events is None or not run:
            return
        ps = self.page_size
        parent = hashes[first - 1] if first else None
        self.events.append(["BlockStored", run, parent, list(ids[first * ps:(first + len(run)) * ps]), ps, None])

    def insert(self, ids: list[int] | tuple[int, ...], held_private: int = 0) -> int:
        """Cache ``ids`` (cut to whole pages), unheld; returns the tokens newly added."""
        pages = tuple(ids[: self._aligned(len(ids))])
        return self._store(pages, self._hashes(pages), held_private, hold_from=None)

    def release(self, node: Any, ids: list[int] | tuple[int, ...], held_private: int) -> None:
        """A request ends holding ``node`` (its sequence's first blocks) with ``ids`` (whole
        pages) computed: cache its new blocks and release the whole sequence in order, as
        ``free_blocks`` walks the request's block table: the earliest block first, so the last
        one is the next evicted."""
        own = list(node.hashes) if node is not None else []
        pages = tuple(ids)
        # the chain past what it holds, from its last held block (the head is hashed already)
        rest = chain_hashes(own[-1] if own else None, pages[len(own) * self.page_size:], self.page_size)
        hashes = own + rest
        if pages:
            self._store(pages, hashes, held_private, hold_from=len(own))
        for h in hashes:
            self._release(h)

    # -- events (``announce`` is KvPool's) -------------------------------------------------------
    def withdraw(self, ids: list[int] | tuple[int, ...], hashes: list[int]) -> None:
        if self.events is None or not hashes:
            return
        gone = [h for h in hashes if h not in self._refs]
        if gone:
            self.events.append(["BlockRemoved", gone])
