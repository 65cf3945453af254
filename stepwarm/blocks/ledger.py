"""The ledger: one request's block tables across every KV cache group, from
one shared pool (vLLM's ``KVCacheManager`` and ``KVCacheCoordinator``,
``kv_cache_manager.py`` / ``kv_cache_coordinator.py``).

Each group's rule (:mod:`~stepwarm.blocks.rules`) says how its table grows
and trims; the pool (:mod:`~stepwarm.blocks.pool`) hands out and takes back
ids; the prefix cache (:mod:`~stepwarm.blocks.prefix_cache`) keeps prompt
blocks for later hits. The ledger calls them in the scheduler's order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from stepwarm.blocks.allocation import Growth, MambaStateBusyError, OutOfBlocksError, StepAllocation
from stepwarm.blocks.full_attention import TokenRangeRule
from stepwarm.blocks.pool import BlockPool
from stepwarm.blocks.prefix_cache import (
    FULL_KINDS,
    NOT_CACHED,
    DrafterCaching,
    PrefixCache,
    prefix_cache_alignment,
    prefix_hash_block_size,
    window_block_mask,
)
from stepwarm.blocks.rule import GroupTable, ReservationContext, ReservationRule
from stepwarm.blocks.rules import RULES, reserved_blocks_per_group
from stepwarm.blocks.token_range import TokenRangeSteps
from stepwarm.profile import CacheSpec, RunnerProfile

@dataclass
class BlockLedger(TokenRangeSteps):
    """Block tables per request per group from one shared pool, as the
    scheduler's ``KVCacheManager`` builds them.

    Block 0 is vLLM's null block: never handed out, and the placeholder the
    managers put where a request no longer needs a block (out of a sliding
    window or local chunk, Mamba states behind the last one). Such blocks go
    back to the pool when they fall out, in the order of vLLM's free queue
    (:class:`~stepwarm.blocks.pool.BlockPool`).

    A ledger whose groups are all full or MLA attention steps through the
    fast path of its base, :class:`~stepwarm.blocks.token_range.TokenRangeSteps`
    (the same tables, fewer calls).

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
    #: Tokens (:func:`~stepwarm.blocks.prefix_cache.prefix_cache_alignment`);
    #: None: from the groups.
    cache_alignment: int | None = None
    #: The drafter's prefix-caching rules (:class:`DrafterCaching`).
    drafter: DrafterCaching = field(default_factory=DrafterCaching)
    #: With caching off, freed blocks go to the queue's tail (vLLM 0.27's
    #: ``free_blocks``), not its head (:attr:`RunnerProfile.uncached_frees_append`).
    uncached_frees_append: bool = False
    #: The pool, and through it the prefix cache (``BlockPool``).
    pool: BlockPool = field(init=False, repr=False)
    _tables: dict[str, list[GroupTable]] = field(default_factory=dict, repr=False)
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
    _rules: list[ReservationRule] = field(default_factory=list, init=False, repr=False)
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
        self.pool = BlockPool(self.num_blocks, PrefixCache(),
                              self.uncached_frees_append and not self.enable_caching)
        #: The rule of each group (``RULES`` looked up once).
        self._rules = [RULES[spec.kind] for spec in self.specs]
        # (a drafter's caching rules are cache_prompt's alone: not on the fast path)
        self._token_range = all(type(r) is TokenRangeRule for r in self._rules) and \
            self.drafter == DrafterCaching()

    @property
    def prefix_cache(self) -> PrefixCache:
        """The pool's prefix cache (``BlockPool.cached_block_hash_to_block``)."""
        return self.pool.cache

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
                      wait_for_mamba: bool = False, preempt: tuple[str, ...] = (),
                      num_running: int = 0, self_preempted_computed: int = 0
                      ) -> list[Growth | None]:
        """One step's block work, all or nothing: :meth:`new_step`, then the
        finished requests ``free``, then per row :meth:`grow` and
        :meth:`cache_prompt`, as the scheduler calls ``allocate_slots``
        request by request.

        The ``preempt``ed requests are freed where vLLM's ``schedule()``
        preempts them: inside its running loop, when a running row (the
        first ``num_running`` rows) does not fit, one at a time in the order
        given (the running queue's last first) until it fits; those left
        after the running rows are freed before the waiting rows, once the
        last of them (the request whose own attempt preempted it, with
        ``self_preempted_computed`` tokens computed) has put its skipped
        blocks back, as its ``allocate_slots`` did before it failed. (Freed
        first instead, a running row before the preemption would take the
        preempted request's blocks where vLLM gives it the pool's last free
        ones: an uncached block goes back to the free queue's head.)

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
        if self._token_range and not preempt:
            fast = self._allocate_token_range(free, rows)
            if fast is not None:
                return fast
        saved = None if self._fits(rows) else self._save()
        self.new_step()
        try:
            self.free_each(free)
            pending = list(preempt)
            out: list[Growth | None] = []
            for i, r in enumerate(rows):
                if i == num_running and pending:  # the running loop is over
                    self._self_preempted(pending, self_preempted_computed)
                if wait_for_mamba and self.mamba_state_busy(r.req_id):
                    out.append(None)
                    continue
                while True:
                    try:
                        out.append(self.grow(r.req_id, r.num_tokens, encoder_len=r.encoder_len,
                                             num_computed=r.num_computed))
                        break
                    except OutOfBlocksError:
                        if not pending or i >= num_running:
                            raise
                        self.free(pending.pop(0))  # vLLM preempts, and tries again
                self.cache_prompt(r.req_id, r.num_cached_tokens, r.prompt_len,
                                  num_request_tokens=r.num_request_tokens)
            if pending:
                self._self_preempted(pending, self_preempted_computed)
        except OutOfBlocksError:
            if saved is None:  # pragma: no cover - _fits is conservative
                raise AssertionError("BlockLedger._fits admitted a step that does not fit") from None
            self._restore(saved)
            raise
        return out

    def _self_preempted(self, pending: list[str], num_computed: int) -> None:
        """Free ``pending``, the requests vLLM's running loop preempted while
        trying to fit the last of them, in order, after that one's attempt
        put its skipped blocks back (``remove_skipped_blocks`` comes before
        ``allocate_slots`` finds the pool short)."""
        self._remove_skipped(self._tables.get(pending[-1], ()), num_computed)
        self.free_each(pending)
        pending.clear()

    def _remove_skipped(self, tables: Iterable[GroupTable], num_computed: int) -> None:
        """``remove_skipped_blocks``: blocks of a request's ``tables`` the
        groups no longer need with ``num_computed`` tokens computed become
        null and go back to the pool."""
        for rule, spec, table in zip(self._rules, self.specs, tables):
            freed = rule.remove_skipped(table, num_computed, spec)
            if freed:
                self.pool.release(freed)

    # -- all or nothing ---------------------------------------------------------
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
        pool's queue and counts, the cache's id sets and cached counts
        copied; ids and keys are immutable): what :meth:`_restore` puts back."""
        return (
            self.pool.save(),
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
        (pool, self._tables, self._ctx, self._num_cached, self._cached_this_step,
         self._pending_hit) = saved
        self.pool.restore(pool)
        self._quick.clear()

    # -- the pool, as the planner sees it ----------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks left in the pool (0 when the runner has no usable block)."""
        return self.pool.num_free

    @property
    def num_held(self) -> int:
        """Distinct blocks held by live requests, all groups together."""
        return self.pool.num_held

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

    def _refuse_stale_hit(self, req_id: str) -> None:
        """``MambaManager.get_num_blocks_to_allocate``: a hit whose last state
        another request cached in this same step cannot be allocated.

        Raises:
            MambaStateBusyError: so it is for ``req_id``.
        """
        stale = self._stale_hit(req_id)
        if stale:
            raise MambaStateBusyError(
                f"request {req_id!r}: its prefix hit ends on a Mamba state cached in "
                f"this same step (group {stale[0][0]}); vLLM's MambaManager refuses it",
                req_id)

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
        self._refuse_stale_hit(req_id)
        self._remove_skipped(tables, num_computed)
        groups = list(zip(self._rules, self.specs, tables))
        need = sum(rule.to_allocate(t, num_tokens, spec, ctx) for rule, spec, t in groups)
        if need > self.num_free:
            if req_id in self._tables:
                self._tables[req_id] = tables
            raise self._refuse(req_id, need, num_tokens)
        appended, taken = [], []
        for rule, spec, table in groups:
            a, t = rule.allocate(table, num_tokens, spec, ctx, self.pool.take)
            appended.append(tuple(a))
            taken.append(tuple(t))
        self._tables[req_id] = tables
        self._ctx[req_id] = ctx
        self._pending_hit.pop(req_id, None)
        return Growth(tuple(appended), tuple(taken), tuple([len(t.ids) for t in tables]))

    # -- the prefix cache ----------------------------------------------------------
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
        finalized = max(0, num_tokens - self.drafter.reprefill_tokens)
        hybrid = sum(s.kind != "encoder_only_attention" for s in self.specs) > 1
        align = self.cache_alignment or 1
        # UnitaryKVCacheCoordinator caches the finalized tokens
        aligned = (num_tokens if hybrid else finalized) // align * align
        prompt_len = aligned if prompt_len is None else prompt_len
        done = self._num_cached.setdefault(req_id, [0] * len(self.specs))
        for g, (spec, table) in enumerate(zip(self.specs, self._tables[req_id])):
            if spec.kind in NOT_CACHED:
                continue
            cached = aligned
            if hybrid and g in self.drafter.eagle_groups and aligned > 0:
                # EAGLE matches one block past the aligned boundary, then drops it.
                cached = min(finalized, finalized // align * align + spec.block_size)
            full = min(cached // spec.block_size, len(table.ids))
            if self.drafter.hash_lookahead_tokens and num_request_tokens is not None:
                hbs = self._hash_block_size
                hashed = max(0, num_request_tokens - self.drafter.hash_lookahead_tokens)
                full = min(full, hashed // hbs * hbs // spec.block_size)
            if spec.kind == "mamba" and spec.mamba_cache_mode == "align" and spec.checkpoint_recached:
                self._recache_checkpoint(g, spec, table, cached, prompt_len)
            if full > done[g]:
                self._cache_group(g, spec, table, done[g], full, prompt_len, req_id)
                done[g] = full

    def _recache_checkpoint(self, g: int, spec: CacheSpec, table: GroupTable, cached: int,
                            prompt_len: int) -> None:
        """``MambaManager._cache_partial_tail_block`` (vLLM 0.32): the state at
        the prompt's checkpoint (its last whole hash block before the last
        token) is re-registered, and so marked cached in this step, whenever
        the cacheable prefix (``cached`` tokens) ends there."""
        hbs = self._hash_block_size
        checkpoint = (prompt_len - 1) // hbs * hbs
        i = checkpoint // spec.block_size - 1
        if (checkpoint and cached == checkpoint and checkpoint % spec.block_size == 0
                and i < len(table.ids) and table.ids[i]):
            self._cached_this_step.add((g, i))

    def _cache_group(self, g: int, spec: CacheSpec, table: GroupTable, start: int, end: int,
                     prompt_len: int, req_id: str) -> None:
        """Blocks ``start..end-1`` of ``req_id``'s table in group ``g`` become
        cache entries (``SingleTypeKVCacheManager.cache_blocks``); a Mamba
        group's prompt states are marked cached in this step
        (``MambaManager.cache_blocks``, every cache mode)."""
        if spec.kind == "mamba":
            self._cached_this_step.update(
                (g, i) for i in range(start, min(end, prompt_len // spec.block_size))
                if table.ids[i])
        self.pool.cache.cache_range(
            g, spec.block_size, table.ids, start, end, prompt_len, req_id,
            mask=window_block_mask(spec, self.cache_alignment or 1, start, end),
            hash_lookahead=self.drafter.hash_lookahead_tokens)

    @property
    def looks_up_resumed(self) -> bool:
        """Whether :meth:`lookup` finds hits here: prefix caching on, every
        cached group full, MLA or sliding-window attention or Mamba align
        (its block the hit alignment, no speculative blocks), no drafter."""
        align = self.cache_alignment or 1
        cached = [s for s in self.specs if s.kind not in NOT_CACHED]
        d = self.drafter
        # a drafter: its hash lookahead (0.33+), or EAGLE's dropped block
        # where one full-attention group is all that is cached
        drafter_ok = d == DrafterCaching() or (
            not d.reprefill_tokens and all(s.kind != "mamba" for s in cached)
            and (not d.eagle_groups
                 or (len(cached) == 1 and cached[0].kind in FULL_KINDS)))
        return self.enable_caching and drafter_ok and all(
            s.kind in NOT_CACHED or s.kind in (*FULL_KINDS, "sliding_window")
            or (s.kind == "mamba" and s.mamba_cache_mode == "align" and s.block_size == align
                and not s.num_speculative_blocks)
            for s in self.specs)

    def _shared_prompt_tokens(self, prompt_len: int) -> int:
        """Tokens of a prompt whose blocks are shared cache entries: a block's
        hash reads ``hash_lookahead_tokens`` past it (:meth:`PrefixCache.cache_range`),
        so a block whose lookahead passes the prompt is the request's own."""
        return max(0, prompt_len - self.drafter.hash_lookahead_tokens)

    def lookup(self, req_id: str, prompt_len: int, num_tokens: int) -> int:
        """Tokens of the longest prefix-cache hit of a request holding no
        block, ``prompt_len`` prompt tokens and ``num_tokens`` in all (a
        resumed request: prompt + outputs), as ``KVCacheManager.get_computed_blocks``
        finds it for a waiting request with no computed token: at most
        ``num_tokens - 1`` tokens; a full or MLA attention group's cached
        blocks from the first on, a sliding-window group's last run of cached
        blocks its window reads (:meth:`PrefixCache.window_hit_blocks`), a
        Mamba align group's last cached state (:meth:`PrefixCache.last_cached_block`),
        each group within the hit the others left, until none shortens it
        (``HybridKVCacheCoordinator.find_longest_cache_hit``); rounded down
        to :attr:`cache_alignment`. Past the prompt, a block's entry is the
        request's own (it holds its sampled tokens).

        With a drafter's hash lookahead (vLLM 0.33+) a block's entry needs
        the tokens after it: the hit stops ``num_hash_lookahead_tokens``
        before the request's end, and a prompt block whose lookahead reaches
        past the prompt is the request's own; with EAGLE's drop (one cached
        full-attention group) the hit's last block is dropped.

        Only where :attr:`looks_up_resumed` (else 0): stepwarm does not
        re-derive partial hash hits, Mamba's speculative blocks nor EAGLE's
        dropped block beside other groups.

        Example (one group, 16-token blocks): a 150-token prompt preempted
        after 4 sampled tokens, its first block still cached and its second
        reused: ``lookup`` is 16 (the request recomputes 138 tokens).
        """
        if not self.looks_up_resumed or req_id in self._tables:
            return 0
        cache, align = self.pool.cache, self.cache_alignment or 1
        groups = sorted(((g, s) for g, s in enumerate(self.specs) if s.kind not in NOT_CACHED),
                        key=lambda gs: gs[1].kind not in FULL_KINDS)  # full attention first
        full: dict[int, int] = {}  # downward-closed: looked up once
        ahead = self.drafter.hash_lookahead_tokens
        hit = num_tokens - max(1, ahead)
        shared = self._shared_prompt_tokens(prompt_len)
        drop = self.drafter.eagle_groups
        while True:
            length = hit
            for g, spec in groups:
                bs = spec.block_size
                if spec.kind in FULL_KINDS:
                    if g not in full:
                        n = cache.hit_blocks(g, bs, shared, length, req_id)
                        full[g] = (n - (g in drop and n > 0)) * bs
                    length = min(length, full[g])
                elif spec.kind == "mamba":
                    length = cache.last_cached_block(g, bs, shared, length, req_id,
                                                     align) * bs
                else:
                    length = cache.window_hit_blocks(g, spec, shared, length, req_id,
                                                     align) * bs
            if length >= hit:
                break
            hit = length
        return max(0, hit) // align * align

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
        plan = [self._hit_ids(g, spec, req_id, num_tokens, prompt_len)
                for g, spec in enumerate(self.specs)]
        missing = sum(i is None for ids in plan for i in ids)
        if missing > self.num_free:
            raise self._refuse(req_id, missing, num_tokens)
        tables, taken = [], []
        for ids in plan:
            for i in ids:
                if i:
                    self.pool.touch(i)
            fresh = iter(self.pool.take(sum(i is None for i in ids)))
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

    def _hit_ids(self, g: int, spec: CacheSpec, req_id: str, num_tokens: int,
                 prompt_len: int | None) -> list[int | None]:
        """Group ``g``'s table for a hit of ``num_tokens`` tokens: 0 for the
        blocks the group skips, the first id cached for each other block,
        None where none is (a block the pool must stand in for)."""
        rule = RULES[spec.kind]
        n = 0 if spec.kind in NOT_CACHED else num_tokens // spec.block_size
        skip = min(n, max(0, rule.skipped_tokens(num_tokens, spec)) // spec.block_size)
        own = n if prompt_len is None else self._shared_prompt_tokens(prompt_len) // spec.block_size
        cache = self.pool.cache
        return [0] * skip + [cache.first(PrefixCache.key(g, i, i < own, req_id))
                             for i in range(skip, n)]

    # -- finishing -----------------------------------------------------------------
    def free(self, req_id: str) -> tuple[int, ...]:
        """Return ``req_id``'s blocks to the pool (finish or preemption), group
        by group, each table last block first (``KVCacheManager.free``).

        Returns:
            The ids whose reference this drops (all groups, nulls left out),
            empty if the request held none.
        """
        tables = self._tables.pop(req_id, None) or []
        self._forget(req_id)
        dropped: list[int] = []
        for table in tables:
            ids = [i for i in reversed(table.ids) if i]
            self.pool.release(ids)
            dropped.extend(ids)
        return tuple(dropped)

    def free_each(self, req_ids: Iterable[str]) -> None:
        """:meth:`free` of each request in turn (a step's finished and
        preempted ones), in one loop: the same pool and tables after it,
        nothing returned. A cleanup step frees every request of a plan."""
        tables_of, release = self._tables, self.pool.release_tables
        for rid in req_ids:
            tables = tables_of.pop(rid, None)
            self._forget(rid)
            if tables:
                release(tables)

    def _forget(self, req_id: str) -> None:
        """Drop what the ledger remembers of a freed request besides its tables."""
        self._quick.pop(req_id, None)
        self._ctx.pop(req_id, None)
        self._num_cached.pop(req_id, None)
        self._pending_hit.pop(req_id, None)

    def live_requests(self) -> tuple[str, ...]:
        """Requests that hold blocks, in admission order."""
        return tuple(self._tables)
