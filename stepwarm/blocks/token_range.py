"""The token-range fast path of :class:`~stepwarm.blocks.ledger.BlockLedger`:
a step of a ledger whose groups are all full or MLA attention
(``FullAttentionManager``: nothing skipped, no Mamba state, no drafter), in
one pass per row with no call per group, and the quick entries that let the
planner leave out a row that neither grows nor caches.

It is stepwarm's own speed-up, not a vLLM rule: the ids, tables and cache
entries are those :meth:`~stepwarm.blocks.ledger.BlockLedger.grow` then
:meth:`~stepwarm.blocks.ledger.BlockLedger.cache_prompt` make row by row
(``tests/property`` and ``tests/unit/test_blocks.py`` compare the two).
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import itemgetter
from typing import TYPE_CHECKING

from stepwarm.blocks.allocation import Growth, StepAllocation, idle_growth
from stepwarm.blocks.pool import BlockPool
from stepwarm.blocks.rule import GroupTable, ReservationContext
from stepwarm.profile import CacheSpec

#: A threshold no token count reaches ("never").
_NEVER = 1 << 62


class TokenRangeSteps:
    """The fast path's methods, a base of ``BlockLedger`` (whose fields and
    methods they read: declared here for the type checker only)."""

    if TYPE_CHECKING:
        specs: tuple[CacheSpec, ...]
        ctx: ReservationContext
        enable_caching: bool
        cache_alignment: int | None
        pool: BlockPool
        _tables: dict[str, list[GroupTable]]
        _ctx: dict[str, ReservationContext]
        _num_cached: dict[str, list[int]]
        _cached_this_step: set[tuple[int, int]]
        _pending_hit: dict[str, list[tuple[int, int]]]
        _token_range: bool
        _quick: dict[str, tuple[int, int, Growth]]
        _idle: dict[int, Growth]

        def free_each(self, req_ids: Iterable[str]) -> None: ...

        def _request_ctx(self, encoder_len: int | None) -> ReservationContext: ...

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

    # -- the token-range fast path ----------------------------------------------
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
        qs, slow = self._quick_split(rows)
        # quick rows need no block: the need of the others is the step's
        slow_rows = rows if len(slow) == len(rows) else [rows[i] for i in slow]
        free_now = self.pool.num_free
        if self._token_range_bound(slow_rows) > free_now and \
                self._token_range_need(slow_rows) > free_now:
            return None
        self._cached_this_step.clear()
        if free:
            self.free_each(free)
            qs, slow = self._quick_split(rows)  # a freed request starts again
        out: list[Growth | None] = [None if q is None else q[2] for q in qs]
        if len(self.specs) == 1:
            self._token_range_rows(rows, slow, out)
            return out
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        for i in slow:
            rid, num_tokens, _, num_cached_tokens, prompt_len, encoder_len, _n = rows[i]
            self._row_ctx(rid, encoder_len)
            covered = num_tokens + la
            out[i] = self._token_range_groups(rid, covered if covered < mml else mml,
                                              num_cached_tokens, prompt_len)
        return out

    def _row_ctx(self, rid: str, encoder_len: int | None) -> None:
        """As ``_ctx_for``: the row's request context (its encoder length's,
        or the ledger's own for none or the engine's longest); any pending
        hit dropped (no Mamba group: never a stale hit)."""
        if encoder_len is not None and encoder_len != self.ctx.max_encoder_len:
            self._ctx[rid] = self._request_ctx(encoder_len)
        else:
            self._ctx[rid] = self.ctx
        if self._pending_hit:
            self._pending_hit.pop(rid, None)

    def _quick_split(self, rows: list[StepAllocation]) -> tuple[list, list[int]]:
        """Each row's quick entry (None: none), and the indices of the rows
        it does not answer (they grow a table or cache a block)."""
        quick = self._quick
        qs = [quick.get(r[0]) for r in rows]
        slow = [i for i, q in enumerate(qs)
                if q is None or rows[i][1] > q[0] or rows[i][3] >= q[1]]
        return qs, slow

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

    def _token_range_rows(self, rows: list[StepAllocation], slow: list[int],
                          out: list[Growth | None]) -> None:
        """:meth:`_token_range_groups` for a ledger of one group, over the rows
        ``slow`` indexes, without its loops or a call per row: each table grown
        to its tokens plus lookahead (at most ``max_model_len``), its full blocks
        within ``num_cached_tokens`` cached, its quick entry renewed; each
        row's :class:`Growth` into ``out``."""
        bs = self.specs[0].block_size
        tables, take, idle_by, quick = self._tables, self.pool.take, self._idle, self._quick
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        caching = self.enable_caching
        cache_range, num_cached = self.pool.cache.cache_range, self._num_cached
        align = self.cache_alignment or 1
        new = tuple.__new__
        ctxs, pending, ctx, max_enc = self._ctx, self._pending_hit, self.ctx, \
            self.ctx.max_encoder_len
        for i in slow:
            rid, num_tokens, _, num_cached_tokens, prompt_len, encoder_len, _n = rows[i]
            # _row_ctx, inline
            if encoder_len is not None and encoder_len != max_enc:
                ctxs[rid] = self._request_ctx(encoder_len)
            else:
                ctxs[rid] = ctx
            if pending:
                pending.pop(rid, None)
            covered = num_tokens + la
            if covered > mml:
                covered = mml
            t = tables.get(rid)
            if t is None:
                ids: list[int] = []
                tables[rid] = [GroupTable(ids, False, None, 0)]
            else:
                ids = t[0].ids
            k = -(-covered // bs) - len(ids)
            if k > 0:
                got = take(k)
                ids += got
            have = len(ids)
            idle = idle_by.get(have)
            if idle is None:
                idle = idle_by[have] = idle_growth(1, (have,))
            threshold = _NEVER
            if caching:
                done = num_cached.get(rid)
                if done is None:
                    done = num_cached[rid] = [0]
                full = min(num_cached_tokens // align * align // bs, have)
                if full > done[0]:
                    cache_range(0, bs, ids, done[0], full, prompt_len, rid)
                    done[0] = full
                if have > done[0]:
                    threshold = (done[0] + 1) * bs
            cover = have * bs
            quick[rid] = (_NEVER if mml <= cover else cover - la, threshold, idle)
            out[i] = idle if k <= 0 else new(Growth, ((got,), (got,), idle[2]))

    def _token_range_groups(self, rid: str, covered: int, num_cached_tokens: int,
                            prompt_len: int) -> Growth:
        """One row of :meth:`_allocate_token_range` over several groups: each
        table grown to ``covered`` tokens, its full blocks within
        ``num_cached_tokens`` cached, the row's quick entry renewed."""
        bss = self._block_sizes()
        t = self._tables.get(rid)
        if t is None:
            t = self._tables[rid] = [GroupTable([], False, None, 0) for _ in bss]
        appended: list[tuple[int, ...]] | None = None
        for g, (bs, gt) in enumerate(zip(bss, t)):
            k = -(-covered // bs) - len(gt.ids)
            if k > 0:
                if appended is None:
                    appended = [()] * len(bss)
                got = self.pool.take(k)
                gt.ids.extend(got)
                appended[g] = got
        counts = tuple([len(gt.ids) for gt in t])
        idle = idle_growth(len(bss), counts)
        grown = idle if appended is None else tuple.__new__(
            Growth, (tuple(appended), tuple(appended), counts))
        threshold = _NEVER
        if self.enable_caching:
            done = self._num_cached.get(rid)
            if done is None:
                done = self._num_cached[rid] = [0] * len(bss)
            align = self.cache_alignment or 1
            cacheable = num_cached_tokens // align * align
            for g, (bs, gt) in enumerate(zip(bss, t)):
                full = min(cacheable // bs, len(gt.ids))
                if full > done[g]:
                    self.pool.cache.cache_range(g, bs, gt.ids, done[g], full, prompt_len, rid)
                    done[g] = full
                if len(gt.ids) > done[g]:
                    threshold = min(threshold, (done[g] + 1) * bs)
        # covered <= L * bs in every group: nothing to allocate (min of
        # the lookahead-extended tokens and max_model_len)
        cover = min((len(gt.ids) * bs for bs, gt in zip(bss, t)), default=_NEVER)
        la, mml = self.ctx.num_lookahead_tokens, self.ctx.max_model_len
        self._quick[rid] = (_NEVER if mml <= cover else cover - la, threshold, idle)
        return grown

    def _block_sizes(self) -> tuple[int, ...]:
        return tuple(s.block_size for s in self.specs)
