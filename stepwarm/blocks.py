"""Block reservation: how many KV cache blocks the scheduler holds, and a ledger.

One reservation rule per KV cache spec kind, looked up by ``CacheSpec.kind``
(:data:`RULES`), each mirroring what ``KVCacheManager.allocate_slots``
(``vllm/v1/core/kv_cache_manager.py``) and the matching
``SingleTypeKVCacheManager`` subclass hold for one request, and vLLM's own
``vllm.v1.worker.gpu.warmup._reserved_block_count`` (which differs for
encoder-only groups and requests without encoder input; see
:func:`reserved_blocks`). ``tests/property`` checks every rule against a real
``KVCacheManager`` driven the way the scheduler drives it.

:class:`BlockLedger` hands out block ids the way the scheduler's block pool
does from a warmup's point of view: distinct ids per request per group, from
one shared pool of ``num_blocks`` in which block 0 is the null block.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

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


class ReservationRule(ABC):
    """Blocks one KV cache group holds for a request of ``num_tokens`` tokens."""

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


class TokenRangeRule(ReservationRule):
    """Full, MLA, sliding window and chunked local attention.

    Mirrors ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: the block
    table covers ``min(num_tokens + num_lookahead_tokens, max_model_len)``
    tokens. Sliding window and chunked local managers replace blocks that fell
    out of the window with the null block but keep the table length.
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size)


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
    running-state blocks, in every cache mode. Align mode sizes from the
    uncapped token range without lookahead; none/all modes like attention."""

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        if spec.mamba_cache_mode == "align":
            return cdiv(num_tokens, spec.block_size) + spec.num_speculative_blocks
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size) + spec.num_speculative_blocks


#: Spec kind -> reservation rule. A new kind is one class and one entry here.
RULES: dict[str, ReservationRule] = {
    "full_attention": TokenRangeRule(),
    "mla_attention": TokenRangeRule(),
    "sliding_window": TokenRangeRule(),
    "chunked_local_attention": TokenRangeRule(),
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


class OutOfBlocksError(RuntimeError):
    """The ledger's pool cannot hold what a step asks for."""


@dataclass
class BlockLedger:
    """Distinct block ids per request per group from one shared pool.

    Block 0 is vLLM's null block and is never handed out, so at most
    ``num_blocks - 1`` blocks are held at once. Freed ids go back to the pool
    and are reused lowest-first.

    Args:
        specs: one spec per KV cache group.
        num_blocks: ``KVCacheConfig.num_blocks``.
        ctx: lookahead, ``max_model_len``, encoder length.
    """

    specs: tuple[CacheSpec, ...]
    num_blocks: int
    ctx: ReservationContext = field(default_factory=ReservationContext)
    _held: dict[str, list[list[int]]] = field(default_factory=dict, repr=False)
    #: Ids >= _next were never handed out; _freed is a min-heap of returned
    #: ids (all < _next). The pool is never materialized: GPU runners have
    #: hundreds of thousands of blocks.
    _next: int = field(default=1, repr=False)
    _freed: list[int] = field(default_factory=list, repr=False)
    #: req_id -> the request's context (its own encoder length).
    _ctx: dict[str, ReservationContext] = field(default_factory=dict, repr=False)

    def _take(self) -> int:
        """The lowest free id."""
        if self._freed:
            return heapq.heappop(self._freed)
        self._next += 1
        return self._next - 1

    @classmethod
    def for_profile(cls, profile: RunnerProfile) -> BlockLedger:
        """A ledger over a runner profile's groups and ``num_blocks``."""
        return cls(profile.kv_cache_groups, profile.num_blocks, ReservationContext.of(profile))

    @property
    def num_free(self) -> int:
        """Blocks left in the pool (0 when the runner has no usable block)."""
        return max(0, self.num_blocks - self._next) + len(self._freed)

    @property
    def num_held(self) -> int:
        """Blocks held by live requests, all groups together."""
        return sum(len(ids) for groups in self._held.values() for ids in groups)

    def held(self, req_id: str) -> tuple[tuple[int, ...], ...]:
        """Block ids ``req_id`` holds, per group.

        Raises:
            KeyError: ``req_id`` holds nothing in this ledger.
        """
        return tuple(tuple(ids) for ids in self._held[req_id])

    def held_counts(self, req_id: str) -> tuple[int, ...]:
        """Blocks ``req_id`` holds, per group."""
        return tuple(len(ids) for ids in self._held[req_id])

    def required(self, num_tokens: int, encoder_len: int | None = None) -> tuple[int, ...]:
        """Blocks per group a request of ``num_tokens`` tokens holds
        (``encoder_len``: its encoder input tokens; None: ``ctx.max_encoder_len``)."""
        return reserved_blocks_per_group(num_tokens, self.specs, self._request_ctx(encoder_len))

    def _request_ctx(self, encoder_len: int | None) -> ReservationContext:
        if encoder_len is None or encoder_len == self.ctx.max_encoder_len:
            return self.ctx
        return replace(self.ctx, max_encoder_len=encoder_len)

    def grow(
        self, req_id: str, num_tokens: int, encoder_len: int | None = None
    ) -> tuple[tuple[int, ...], ...]:
        """Bring ``req_id`` to ``num_tokens`` tokens (computed + scheduled).

        A request the ledger does not know is admitted. Block tables never
        shrink: a group whose requirement fell keeps its blocks.

        Args:
            encoder_len: the request's encoder input tokens (cross-attention
                groups hold ``cdiv(encoder_len, block_size)``), remembered
                from the request's first ``grow`` until it is freed. None:
                the remembered value, else ``ctx.max_encoder_len``.

        Returns:
            The newly handed-out block ids per group (empty tuples where a
            group needed none): ``NewRequestData.block_ids`` for a new request,
            ``CachedRequestData.new_block_ids`` for a running one.

        Raises:
            OutOfBlocksError: the pool has fewer free blocks than needed
                (nothing is handed out in that case).
        """
        held = self._held.get(req_id) or [[] for _ in self.specs]
        ctx = self._ctx.get(req_id) if encoder_len is None else None
        if ctx is None:
            ctx = self._request_ctx(encoder_len)
        need = reserved_blocks_per_group(num_tokens, self.specs, ctx)
        deltas = [max(0, n - len(ids)) for n, ids in zip(need, held)]
        if sum(deltas) > self.num_free:
            if self.num_blocks <= 1:
                raise OutOfBlocksError(
                    f"request {req_id!r} needs {sum(deltas)} block(s) for {num_tokens} "
                    f"tokens but the runner has no usable KV cache block (num_blocks "
                    f"{self.num_blocks}; block 0 is the null block)")
            raise OutOfBlocksError(
                f"request {req_id!r} needs {sum(deltas)} more block(s) for "
                f"{num_tokens} tokens but only {self.num_free} of "
                f"{self.num_blocks - 1} are free"
            )
        new = tuple(tuple(self._take() for _ in range(d)) for d in deltas)
        for ids, got in zip(held, new):
            ids.extend(got)
        self._held[req_id] = held
        self._ctx[req_id] = ctx
        return new

    def free(self, req_id: str) -> tuple[int, ...]:
        """Return ``req_id``'s blocks to the pool (finish or preemption).

        Returns:
            The freed ids (all groups), empty if the request held none.
        """
        groups = self._held.pop(req_id, None) or []
        self._ctx.pop(req_id, None)
        freed = tuple(i for ids in groups for i in ids)
        for block_id in freed:
            heapq.heappush(self._freed, block_id)
        return freed

    def live_requests(self) -> tuple[str, ...]:
        """Requests that hold blocks, in admission order."""
        return tuple(self._held)
