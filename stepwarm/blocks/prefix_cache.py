"""The prefix cache: which block ids hold which prompt block, how hits are
aligned, and which blocks a group caches (vLLM's ``BlockHashToBlockMap`` in
``block_pool.py`` and ``resolve_kv_cache_block_sizes`` in ``kv_cache_utils.py``).

Every stepwarm prompt is the same token sequence, so a block's hash is its
place: block ``i`` of group ``g`` of one request's prompt is block ``i`` of
any other's, and its key is ``(g, i)``. A block holding sampled tokens has a
key of its own, ``(g, i, req_id)``, that no other request's hit looks up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
import math

from stepwarm.blocks.rule import cdiv
from stepwarm.profile import CacheSpec, RunnerProfile

#: Kinds whose managers keep no prefix-cache entries (and get no hit).
NOT_CACHED = ("circular_buffer", "cross_attention", "encoder_only_attention")
#: Kinds whose hits are the cached blocks from the first on (downward-closed).
FULL_KINDS = ("full_attention", "mla_attention")


@dataclass
class PrefixCache:
    """``BlockHashToBlockMap``: cache key -> the ids cached for it, and back.

    The pool evicts an id's entry when it hands the id out again
    (:meth:`evict`, ``BlockPool._maybe_evict_cached_block``).
    """

    #: key -> the ids cached for it, oldest first (a hit takes the first).
    entries: dict[tuple, dict[int, None]] = field(default_factory=dict)
    #: id -> its key.
    keys: dict[int, tuple] = field(default_factory=dict)

    @staticmethod
    def key(group: int, index: int, shared: bool, req_id: str) -> tuple:
        """The key of block ``index`` of ``group``: shared by every request
        when the block is the prompt's, else the request's own."""
        return (group, index) if shared else (group, index, req_id)

    def add(self, key: tuple, block: int) -> None:
        """``block`` becomes a cache entry for ``key``."""
        self.entries.setdefault(key, {})[block] = None
        self.keys[block] = key

    def first(self, key: tuple) -> int | None:
        """The oldest id cached for ``key`` (what a hit takes), or None."""
        return next(iter(self.entries.get(key, ())), None)

    def evict(self, block: int) -> None:
        """``BlockPool._maybe_evict_cached_block``: ``block`` is handed out
        again, so its entry (if any) goes."""
        key = self.keys.pop(block, None)
        if key is not None:
            ids = self.entries[key]
            del ids[block]
            if not ids:
                del self.entries[key]

    def cache_range(self, group: int, block_size: int, ids: list[int], start: int, end: int,
                    prompt_len: int, req_id: str, mask: list[bool] | None = None,
                    hash_lookahead: int = 0) -> None:
        """Blocks ``start..end-1`` of a request's table in ``group`` become
        entries (``SingleTypeKVCacheManager.cache_blocks``): null and already
        cached blocks left out, and those ``mask`` (of ``start..end-1``; None:
        all) leaves out. A block is shared when its hash, which reads
        ``hash_lookahead`` tokens past it, lies wholly within the prompt."""
        entries, keys = self.entries, self.keys
        for i in range(start, end):
            block = ids[i]
            if not block or block in keys or (mask and not mask[i - start]):
                continue
            if (i + 1) * block_size + hash_lookahead <= prompt_len:
                key: tuple = (group, i)
            else:
                key = (group, i, req_id)
            entries.setdefault(key, {})[block] = None
            keys[block] = key

    def cached(self, group: int, index: int, block_size: int, prompt_len: int,
               req_id: str) -> bool:
        """Whether block ``index`` of ``req_id``'s table in ``group`` has an
        entry (a prompt block's shared one, else the request's own)."""
        return bool(self.entries.get(self.key(group, index, (index + 1) * block_size <= prompt_len,
                                              req_id)))

    def hit_blocks(self, group: int, block_size: int, prompt_len: int, max_length: int,
                   req_id: str) -> int:
        """``FullAttentionManager.find_longest_cache_hit`` for a request
        holding no block: blocks cached from the first on, within
        ``max_length`` tokens."""
        i = 0
        while i < max_length // block_size and self.cached(group, i, block_size, prompt_len,
                                                           req_id):
            i += 1
        return i

    def last_cached_block(self, group: int, block_size: int, prompt_len: int, max_length: int,
                          req_id: str, alignment: int) -> int:
        """``MambaManager.find_longest_cache_hit`` (blocks of the hit
        alignment, no partial hash hits) for a request holding no block,
        within ``max_length`` tokens: the last cached state block whose end
        is a multiple of ``alignment`` tokens. Returns the hit in blocks (the
        blocks before that one are null in the request's table), 0 where no
        state is cached."""
        for i in range(max_length // block_size - 1, -1, -1):
            if (i + 1) * block_size % alignment == 0 and self.cached(group, i, block_size,
                                                                     prompt_len, req_id):
                return i + 1
        return 0

    def window_hit_blocks(self, group: int, spec: CacheSpec, prompt_len: int, max_length: int,
                          req_id: str, alignment: int) -> int:
        """``SlidingWindowManager.find_longest_cache_hit`` (no EAGLE) for a
        request holding no block, within ``max_length`` tokens: from the
        right, the first run of ``cdiv(sliding_window - 1, block_size)``
        cached blocks (a run must end at a multiple of ``alignment`` tokens);
        failing one, the cached run from the first block, rounded down to
        ``alignment``. Returns the hit in blocks: the run's end (the blocks
        before the run are null in the request's table).

        Example (``sliding_window`` 5, 2-token blocks: runs of 2 blocks):
        blocks 1, 2, 4 cached, ``max_length`` 10: the run 1-2 ends at block 3,
        a 6-token hit; the lone block 4 is no run."""
        bs = spec.block_size
        need = cdiv(spec.sliding_window - 1, bs)
        run = 0
        for i in range(max_length // bs - 1, -1, -1):
            if not self.cached(group, i, bs, prompt_len, req_id):
                run = 0
                continue
            if run == 0 and (i + 1) * bs % alignment:
                continue  # a run's last block ends on a hit boundary
            run += 1
            if run >= need:
                return i + run
        while run * bs % alignment:
            run -= 1
        return run

    def save(self) -> tuple:
        """Copies of the entries (one level down: ids and keys are immutable)."""
        return {k: v.copy() for k, v in self.entries.items()}, self.keys.copy()

    def restore(self, saved: tuple) -> None:
        """Put back a :meth:`save`."""
        self.entries, self.keys = saved


def prefix_cache_alignment(specs: tuple[CacheSpec, ...], enable_caching: bool) -> int:
    """Tokens prefix-cache hits are aligned to (``cache_hit_alignment_tokens``
    of the scheduler's managers), 1 without prefix caching.

    Mirrors ``resolve_kv_cache_block_sizes`` and
    ``HybridKVCacheCoordinator._cache_hit_alignment_tokens``: with one
    scheduler group, its block size (``UnitaryKVCacheCoordinator``); with
    several, the scheduler block size (the LCM of their block sizes), or the
    hash block size (the GCD of the cacheable groups' block sizes) when
    partial hash hits are on: a Mamba align group whose block is larger than
    the hash block, every other cacheable group taking hits finer than its
    block or having the hash block size (``partial_hash_hits_enabled``;
    vLLM 0.26 does not ask the others).

    A request's computed prefix is rounded down to it before its full blocks
    become cache entries (``HybridKVCacheCoordinator.cache_blocks``): a group
    of block size 2 beside one of 3 caches nothing of a 5-token prompt. A
    sliding-window group caches only the blocks a hit at each aligned
    boundary reads (``SlidingWindowManager.reachable_block_mask``).

    Args:
        specs: the worker's groups; encoder-only groups are runner-only and
            not counted.
    """
    groups = [s for s in specs if s.kind != "encoder_only_attention"]
    if not enable_caching or not groups:
        return 1
    scheduler_block_size = math.lcm(*(s.block_size for s in groups))
    if len(groups) == 1:
        return scheduler_block_size
    hash_block_size = prefix_hash_block_size(specs, enable_caching)
    if hash_block_size == scheduler_block_size:
        return scheduler_block_size
    partial = any(s.kind == "mamba" and s.block_size > hash_block_size for s in groups) and all(
        s.fine_grained_hits is not False or s.block_size == hash_block_size
        for s in _hashed_groups(groups))
    return hash_block_size if partial else scheduler_block_size


def prefix_hash_block_size(specs: tuple[CacheSpec, ...], enable_caching: bool) -> int:
    """Tokens per prompt hash (``Request.block_hashes``), as
    ``resolve_kv_cache_block_sizes`` resolves ``hash_block_size``: one
    scheduler group, its block size; several, the GCD of the prefix-cacheable
    groups' block sizes, or their LCM (the scheduler block size) when prefix
    caching is off or a Mamba group is not in ``align`` mode. 1 without
    groups. (No ``prefix_match_unit`` override, no decode context parallelism.)"""
    groups = [s for s in specs if s.kind != "encoder_only_attention"]
    if not groups:
        return 1
    scheduler_block_size = math.lcm(*(s.block_size for s in groups))
    if len(groups) == 1 or not enable_caching:
        return scheduler_block_size
    if any(s.kind == "mamba" and s.mamba_cache_mode != "align" for s in groups):
        return scheduler_block_size
    return math.gcd(*(s.block_size for s in _hashed_groups(groups)))


def _hashed_groups(groups: list[CacheSpec]) -> list[CacheSpec]:
    """The groups whose block sizes set the hash block (vLLM's
    ``prefix_cacheable`` groups: all but circular buffers), or all of them
    when none is."""
    return [s for s in groups if s.kind != "circular_buffer"] or groups


def window_block_mask(spec: CacheSpec, alignment: int, start: int, end: int) -> list[bool] | None:
    """``SlidingWindowManager.reachable_block_mask`` (dense retention, no
    EAGLE): which of blocks ``start..end-1`` a sliding-window group caches
    (None: all). A hit at an aligned boundary reads the last
    ``cdiv(sliding_window - 1, block_size)`` blocks before it.

    Example (``sliding_window`` 3, 2-token blocks, hits aligned to 8 tokens):
    a hit at token 8 or 16 reads ``cdiv(2, 2)`` = 1 block before it, so of
    each 4 blocks only the last is cached: ``[False, False, False, True]``.
    """
    if spec.kind != "sliding_window" or alignment % spec.block_size:
        return None
    need = cdiv(spec.sliding_window - 1, spec.block_size)
    per_segment = alignment // spec.block_size
    if need >= per_segment:
        return None
    return [i % per_segment >= per_segment - need for i in range(start, end)]


@dataclass(frozen=True)
class DrafterCaching:
    """What a model-based drafter changes in prefix caching (tokens; all 0 /
    empty without a drafter), as the scheduler's ``KVCacheManager`` gets it.

    - ``reprefill_tokens``: ``num_prefill_lookahead - 1`` (multi-module MTP
      reads ``k`` tokens ahead): the last such computed tokens may be
      re-prefilled, so they are not cached (``get_num_cacheable_tokens``).
    - ``hash_lookahead_tokens``: ``num_hash_lookahead_tokens`` (vLLM 0.33):
      a block's hash also covers the tokens after it, so a block is cached
      once they exist, and a prompt block whose lookahead reaches past the
      prompt is keyed by sampled tokens no other prompt has.
    - ``eagle_groups``: groups whose managers drop the last block of a hit
      (``use_eagle``); with several groups, such a group caches one block of
      its own past the hit alignment
      (``HybridKVCacheCoordinator.get_num_cacheable_tokens``).
    """

    reprefill_tokens: int = 0
    hash_lookahead_tokens: int = 0
    eagle_groups: frozenset[int] = frozenset()

    @classmethod
    def of(cls, profile: RunnerProfile) -> DrafterCaching:
        d = profile.drafter
        if d is None:
            return cls()
        return cls(max(0, d.num_prefill_lookahead_tokens - 1), d.num_hash_lookahead_tokens,
                   frozenset(d.eagle_groups))
