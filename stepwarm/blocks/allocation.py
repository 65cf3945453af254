"""What one allocation asks of the ledger and what it gets back (the
arguments and results of vLLM's ``KVCacheManager.allocate_slots``), and
the refusals."""

from __future__ import annotations

import functools
from typing import NamedTuple


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


class Growth(NamedTuple):
    """What one :meth:`~stepwarm.blocks.ledger.BlockLedger.grow` did, per
    group (a named tuple: one is built per scheduled request, so it must cost
    what a tuple costs)."""

    #: Ids appended to the request's block table (the scheduler's
    #: ``new_block_ids``; may hold null placeholders, 0).
    appended: tuple[tuple[int, ...], ...]
    #: Ids taken from the pool (what ``new_block_ids_to_zero`` draws on).
    taken: tuple[tuple[int, ...], ...]
    #: The request's block table length per group after it (null
    #: placeholders included; ``BlockLedger.held_counts``).
    held: tuple[int, ...] = ()


class StepAllocation(NamedTuple):
    """One scheduled request's allocation in
    :meth:`~stepwarm.blocks.ledger.BlockLedger.allocate_step` (the arguments
    of one ``KVCacheManager.allocate_slots`` call; a named tuple, built once
    per scheduled request)."""

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


@functools.cache
def no_ids(num_groups: int) -> tuple[tuple[()], ...]:
    """``((),) * num_groups``, one object per group count: a row that takes no
    block shares it, so the collector can untrack the row's tuples (a tuple
    that holds a tuple still tracked stays tracked; the table of a step's
    ledger call would be, were it built per call)."""
    return ((),) * num_groups


def idle_growth(num_groups: int, held: tuple[int, ...]) -> Growth:
    """The :class:`Growth` of a row that takes no block and holds ``held``
    (built with ``tuple.__new__``: a named tuple's own constructor costs a
    call more)."""
    empty = no_ids(num_groups)
    return tuple.__new__(Growth, (empty, empty, held))
