"""The block pool: free queue, ids and reference counts (vLLM's ``BlockPool``
and ``FreeKVCacheBlockQueue`` in ``block_pool.py`` / ``kv_cache_utils.py``).

Block 0 is vLLM's null block: never handed out. The pool reuses ids in the
order of vLLM's ``FreeKVCacheBlockQueue``: blocks freed without a
prefix-cache entry first (last freed first, ``prepend_n``), then never used
ids, then blocks freed with a cache entry (oldest first, ``append_n``); on
vLLM 0.27 with caching off every freed block goes to the tail
(``uncached_frees_append``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from stepwarm.blocks.prefix_cache import PrefixCache
from stepwarm.blocks.rule import GroupTable


@dataclass
class BlockPool:
    """Ids ``1..num_blocks-1`` handed out and taken back, with reference
    counts (a prefix hit shares blocks).

    Example (``num_blocks`` 6, no caching): take 3 -> (1, 2, 3); release
    (3, 2, 1) (a request freed last block first) -> the queue is 3, 2, 1
    (``prepend_n`` keeps their order), then the never used 4, 5; take 4 ->
    (3, 2, 1, 4).
    """

    num_blocks: int
    #: The prefix cache whose entries the pool evicts on reuse.
    cache: PrefixCache = field(default_factory=PrefixCache)
    #: Freed blocks go to the queue's tail, cached or not (vLLM 0.27's
    #: ``free_blocks`` with caching off).
    frees_append: bool = False
    #: Free queue: ``front`` (deque head first), then ids ``next_unused..``
    #: never handed out, then ``tail`` (insertion order). The never-used range
    #: is not materialized: GPU runners have hundreds of thousands of blocks.
    next_unused: int = 1
    front: deque = field(default_factory=deque)
    tail: dict[int, None] = field(default_factory=dict)
    #: Reference counts of held ids.
    ref: dict[int, int] = field(default_factory=dict)

    @property
    def num_free(self) -> int:
        """Blocks left in the pool (0 when the runner has no usable block)."""
        return max(0, self.num_blocks - self.next_unused) + len(self.front) + len(self.tail)

    @property
    def num_held(self) -> int:
        """Distinct blocks held, all groups together."""
        return len(self.ref)

    def take(self, n: int) -> tuple[int, ...]:
        """``BlockPool.get_new_blocks``: pop ``n`` ids off the free queue's
        head (evicting any cache entry they had)."""
        start = self.next_unused
        if not self.front and start + n <= self.num_blocks:
            # only never-used ids: no reference, no cache entry to evict
            self.next_unused = start + n
            if n == 1:  # a decode's or a short prompt's one block
                self.ref[start] = 1
                return (start,)
            got = tuple(range(start, start + n))
            self.ref.update(dict.fromkeys(got, 1))
            return got
        out = []
        for _ in range(n):
            if self.front:
                i = self.front.popleft()
            elif self.next_unused < self.num_blocks:
                i, self.next_unused = self.next_unused, self.next_unused + 1
            else:
                i = next(iter(self.tail))
                del self.tail[i]
            self.cache.evict(i)
            self.ref[i] = 1
            out.append(i)
        return tuple(out)

    def release(self, ids: Iterable[int]) -> None:
        """``BlockPool.free_blocks(ids)`` (ids in eviction order): drop one
        reference each; ids no longer held go back to the queue."""
        front = []
        cached = self.cache.keys
        for i in ids:
            if i == 0:
                continue
            self.ref[i] -= 1
            if self.ref[i]:
                continue
            del self.ref[i]
            if i in cached or self.frees_append:
                self.tail[i] = None
            else:
                front.append(i)
        self.front.extendleft(reversed(front))

    def release_tables(self, tables: list[GroupTable]) -> None:
        """:meth:`release` of each of a request's tables, last block first
        (``KVCacheManager.free``), in one loop (a cleanup step frees every
        request of a plan)."""
        ref, cached, tail, queue = self.ref, self.cache.keys, self.tail, self.front
        to_tail = self.frees_append
        for table in tables:
            front = []
            for i in reversed(table.ids):
                if not i:
                    continue
                n = ref[i] - 1
                if n:
                    ref[i] = n
                    continue
                del ref[i]
                if to_tail or i in cached:
                    tail[i] = None
                else:
                    front.append(i)
            if front:
                queue.extendleft(reversed(front))

    def touch(self, i: int) -> None:
        """``BlockPool.touch``: a cache hit takes a reference (and out of the
        free queue if nobody held it)."""
        if i in self.ref:
            self.ref[i] += 1
            return
        self.tail.pop(i, None)
        if i in self.front:
            self.front.remove(i)
        self.ref[i] = 1

    def save(self) -> tuple:
        """The pool's state, copied one level down (with its cache's)."""
        return (self.next_unused, self.front.copy(), self.tail.copy(), self.ref.copy(),
                self.cache.save())

    def restore(self, saved: tuple) -> None:
        """Put back a :meth:`save`."""
        self.next_unused, self.front, self.tail, self.ref, cache = saved
        self.cache.restore(cache)
