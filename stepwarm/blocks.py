"""Block reservation: how many KV cache blocks the scheduler holds, and a ledger.

One reservation rule per KV cache spec kind, looked up by ``CacheSpec.kind``
(:data:`RULES`), each mirroring what ``KVCacheManager.allocate_slots``
(``vllm/v1/core/kv_cache_manager.py``) and the matching
``SingleTypeKVCacheManager`` subclass hold for one request, and vLLM's own
``vllm.v1.worker.gpu.warmup._reserved_block_count`` (which differs for
encoder-only groups and requests without encoder input; see
:func:`reserved_blocks`). ``tests/property`` checks every rule against a real
``KVCacheManager`` driven the way the scheduler drives it.

:class:`BlockLedger` builds block tables the way the scheduler's managers
do: ids from one shared pool of ``num_blocks`` in which block 0 is the null
block, reused in vLLM's free-queue order; null placeholders where a manager
keeps them (sliding window, chunked local, Mamba); blocks freed when they fall
out of a window or chunk; prefix-cache hits sharing an earlier request's
cached prompt blocks. Each rule's methods mirror the manager's
``get_num_skipped_tokens``, ``get_num_blocks_to_allocate``,
``allocate_new_blocks`` and ``remove_skipped_blocks``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Iterable
import functools
import math
from operator import itemgetter
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from stepwarm.profile import CacheSpec, RunnerProfile


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints (``vllm.utils.math_utils.cdiv``)."""
    return -(-a // b)


@dataclass(frozen=True)
class ReservationContext:
    """Runner-wide facts every reservation rule reads (tokens)."""

    num_lookahead_tokens: int = 0
    max_model_len: int = 1 << 30
    max_encoder_len: int = 0

    @classmethod
    def of(cls, profile: RunnerProfile) -> ReservationContext:
        """The context of a runner profile."""
        return cls(
            num_lookahead_tokens=profile.num_lookahead_tokens,
            max_model_len=profile.max_model_len,
            max_encoder_len=profile.max_encoder_len,
        )


@dataclass(slots=True)
class GroupTable:
    """One request's block table in one KV cache group, as the scheduler's
    ``SingleTypeKVCacheManager.req_to_blocks`` holds it (0: the null block),
    plus the Mamba align-mode bookkeeping ``MambaManager`` keeps per request
    (``_allocated_block_reqs``, ``last_state_block_idx``,
    ``_num_retired_blocks``)."""

    ids: list[int] = field(default_factory=list)
    allocated: bool = False
    last_state_idx: int | None = None
    retired: int = 0

    def copy(self) -> GroupTable:
        """An independent copy (its own ``ids`` list)."""
        return GroupTable(list(self.ids), self.allocated, self.last_state_idx, self.retired)


class ReservationRule(ABC):
    """How one KV cache group's scheduler manager grows, trims and frees a
    request's block table (one subclass per manager)."""

    @abstractmethod
    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        """Block table length after the scheduler covered ``num_tokens``.

        Args:
            num_tokens: tokens computed plus scheduled for the request (no
                lookahead: the rule adds it where vLLM does).
            spec: the group's spec.
            ctx: lookahead, ``max_model_len`` and encoder length.

        Returns:
            Blocks (including any null-block placeholders the manager keeps
            in the request's block table).
        """

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        """``get_num_skipped_tokens``: leading tokens whose blocks the manager
        no longer needs once ``num_computed`` tokens are computed (their
        blocks become null placeholders and go back to the pool). 0 here."""
        return 0

    def to_allocate(self, table: GroupTable, num_tokens: int, spec: CacheSpec,
                    ctx: ReservationContext) -> int:
        """``get_num_blocks_to_allocate`` for a request whose table is
        ``table``: blocks the pool must hand out to reach ``num_tokens``."""
        return max(0, self.blocks(num_tokens, spec, ctx) - len(table.ids))

    def allocate(self, table: GroupTable, num_tokens: int, spec: CacheSpec,
                 ctx: ReservationContext, take) -> tuple[list[int], list[int]]:
        """``allocate_new_blocks``: grow ``table`` to cover ``num_tokens``.

        Args:
            take: ``take(n)`` -> ``n`` ids popped from the pool.

        Returns:
            ``(appended, taken)``: the ids appended to the table (what the
            scheduler sends as the request's new block ids; may include null
            placeholders) and the ids taken from the pool.
        """
        got = take(self.to_allocate(table, num_tokens, spec, ctx))
        table.ids.extend(got)
        return list(got), list(got)

    def remove_skipped(self, table: GroupTable, num_computed: int, spec: CacheSpec) -> list[int]:
        """``remove_skipped_blocks``: replace blocks of skipped tokens by the
        null block, walking back from the last skipped block and stopping at
        the first null one (``_remove_blocks_in_range``).

        Returns:
            The freed ids, in the order vLLM frees them (last block first).
        """
        skipped = self.skipped_tokens(num_computed, spec)
        if skipped <= 0:
            return []
        last = min(skipped // spec.block_size, len(table.ids))
        freed = []
        for i in range(last - 1, -1, -1):
            if table.ids[i] == 0:
                break
            freed.append(table.ids[i])
            table.ids[i] = 0
        return freed


class TokenRangeRule(ReservationRule):
    """Full and MLA attention (``FullAttentionManager``).

    Mirrors ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: the block
    table covers ``min(num_tokens + num_lookahead_tokens, max_model_len)``
    tokens. Subclasses for windowed attention replace blocks that fell out of
    the window with the null block (and free them) but keep the table length.
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size)


class SlidingWindowRule(TokenRangeRule):
    """``SlidingWindowManager``: tokens before the window of the next token
    are skipped (``num_computed - sliding_window + 1``)."""

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return max(0, num_computed - spec.sliding_window + 1)


class ChunkedLocalRule(TokenRangeRule):
    """``ChunkedLocalAttentionManager``: tokens of the chunks before the
    current one are skipped (``num_computed // chunk * chunk``)."""

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return num_computed // spec.attention_chunk_size * spec.attention_chunk_size


class CircularBufferRule(ReservationRule):
    """``CircularBufferManager``: one ring block for the request's lifetime."""

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return 1


class CrossAttentionRule(ReservationRule):
    """``CrossAttentionManager``: blocks cover the encoder sequence only
    (``cdiv(encoder_len, block_size)``), whatever the decoder length.

    The scheduler passes ``num_encoder_tokens`` (the request's encoder input
    length) to ``allocate_slots`` on the allocation that schedules the encoder
    input; ``ctx.max_encoder_len`` is that length here (the runner's maximum
    unless :meth:`BlockLedger.grow` is given the request's own ``encoder_len``;
    a request with no encoder input holds 0 blocks)."""

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return cdiv(ctx.max_encoder_len, spec.block_size)


class RunnerOnlyRule(ReservationRule):
    """Encoder-only attention: 0 blocks.

    ``EncoderOnlyAttentionSpec`` groups are runner-only: the V1 runner appends
    them to its own ``KVCacheConfig`` after the scheduler's is built (and reads
    a zero block table for them), the V2 runner keeps them out of the config,
    and ``KVCacheSpecRegistry`` has no manager for the spec. The scheduler's
    ``KVCacheManager`` never allocates a block for them.
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return 0


class MambaRule(ReservationRule):
    """``MambaManager``: the token range plus ``num_speculative_blocks``
    running-state blocks, in every cache mode. Only the state after the last
    computed token is needed (``get_num_skipped_tokens`` = ``num_computed -
    1``): earlier blocks become null placeholders.

    None/all modes size like attention (lookahead, ``max_model_len`` cap).
    Align mode sizes from the uncapped token range without lookahead, hands
    out at most one state block per step (plus the speculative blocks on the
    first), pads the skipped part with null blocks, moves the speculative
    blocks to the end of the table as it grows, and frees the previous
    step's state block once it is behind the computed tokens
    (``MambaManager.allocate_new_blocks`` / ``remove_skipped_blocks``).
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        if spec.mamba_cache_mode == "align":
            return cdiv(num_tokens, spec.block_size) + spec.num_speculative_blocks
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size) + spec.num_speculative_blocks

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return num_computed - 1

    def to_allocate(self, table, num_tokens, spec, ctx) -> int:
        new = self.blocks(num_tokens, spec, ctx) - len(table.ids)
        if spec.mamba_cache_mode != "align" or new <= 0:
            return max(0, new)
        return min(new, 1 if table.allocated else 1 + spec.num_speculative_blocks)

    def allocate(self, table, num_tokens, spec, ctx, take):
        if spec.mamba_cache_mode != "align":
            return super().allocate(table, num_tokens, spec, ctx, take)
        ids, spec_blocks = table.ids, spec.num_speculative_blocks
        need = self.blocks(num_tokens, spec, ctx)
        if need <= len(ids):
            table.allocated = True
            return [], []
        prev = len(ids)
        if table.allocated:
            table.last_state_idx = prev - 1 - spec_blocks
        elif prev > 0:
            table.last_state_idx = prev - 1
        skipped = need - spec_blocks - 1
        if prev < skipped:
            ids.extend([0] * (skipped - prev))
        if table.allocated:
            for i in range(prev - spec_blocks, prev):
                if i >= skipped:
                    break
                ids.append(ids[i])  # _relocate_speculative_block
                ids[i] = 0
        got = take(max(need - len(ids), 0))
        appended = ids[prev:] + list(got)
        ids.extend(got)
        table.allocated = True
        return appended, list(got)

    def remove_skipped(self, table, num_computed, spec):
        if spec.mamba_cache_mode != "align":
            return super().remove_skipped(table, num_computed, spec)
        ids, freed = table.ids, []
        skipped = self.skipped_tokens(num_computed, spec)
        if skipped > 0:
            first = table.retired
            last = min(skipped // spec.block_size, len(ids))
            if first < last:
                for i in range(last - 1, first - 1, -1):
                    if ids[i]:
                        freed.append(ids[i])
                        ids[i] = 0
                table.retired = last
        idx = table.last_state_idx
        if idx is not None and idx < cdiv(num_computed, spec.block_size) - 1 and ids[idx]:
            freed.append(ids[idx])
            ids[idx] = 0
        return freed


#: Spec kind -> reservation rule. A new kind is one class and one entry here.
RULES: dict[str, ReservationRule] = {
    "full_attention": TokenRangeRule(),
    "mla_attention": TokenRangeRule(),
    "sliding_window": SlidingWindowRule(),
    "chunked_local_attention": ChunkedLocalRule(),
    "encoder_only_attention": RunnerOnlyRule(),
    "circular_buffer": CircularBufferRule(),
    "cross_attention": CrossAttentionRule(),
    "mamba": MambaRule(),
}


def reserved_blocks(num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
    """Blocks the scheduler holds in ``spec``'s group for a request of
    ``num_tokens`` tokens (computed + scheduled).

    Agrees with ``vllm.v1.worker.gpu.warmup._reserved_block_count`` except
    for encoder-only groups (0 here: the scheduler holds none; vLLM's warmup
    never sees such a group in its config) and that cross-attention reads
    ``ctx.max_encoder_len`` as the request's encoder length.

    Raises:
        KeyError: no rule for ``spec.kind``.
    """
    return RULES[spec.kind].blocks(num_tokens, spec, ctx)


def reserved_blocks_per_group(
    num_tokens: int, specs: tuple[CacheSpec, ...], ctx: ReservationContext
) -> tuple[int, ...]:
    """:func:`reserved_blocks` for every group, in group order."""
    return tuple(reserved_blocks(num_tokens, s, ctx) for s in specs)


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


@functools.cache
def _no_ids(num_groups: int) -> tuple[tuple[()], ...]:
    """``((),) * num_groups``, one object per group count: a row that takes no
    block shares it, so the collector can untrack the row's tuples (a tuple
    that holds a tuple still tracked stays tracked; the table of a step's
    ledger call would be, were it built per call)."""
    return ((),) * num_groups


def _window_block_mask(spec: CacheSpec, alignment: int, start: int, end: int) -> list[bool] | None:
    """``SlidingWindowManager.reachable_block_mask`` (dense retention, no
    EAGLE): which of blocks ``start..end-1`` a sliding-window group caches
    (None: all). A hit at an aligned boundary reads the last
    ``cdiv(sliding_window - 1, block_size)`` blocks before it."""
    if spec.kind != "sliding_window" or alignment % spec.block_size:
        return None
    need = cdiv(spec.sliding_window - 1, spec.block_size)
    per_segment = alignment // spec.block_size
    if need >= per_segment:
        return None
    return [i % per_segment >= per_segment - need for i in range(start, end)]


class OutOfBlocksError(RuntimeError):
    """The ledger's pool cannot hold what a step asks for."""


class MambaStateBusyError(OutOfBlocksError):
    """A request's prefix hit ends on a Mamba state another request cached in
    the same step: ``MambaManager.get_num_blocks_to_allocate`` answers "more
    than the pool holds", so vLLM's scheduler leaves the request waiting for
    the next step. ``req_id`` is that request."""

    def __init__(self, message: str, req_id: str):
        super().__init__(message)
        self.req_id = req_id


#: Kinds whose managers keep no prefix-cache entries (and get no hit).
_NOT_CACHED = ("circular_buffer", "cross_attention", "encoder_only_attention")


class Growth(NamedTuple):
    """What one :meth:`BlockLedger.grow` did, per group (a named tuple: one
    is built per scheduled request, so it must cost what a tuple costs)."""

    #: Ids appended to the request's block table (the scheduler's
    #: ``new_block_ids``; may hold null placeholders, 0).
    appended: tuple[tuple[int, ...], ...]
    #: Ids taken from the pool (what ``new_block_ids_to_zero`` draws on).
    taken: tuple[tuple[int, ...], ...]
    #: The request's block table length per group after it (null
    #: placeholders included; :meth:`BlockLedger.held_counts`).
    held: tuple[int, ...] = ()


class StepAllocation(NamedTuple):
    """One scheduled request's allocation in :meth:`BlockLedger.allocate_step`
    (the arguments of one ``KVCacheManager.allocate_slots`` call; a named
    tuple, built once per scheduled request)."""

    req_id: str
    #: Computed + scheduled tokens after the step.
    num_tokens: int
    #: Tokens computed before the step.
    num_computed: int
    #: Tokens whose full blocks become prefix-cache entries
    #: (``min(computed + scheduled, num_tokens)``: never unverified drafts).
    num_cached_tokens: int
    prompt_len: int
    encoder_len: int | None = None
    #: The request's tokens (prompt + sampled) when the step is scheduled
    #: (``Request.num_tokens``): with hash lookahead, a block is hashed, and
    #: so cached, only once the tokens after it exist. None: not limited.
    num_request_tokens: int | None = None


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


@dataclass
class BlockLedger:
    """Block tables per request per group from one shared pool, as the
    scheduler's ``KVCacheManager`` builds them.

    Block 0 is vLLM's null block: never handed out, and the placeholder the
    managers put where a request no longer needs a block (out of a sliding
    window or local chunk, Mamba states behind the last one). Such blocks go
    back to the pool when they fall out. The pool reuses ids in the order of
    vLLM's ``FreeKVCacheBlockQueue``: blocks freed without a prefix-cache
    entry first (last freed first, ``prepend_n``), then never used ids, then
    blocks freed with a cache entry (oldest first, ``append_n``); on vLLM 0.27
    with caching off every freed block goes to the tail
    (``uncached_frees_append``).

    A prefix-cache hit (:meth:`hit`) puts the cached blocks of an earlier
    request's prompt into the new request's table (shared, with a reference
    count), with null placeholders where the group's manager skips them.

    Args:
        specs: one spec per KV cache group.
        num_blocks: ``KVCacheConfig.num_blocks``.
        ctx: lookahead, ``max_model_len``, encoder length.
        enable_caching: prefix caching (full prompt blocks are kept as cache
            entries after their request frees them, until reused).
    """

    specs: tuple[CacheSpec, ...]
    num_blocks: int
    ctx: ReservationContext = field(default_factory=ReservationContext)
    enable_caching: bool = False
    #: Tokens (:func:`prefix_cache_alignment`); None: from the groups.
    cache_alignment: int | None = None
    #: The drafter's prefix-caching rules (:class:`DrafterCaching`).
    drafter: DrafterCaching = field(default_factory=DrafterCaching)
    #: With caching off, freed blocks go to the queue's tail (vLLM 0.27's
    #: ``free_blocks``), not its head (:attr:`RunnerProfile.uncached_frees_append`).
    uncached_frees_append: bool = False
    _tables: dict[str, list[GroupTable]] = field(default_factory=dict, repr=False)
    #: Free queue: _front (deque head first), then ids _next.. never handed
    #: out, then _tail (insertion order). The never-used range is not
    #: materialized: GPU runners have hundreds of thousands of blocks.
    _next: int = field(default=1, repr=False)
    _front: deque = field(default_factory=deque, repr=False)
    _tail: dict[int, None] = field(default_factory=dict, repr=False)
    #: Reference counts of held ids (a prefix hit shares blocks).
    _ref: dict[int, int] = field(default_factory=dict, repr=False)
    #: Prefix cache (``BlockHashToBlockMap``): (group, block index of the
    #: shared prompt) -> the ids cached for it, oldest first (a hit takes the
    #: first); a block holding sampled tokens has a key of its own that no
    #: hit looks up. And back: id -> key.
    _cache: dict[tuple, dict[int, None]] = field(default_factory=dict, repr=False)
    _cached: dict[int, tuple] = field(default_factory=dict, repr=False)
    #: req_id -> the request's context (its own encoder length).
    _ctx: dict[str, ReservationContext] = field(default_factory=dict, repr=False)
    #: req_id -> per group, prompt blocks already recorded by cache_prompt.
    _num_cached: dict[str, list[int]] = field(default_factory=dict, repr=False)
    #: Mamba positions (group, block index) a request cached in this step
    #: (``MambaManager.cached_blocks_this_step``).
    _cached_this_step: set[tuple[int, int]] = field(default_factory=set, repr=False)
    #: req_id -> the Mamba hit positions its first allocation must not find
    #: in _cached_this_step.
    _pending_hit: dict[str, list[tuple[int, int]]] = field(default_factory=dict, repr=False)
    #: Tokens per prompt hash (:func:`prefix_hash_block_size`), from the groups.
    _hash_block_size: int = field(default=1, init=False, repr=False)
    _rules: list = field(default_factory=list, init=False, repr=False)
    #: Every group is full or MLA attention with the plain token-range rule
    #: (:meth:`_allocate_token_range`'s fast path applies).
    _token_range: bool = field(default=False, init=False, repr=False)
    #: encoder_len -> the request context for it (built once, not per row).
    _ctx_by_len: dict[int, ReservationContext] = field(default_factory=dict, init=False,
                                                       repr=False)
    #: Token-range ledgers: req_id -> (the most tokens its tables cover
    #: without growing, the fewest cached tokens that make a new cache entry,
    #: the Growth of a step that does neither). A request's entry is dropped
    #: by anything else that changes its tables or cache entries.
    _quick: dict[str, tuple[int, int, Growth]] = field(default_factory=dict, init=False,
                                                       repr=False)
    #: One-group token-range ledgers: table length -> the Growth of a row
    #: that takes no block with that many (one object, shared by every such
    #: row and quick entry: a named tuple is never untracked by the collector).
    _idle: dict[int, Growth] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.cache_alignment is None:
            self.cache_alignment = prefix_cache_alignment(self.specs, self.enable_caching)
        self._hash_block_size = prefix_hash_block_size(self.specs, self.enable_caching)
        #: The rule of each group (``RULES`` looked up once).
        self._rules = [RULES[spec.kind] for spec in self.specs]
        # (a drafter's caching rules are cache_prompt's alone: not on the fast path)
        self._token_range = all(type(r) is TokenRangeRule for r in self._rules) and \
            self.drafter == DrafterCaching()

    def new_step(self) -> None:
        """``KVCacheManager.new_step_starts``: a new step begins (Mamba
        forgets which states were cached in the last one)."""
        self._cached_this_step.clear()

    @classmethod
    def for_profile(cls, profile: RunnerProfile) -> BlockLedger:
        """A ledger over a runner profile's groups and ``num_blocks``."""
        return cls(profile.kv_cache_groups, profile.num_blocks, ReservationContext.of(profile),
                   enable_caching=profile.enable_prefix_caching,
                   drafter=DrafterCaching.of(profile),
                   uncached_frees_append=profile.uncached_frees_append)

    # -- a step's transaction ---------------------------------------------------
    def allocate_step(self, free: tuple[str, ...], rows: list[StepAllocation], *,
                      wait_for_mamba: bool = False) -> list[Growth | None]:
        """One step's block work, all or nothing: :meth:`new_step`, then the
        finished and preempted requests ``free`` (same step), then per row
        :meth:`grow` and :meth:`cache_prompt`, as the scheduler calls
        ``allocate_slots`` request by request.

        vLLM's scheduler never undoes an allocation (a request that does not
        fit waits, and the ones before it keep their blocks); stepwarm refuses
        a step whole, so a refused step leaves the ledger as it was. When the
        pool holds every row's blocks before anything is freed and no row
        waits on a Mamba hit (:meth:`_fits`), nothing can be refused and no
        state is saved; otherwise :meth:`_save` copies the containers once
        (no deep copy of the ledger).

        Args:
            wait_for_mamba: a row whose prefix hit ends on a Mamba state
                another row cached in this step is left out (its entry is
                None; it holds what it held) instead of refused, as vLLM's
                scheduler leaves it waiting.

        Returns:
            The :class:`Growth` of each row, in order (None: left waiting).

        Raises:
            OutOfBlocksError: a row needs more blocks than free (or
                :class:`MambaStateBusyError`); the ledger is unchanged.
        """
        if self._token_range:
            fast = self._allocate_token_range(free, rows)
            if fast is not None:
                return fast
        saved = None if self._fits(rows) else self._save()
        self.new_step()
        try:
            self.free_each(free)
            out: list[Growth | None] = []
            for r in rows:
                if wait_for_mamba and self.mamba_state_busy(r.req_id):
                    out.append(None)
                    continue
                out.append(self.grow(r.req_id, r.num_tokens, encoder_len=r.encoder_len,
                                     num_computed=r.num_computed))
                self.cache_prompt(r.req_id, r.num_cached_tokens, r.prompt_len,
                                  num_request_tokens=r.num_request_tokens)
        except OutOfBlocksError:
            if saved is None:  # pragma: no cover - _fits is conservative
                raise AssertionError("BlockLedger._fits admitted a step that does not fit") from None
            self._restore(saved)
            raise
        return out

    def quick_entries(self) -> dict[str, tuple[int, int, Growth]] | None:
        """The quick entries of a token-range ledger (:attr:`_quick`, read
        only), for a caller that answers unchanged rows itself and passes
        :meth:`allocate_step` only the others: a row whose entry
        ``(most, threshold, growth)`` has ``num_tokens <= most`` and
        ``num_cached_tokens < threshold`` grows no table and caches no block
        (its :class:`Growth` is ``growth``), so leaving it out changes
        nothing, as :meth:`_allocate_token_range` skips it. None when the
        ledger is not token-range (every row goes to :meth:`allocate_step`)."""
        return self._quick if self._token_range else None

    def _allocate_token_range(self, free: tuple[str, ...],
                              rows: list[StepAllocation]) -> list[Growth | None] | None:
        """:meth:`allocate_step` when every group is full or MLA attention
        (``FullAttentionManager``: nothing skipped, no Mamba state), in one
        pass per row and no call per group: the same ids, tables and cache
        entries as :meth:`grow` then :meth:`cache_prompt` per row.

        A row whose quick entry (:attr:`_quick`) says that no group grows and
        no block becomes a cache entry changes nothing: its :class:`Growth`
        is the entry's, and only the other rows are walked (in order, so the
        pool hands out the same ids). Rows are distinct requests.

        Returns:
            None, changing nothing, when the pool does not surely hold every
            row's new blocks before this step frees any (the caller's saved
            path then decides, all or nothing).
        """
        quick = self._quick
        qs = [quick.get(r[0]) for r in rows]
        slow = [i for i, q in enumerate(qs)
                if q is None or rows[i][1] > q[0] or rows[i][3] >= q[1]]
        # quick rows need no block: the need of the others is the step's
        slow_rows = rows if len(slow) == len(rows) else [rows[i] for i in slow]
        free_now = self.num_free
        if self._token_range_bound(slow_rows) > free_now and \
                self._token_range_need(slow_rows) > free_now:
            return None
        self._cached_this_step.clear()
        if free:
            self.free_each(free)
            qs = [quick.get(r[0]) for r in rows]  # a freed request starts again
            slow = [i for i, q in enumerate(qs)
                    if q is None or rows[i][1] > q[0] or rows[i][3] >= q[1]]
        out: list[Growth | None] = [None if q is None else q[2] for q in qs]
        if not slow:
            return out
        tables = self._tables
        bss = self._block_sizes()
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        ctxs, pending, take = self._ctx, self._pending_hit, self._take
        caching, align, done_by_req = self.enable_caching, self.cache_alignment or 1, \
            self._num_cached
        by_len = self._ctx_by_len
        by_len.setdefault(self.ctx.max_encoder_len, self.ctx)  # as _request_ctx answers
        num_groups = len(bss)
        bs0 = bss[0]
        idles = self._idle
        empty = _no_ids(num_groups)
        new = tuple.__new__
        never = 1 << 62
        # One group: ids off the never-used range are taken here (as _take
        # does), their references added after the loop, ids start..nxt-1.
        front, num_blocks = self._front, self.num_blocks
        start = nxt = self._next
        for i in slow:
            rid, num_tokens, _, num_cached_tokens, prompt_len, encoder_len, _n = rows[i]
            if encoder_len is not None:  # as _ctx_for: the context of this encoder length
                ctx = by_len.get(encoder_len)
                ctxs[rid] = self._request_ctx(encoder_len) if ctx is None else ctx
            elif rid not in ctxs:
                ctxs[rid] = self.ctx
            if pending:
                pending.pop(rid, None)  # no Mamba group: never a stale hit
            covered = num_tokens + la
            if covered > mml:
                covered = mml
            t = tables.get(rid)
            if num_groups == 1:  # the same as the loops below, for one group
                if t is None:
                    ids: list[int] = []
                    tables[rid] = [GroupTable(ids, False, None, 0)]
                    have = 0
                else:
                    ids = t[0].ids
                    have = len(ids)
                k = -(-covered // bs0) - have
                if k > 0:
                    if not front and nxt + k <= num_blocks:
                        got = (nxt,) if k == 1 else tuple(range(nxt, nxt + k))
                        nxt += k
                    else:  # the free queue's head first: _take, after the ids so far
                        self._ref.update(dict.fromkeys(range(start, nxt), 1))
                        self._next = nxt
                        got = take(k)
                        start = nxt = self._next
                    ids += got
                    have += k
                    idle = idles.get(have)
                    if idle is None:
                        idle = idles[have] = new(Growth, (empty, empty, (have,)))
                    grown: tuple[tuple[int, ...], ...] = (got,)
                    out[i] = new(Growth, (grown, grown, idle[2]))
                else:
                    idle = idles.get(have)
                    if idle is None:
                        idle = idles[have] = new(Growth, (empty, empty, (have,)))
                    out[i] = idle
                threshold = never
                if caching:
                    done = done_by_req.get(rid)
                    if done is None:
                        done = done_by_req[rid] = [0]
                    d0 = done[0]
                    full = num_cached_tokens // align * align // bs0
                    if full > have:
                        full = have
                    if full > d0:
                        self._cache_blocks(0, bs0, ids, d0, full, prompt_len, rid)
                        done[0] = d0 = full
                    if have > d0:
                        threshold = (d0 + 1) * bs0
                cover = have * bs0
                quick[rid] = (never if mml <= cover else cover - la, threshold, idle)
                continue
            if t is None:
                t = tables[rid] = [GroupTable([], False, None, 0) for _ in bss]
            out[i] = self._token_range_groups(rid, t, covered, num_cached_tokens, prompt_len)
        if nxt != start:
            self._ref.update(dict.fromkeys(range(start, nxt), 1))
            self._next = nxt
        return out

    def _token_range_bound(self, rows: list[StepAllocation]) -> int:
        """At least :meth:`_token_range_need` of ``rows``, without reading a
        table: a row takes at most ``cdiv(tokens + lookahead, block_size)``
        blocks per group, and the rows' floors sum to at most the floor of
        their sum. On a pool far larger than the step (a GPU's), this
        answers for the walk over the rows.

        Example (one group of 16-token blocks, no lookahead): 1,024 rows of
        17 tokens take at most 17,408 // 16 + 1,024 = 2,112 blocks (in fact
        1,024 or 2,048, by what they hold)."""
        n = len(rows)
        tokens = sum(map(itemgetter(1), rows)) + n * self.ctx.num_lookahead_tokens
        return sum(tokens // bs + n for bs in self._block_sizes())

    def _token_range_need(self, rows: list[StepAllocation]) -> int:
        """The new blocks ``rows`` take in every group together (the
        token-range rule: ``cdiv(min(tokens + lookahead, max_model_len),
        block_size)`` less what each table holds)."""
        tables, bss = self._tables, self._block_sizes()
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        need = 0
        if len(bss) == 1:  # the same as the loop below, for one group
            bs = bss[0]
            for r in rows:
                covered = r[1] + la
                t = tables.get(r[0])
                k = -(-(covered if covered < mml else mml) // bs)
                if t is not None:
                    k -= len(t[0].ids)
                if k > 0:
                    need += k
            return need
        for r in rows:
            covered = min(r[1] + la, mml)
            t = tables.get(r[0])
            if t is None:
                for bs in bss:
                    need += -(-covered // bs)
            else:
                for bs, gt in zip(bss, t):
                    k = -(-covered // bs) - len(gt.ids)
                    if k > 0:
                        need += k
        return need

    def _token_range_groups(self, rid: str, t: list[GroupTable], covered: int,
                            num_cached_tokens: int, prompt_len: int) -> Growth:
        """One row of :meth:`_allocate_token_range` over several groups: each
        table grown to ``covered`` tokens, its full blocks within
        ``num_cached_tokens`` cached, the row's quick entry renewed."""
        bss = self._block_sizes()
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        num_groups, never, new = len(bss), 1 << 62, tuple.__new__
        empty = _no_ids(num_groups)
        appended: list[tuple[int, ...]] | None = None
        for g, (bs, gt) in enumerate(zip(bss, t)):
            k = -(-covered // bs) - len(gt.ids)
            if k > 0:
                if appended is None:
                    appended = [()] * num_groups
                got = self._take(k)
                gt.ids.extend(got)
                appended[g] = got
        counts = tuple([len(gt.ids) for gt in t])
        idle = new(Growth, (empty, empty, counts))
        grown = idle if appended is None else new(Growth, (tuple(appended), tuple(appended),
                                                          counts))
        threshold = never
        if self.enable_caching:
            done = self._num_cached.get(rid)
            if done is None:
                done = self._num_cached[rid] = [0] * num_groups
            align = self.cache_alignment or 1
            cacheable = num_cached_tokens // align * align
            for g, (bs, gt) in enumerate(zip(bss, t)):
                full = min(cacheable // bs, len(gt.ids))
                if full > done[g]:
                    self._cache_blocks(g, bs, gt.ids, done[g], full, prompt_len, rid)
                    done[g] = full
                if len(gt.ids) > done[g]:
                    threshold = min(threshold, (done[g] + 1) * bs)
        # covered <= L * bs in every group: nothing to allocate (min of
        # the lookahead-extended tokens and max_model_len)
        cover = min((len(gt.ids) * bs for bs, gt in zip(bss, t)), default=never)
        self._quick[rid] = (never if mml <= cover else cover - la, threshold, idle)
        return grown

    def _block_sizes(self) -> tuple[int, ...]:
        return tuple(s.block_size for s in self.specs)

    def _cache_blocks(self, g: int, block_size: int, ids: list[int], start: int, end: int,
                      prompt_len: int, req_id: str) -> None:
        """Blocks ``start..end-1`` of a full-attention group's table become
        cache entries (:meth:`cache_prompt`'s loop for such a group)."""
        cache, cached = self._cache, self._cached
        for i in range(start, end):
            block = ids[i]
            if not block or block in cached:
                continue
            key = (g, i) if (i + 1) * block_size <= prompt_len else (g, i, req_id)
            cache.setdefault(key, {})[block] = None
            cached[block] = key

    def _fits(self, rows: list[StepAllocation]) -> bool:
        """Whether every row's :meth:`grow` surely succeeds: the blocks they
        need together are free before this step frees any, no row has a
        pending Mamba hit, and no group is in Mamba ``align`` mode (whose
        allocation depends on the table's state, so it is left to the saved
        path). Rows are distinct requests, so one row's need does not depend
        on another's growth."""
        if self._pending_hit and any(r.req_id in self._pending_hit for r in rows):
            return False
        if any(s.kind == "mamba" and s.mamba_cache_mode == "align" for s in self.specs):
            return False
        need = 0
        free = self.num_free
        for r in rows:
            tables = self._tables.get(r.req_id) or [GroupTable() for _ in self.specs]
            ctx = self._ctx_for(r.req_id, r.encoder_len)
            need += sum(rule.to_allocate(t, r.num_tokens, spec, ctx)
                        for rule, spec, t in zip(self._rules, self.specs, tables))
            if need > free:
                return False
        return True

    def _save(self) -> tuple:
        """The ledger's mutable state, copied one level down (tables, the
        cache's id sets and cached counts copied; ids and keys are
        immutable): what :meth:`_restore` puts back."""
        return (
            self._next, self._front.copy(), self._tail.copy(), self._ref.copy(),
            {k: v.copy() for k, v in self._cache.items()}, self._cached.copy(),
            {rid: [t.copy() for t in ts] for rid, ts in self._tables.items()},
            self._ctx.copy(), {rid: list(n) for rid, n in self._num_cached.items()},
            self._cached_this_step.copy(), self._pending_hit.copy(),
        )

    def snapshot(self) -> tuple:
        """The ledger's state, for :meth:`restore` (a planner step that takes
        a resumed request's hit before it may be refused)."""
        return self._save()

    def restore(self, saved: tuple) -> None:
        """Put back a :meth:`snapshot`."""
        self._restore(saved)

    def _restore(self, saved: tuple) -> None:
        (self._next, self._front, self._tail, self._ref, self._cache, self._cached,
         self._tables, self._ctx, self._num_cached, self._cached_this_step,
         self._pending_hit) = saved
        self._quick.clear()

    # -- pool ------------------------------------------------------------------
    def _take(self, n: int) -> tuple[int, ...]:
        """``BlockPool.get_new_blocks``: pop ``n`` ids off the free queue's
        head (evicting any cache entry they had)."""
        start = self._next
        if not self._front and start + n <= self.num_blocks:
            # only never-used ids: no reference, no cache entry to evict
            self._next = start + n
            if n == 1:  # a decode's or a short prompt's one block
                self._ref[start] = 1
                return (start,)
            got = tuple(range(start, start + n))
            self._ref.update(dict.fromkeys(got, 1))
            return got
        out = []
        for _ in range(n):
            if self._front:
                i = self._front.popleft()
            elif self._next < self.num_blocks:
                i, self._next = self._next, self._next + 1
            else:
                i = next(iter(self._tail))
                del self._tail[i]
            key = self._cached.pop(i, None)
            if key is not None:  # BlockPool._maybe_evict_cached_block
                del self._cache[key][i]
                if not self._cache[key]:
                    del self._cache[key]
            self._ref[i] = 1
            out.append(i)
        return tuple(out)

    def _release(self, ids) -> None:
        """``BlockPool.free_blocks(ids)`` (ids in eviction order): drop one
        reference each; ids no longer held go back to the queue."""
        front = []
        for i in ids:
            if i == 0:
                continue
            self._ref[i] -= 1
            if self._ref[i]:
                continue
            del self._ref[i]
            if i in self._cached or (self.uncached_frees_append and not self.enable_caching):
                self._tail[i] = None
            else:
                front.append(i)
        self._front.extendleft(reversed(front))

    def _touch(self, i: int) -> None:
        """``BlockPool.touch``: a cache hit takes a reference (and out of the
        free queue if nobody held it)."""
        if i in self._ref:
            self._ref[i] += 1
            return
        self._tail.pop(i, None)
        if i in self._front:
            self._front.remove(i)
        self._ref[i] = 1

    @property
    def num_free(self) -> int:
        """Blocks left in the pool (0 when the runner has no usable block)."""
        return max(0, self.num_blocks - self._next) + len(self._front) + len(self._tail)

    @property
    def num_held(self) -> int:
        """Distinct blocks held by live requests, all groups together."""
        return len(self._ref)

    # -- requests ------------------------------------------------------------------
    def held(self, req_id: str) -> tuple[tuple[int, ...], ...]:
        """``req_id``'s block table per group (0: null placeholder).

        Raises:
            KeyError: ``req_id`` holds nothing in this ledger.
        """
        return tuple([tuple(t.ids) for t in self._tables[req_id]])

    def held_counts(self, req_id: str) -> tuple[int, ...]:
        """Block table length per group (null placeholders included)."""
        return tuple([len(t.ids) for t in self._tables[req_id]])

    def required(self, num_tokens: int, encoder_len: int | None = None) -> tuple[int, ...]:
        """Blocks per group a request of ``num_tokens`` tokens holds
        (``encoder_len``: its encoder input tokens; None: ``ctx.max_encoder_len``)."""
        return reserved_blocks_per_group(num_tokens, self.specs, self._request_ctx(encoder_len))

    def _request_ctx(self, encoder_len: int | None) -> ReservationContext:
        if encoder_len is None or encoder_len == self.ctx.max_encoder_len:
            return self.ctx
        ctx = self._ctx_by_len.get(encoder_len)
        if ctx is None:
            ctx = self._ctx_by_len[encoder_len] = replace(self.ctx, max_encoder_len=encoder_len)
        return ctx

    def _stale_hit(self, req_id: str) -> list[tuple[int, int]]:
        """Mamba positions of ``req_id``'s pending hit cached in this step."""
        return [key for key in self._pending_hit.get(req_id, ()) if key in self._cached_this_step]

    def mamba_state_busy(self, req_id: str) -> bool:
        """Whether ``MambaManager.get_num_blocks_to_allocate`` refuses
        ``req_id`` now: its prefix hit ends on a Mamba state another request
        cached in this same step (vLLM's scheduler leaves it waiting)."""
        return bool(self._stale_hit(req_id))

    def _ctx_for(self, req_id: str, encoder_len: int | None) -> ReservationContext:
        """The context :meth:`grow` uses for ``req_id``: the remembered one
        when ``encoder_len`` is None, else one for that encoder length."""
        ctx = self._ctx.get(req_id) if encoder_len is None else None
        return self._request_ctx(encoder_len) if ctx is None else ctx

    def _refuse(self, req_id: str, need: int, num_tokens: int) -> OutOfBlocksError:
        if self.num_blocks <= 1:
            return OutOfBlocksError(
                f"request {req_id!r} needs {need} block(s) for {num_tokens} "
                f"tokens but the runner has no usable KV cache block (num_blocks "
                f"{self.num_blocks}; block 0 is the null block)")
        return OutOfBlocksError(
            f"request {req_id!r} needs {need} more block(s) for "
            f"{num_tokens} tokens but only {self.num_free} of "
            f"{self.num_blocks - 1} are free")

    def grow(
        self, req_id: str, num_tokens: int, encoder_len: int | None = None,
        num_computed: int = 0,
    ) -> Growth:
        """Bring ``req_id`` to ``num_tokens`` tokens (computed + scheduled),
        as ``KVCacheManager.allocate_slots`` does: first blocks of tokens
        before ``num_computed`` that the group no longer needs become null
        and go back to the pool (``remove_skipped_blocks``), then the pool
        must hold what every group still needs, then each group grows.

        A request the ledger does not know is admitted. Tables never shrink.
        With prefix caching, full blocks of the prompt computed by the end of
        the step become cache entries (an approximation of
        ``cache_blocks``: prompt blocks only).

        Args:
            encoder_len: the request's encoder input tokens (cross-attention
                groups hold ``cdiv(encoder_len, block_size)``), remembered
                from the request's first ``grow`` until it is freed. None:
                the remembered value, else ``ctx.max_encoder_len``.
            num_computed: tokens already computed before this step.

        Returns:
            The ids appended per group (``NewRequestData.block_ids`` is the
            whole table for a new request; ``CachedRequestData.new_block_ids``
            these for a running one) and the ids taken from the pool.

        Raises:
            OutOfBlocksError: the pool has fewer free blocks than needed. The
                blocks freed by the first stage stay freed, as in vLLM.
        """
        self._quick.pop(req_id, None)
        tables = self._tables.get(req_id) or [GroupTable() for _ in self.specs]
        ctx = self._ctx_for(req_id, encoder_len)
        stale = self._stale_hit(req_id)
        if stale:
            # MambaManager.get_num_blocks_to_allocate: a hit whose last state
            # another request cached in this same step cannot be allocated.
            raise MambaStateBusyError(
                f"request {req_id!r}: its prefix hit ends on a Mamba state cached in "
                f"this same step (group {stale[0][0]}); vLLM's MambaManager refuses it",
                req_id)
        rules = self._rules
        for rule, spec, table in zip(rules, self.specs, tables):
            freed = rule.remove_skipped(table, num_computed, spec)
            if freed:
                self._release(freed)
        need = sum(rule.to_allocate(t, num_tokens, spec, ctx)
                   for rule, spec, t in zip(rules, self.specs, tables))
        if need > self.num_free:
            if req_id in self._tables:
                self._tables[req_id] = tables
            raise self._refuse(req_id, need, num_tokens)
        appended, taken = [], []
        for rule, spec, table in zip(rules, self.specs, tables):
            a, t = rule.allocate(table, num_tokens, spec, ctx, self._take)
            appended.append(tuple(a))
            taken.append(tuple(t))
        self._tables[req_id] = tables
        self._ctx[req_id] = ctx
        self._pending_hit.pop(req_id, None)
        return Growth(tuple(appended), tuple(taken), tuple([len(t.ids) for t in tables]))

    def cache_prompt(self, req_id: str, num_tokens: int, prompt_len: int | None = None, *,
                     num_request_tokens: int | None = None) -> None:
        """Record ``req_id``'s full blocks within its first ``num_tokens``
        tokens (computed + scheduled, capped at the request's tokens as
        ``allocate_slots`` caps them) as prefix-cache entries, as
        ``KVCacheCoordinator.cache_blocks`` does (no-op without caching):
        rounded down to :attr:`cache_alignment`, null blocks and the blocks
        a sliding window never reads left out. Every stepwarm prompt is the
        same token sequence, so block ``i`` of one request's prompt is block
        ``i`` of any other's (several ids may be cached for it); a block past
        ``prompt_len`` holds sampled tokens no prompt has, so its entry is
        the request's own (it is evicted like any other, never hit).

        With a drafter (:attr:`drafter`): the re-prefillable tail is not
        cached; with hash lookahead, blocks are cached once the tokens after
        them exist (``num_request_tokens``) and a prompt block whose hash
        reads sampled tokens is the request's own; an EAGLE group beside
        others caches one block past the alignment."""
        if not self.enable_caching or req_id not in self._tables:
            return
        self._quick.pop(req_id, None)
        d = self.drafter
        computed = num_tokens
        finalized = max(0, computed - d.reprefill_tokens)
        hybrid = sum(s.kind != "encoder_only_attention" for s in self.specs) > 1
        align = self.cache_alignment
        aligned = computed // align * align
        if not hybrid:  # UnitaryKVCacheCoordinator: the finalized tokens
            aligned = finalized // align * align
        prompt_len = aligned if prompt_len is None else prompt_len
        done = self._num_cached.setdefault(req_id, [0] * len(self.specs))
        for g, (spec, table) in enumerate(zip(self.specs, self._tables[req_id])):
            if spec.kind in _NOT_CACHED:
                continue
            num_tokens = aligned
            if hybrid and g in d.eagle_groups and aligned > 0:
                # EAGLE matches one block past the aligned boundary, then drops it.
                num_tokens = min(finalized, finalized // align * align + spec.block_size)
            full = min(num_tokens // spec.block_size, len(table.ids))
            if d.hash_lookahead_tokens and num_request_tokens is not None:
                hbs = self._hash_block_size
                hashed = max(0, num_request_tokens - d.hash_lookahead_tokens) // hbs * hbs
                full = min(full, hashed // spec.block_size)
            if spec.kind == "mamba" and spec.mamba_cache_mode == "align" and spec.checkpoint_recached:
                # MambaManager._cache_partial_tail_block (vLLM 0.32): the state
                # at the prompt's checkpoint is re-registered, and so marked
                # cached in this step, whenever the cacheable prefix ends there.
                hbs = self._hash_block_size
                checkpoint = (prompt_len - 1) // hbs * hbs
                i = checkpoint // spec.block_size - 1
                if (checkpoint and num_tokens == checkpoint and checkpoint % spec.block_size == 0
                        and i < len(table.ids) and table.ids[i]):
                    self._cached_this_step.add((g, i))
            if full <= done[g]:
                continue
            if spec.kind == "mamba":  # every cache mode (MambaManager.cache_blocks)
                self._cached_this_step.update(
                    (g, i) for i in range(done[g], min(full, prompt_len // spec.block_size))
                    if table.ids[i])
            mask = _window_block_mask(spec, self.cache_alignment, done[g], full)
            for i in range(done[g], full):
                block = table.ids[i]
                if not block or block in self._cached or (mask and not mask[i - done[g]]):
                    continue
                shared = (i + 1) * spec.block_size + d.hash_lookahead_tokens <= prompt_len
                key = (g, i) if shared else (g, i, req_id)
                self._cache.setdefault(key, {})[block] = None
                self._cached[block] = key
            done[g] = full

    @property
    def looks_up_resumed(self) -> bool:
        """Whether :meth:`lookup` finds hits here: prefix caching on, every
        cached group full or MLA attention, no drafter."""
        return self.enable_caching and self.drafter == DrafterCaching() and all(
            s.kind in _NOT_CACHED or s.kind in ("full_attention", "mla_attention")
            for s in self.specs)

    def lookup(self, req_id: str, prompt_len: int, num_tokens: int) -> int:
        """Tokens of the longest prefix-cache hit of a request holding no
        block, ``prompt_len`` prompt tokens and ``num_tokens`` in all (a
        resumed request: prompt + outputs), as ``KVCacheManager.get_computed_blocks``
        finds it for a waiting request with no computed token: at most
        ``num_tokens - 1`` tokens; per group the cached blocks from the
        first on, shared prompt entries and past the prompt the request's own
        (those holding its sampled tokens); the shortest over the groups,
        rounded down to :attr:`cache_alignment`.

        Only where every cached group is full or MLA attention and there is
        no drafter: 0 elsewhere (stepwarm does not re-derive
        ``find_longest_cache_hit`` of sliding window and Mamba managers, nor
        EAGLE's dropped block).

        Example (one group, 16-token blocks): a 150-token prompt preempted
        after 4 sampled tokens, its first block still cached and its second
        reused: ``lookup`` is 16 (the request recomputes 138 tokens).
        """
        if not self.looks_up_resumed or req_id in self._tables:
            return 0
        hits = []
        for g, spec in enumerate(self.specs):
            if spec.kind in _NOT_CACHED:
                continue
            bs = spec.block_size
            i = 0
            while i < (num_tokens - 1) // bs:
                key = (g, i) if (i + 1) * bs <= prompt_len else (g, i, req_id)
                if not self._cache.get(key):
                    break
                i += 1
            hits.append(i * bs)
        align = self.cache_alignment or 1
        return min(hits, default=0) // align * align

    def hit(self, req_id: str, num_tokens: int, encoder_len: int | None = None,
            prompt_len: int | None = None) -> Growth:
        """Start a new request with a prefix-cache hit of ``num_tokens``
        tokens (a whole number of blocks of every group), as
        ``add_local_computed_blocks`` does after ``find_longest_cache_hit``:
        per group, blocks of tokens the group skips (``get_num_skipped_tokens``
        of the hit) are null placeholders; the others are the cached blocks of
        an earlier request's prompt (shared), or, where nothing is cached,
        blocks taken from the pool that stand for them. No lookahead block:
        blocks past the hit are allocated by the step that schedules the
        request. With ``prompt_len`` (a resumed request, :meth:`lookup`),
        blocks past the prompt's full blocks are the request's own entries.

        Returns:
            The table per group (``appended``) and the ids taken from the
            pool for uncached positions (``taken``; never zeroed by the
            scheduler, which counts them as the hit).

        Raises:
            OutOfBlocksError: uncached positions need more blocks than free.
            ValueError: ``req_id`` already holds blocks.
        """
        if req_id in self._tables:
            raise ValueError(f"request {req_id!r} already holds blocks; a hit starts a new one")
        self._quick.pop(req_id, None)
        plan = []
        for g, spec in enumerate(self.specs):
            rule = RULES[spec.kind]
            n = 0 if spec.kind in _NOT_CACHED else num_tokens // spec.block_size
            skip = min(n, max(0, rule.skipped_tokens(num_tokens, spec)) // spec.block_size)
            own = n if prompt_len is None else prompt_len // spec.block_size
            plan.append([0] * skip + [
                next(iter(self._cache.get((g, i) if i < own else (g, i, req_id), ())), None)
                for i in range(skip, n)])
        missing = sum(i is None for ids in plan for i in ids)
        if missing > self.num_free:
            raise self._refuse(req_id, missing, num_tokens)
        tables, taken = [], []
        for ids in plan:
            for i in ids:
                if i:
                    self._touch(i)
            fresh = iter(self._take(sum(i is None for i in ids)))
            full = [next(fresh) if i is None else i for i in ids]
            taken.append(tuple(i for i, was in zip(full, ids) if was is None))
            tables.append(GroupTable(full))
        self._tables[req_id] = tables
        self._ctx[req_id] = self._request_ctx(encoder_len)
        self._num_cached[req_id] = [len(t.ids) for t in tables]
        self._pending_hit[req_id] = [
            (g, len(t.ids) - 1) for g, (spec, t) in enumerate(zip(self.specs, tables))
            if spec.kind == "mamba" and t.ids]
        return Growth(tuple(tuple(t.ids) for t in tables), tuple(taken))

    def free(self, req_id: str) -> tuple[int, ...]:
        """Return ``req_id``'s blocks to the pool (finish or preemption), group
        by group, each table last block first (``KVCacheManager.free``).

        Returns:
            The ids whose reference this drops (all groups, nulls left out),
            empty if the request held none.
        """
        tables = self._tables.pop(req_id, None) or []
        self._quick.pop(req_id, None)
        self._ctx.pop(req_id, None)
        self._num_cached.pop(req_id, None)
        self._pending_hit.pop(req_id, None)
        dropped: list[int] = []
        for table in tables:
            ids = [i for i in reversed(table.ids) if i]
            self._release(ids)
            dropped.extend(ids)
        return tuple(dropped)

    def free_each(self, req_ids: Iterable[str]) -> None:
        """:meth:`free` of each request in turn (a step's finished and
        preempted ones), in one loop: the same pool and tables after it,
        nothing returned. A cleanup step frees every request of a plan."""
        tables_of, quick, ctx, num_cached, pending = \
            self._tables, self._quick, self._ctx, self._num_cached, self._pending_hit
        ref, cached, tail, queue = self._ref, self._cached, self._tail, self._front
        to_tail = self.uncached_frees_append and not self.enable_caching
        for rid in req_ids:
            tables = tables_of.pop(rid, None)
            quick.pop(rid, None)
            ctx.pop(rid, None)
            num_cached.pop(rid, None)
            if pending:
                pending.pop(rid, None)
            if not tables:
                continue
            for table in tables:  # _release of each table, last block first
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

    def live_requests(self) -> tuple[str, ...]:
        """Requests that hold blocks, in admission order."""
        return tuple(self._tables)
