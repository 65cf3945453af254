"""Block tables per step, per request, per KV cache group, read off a plan.

What ``stepwarm show --tables`` prints and ``stepwarm run --json`` writes
(``block_tables``): for every step, the block ids each scheduled request's
row of the ``SchedulerOutput`` carries, split by where they came from, and
the step's ``new_block_ids_to_zero``. Pure data from :class:`~stepwarm.plan.
PlannedStep` (no engine); the split mirrors vLLM's scheduler:

- ``sent``: ``NewRequestData.block_ids`` (the whole table) for a new or
  resumed request, ``CachedRequestData.new_block_ids`` (what is appended)
  for a running one.
- ``table``: the runner's block table after the step (what it was sent so
  far: a running request's ``new_block_ids`` are appended, as
  ``BlockTable.append_row`` does; blocks the scheduler later turns into null
  placeholders stay in the runner's copy).
- ``null``: positions of ``sent`` holding the null block (id 0), which
  ``SlidingWindowManager`` / ``MambaManager`` put where a block is no longer
  needed, and a prefix hit puts where the group skips the tokens.
- ``hit``: ids a prefix-cache hit gave the request
  (``KVCacheManager.get_computed_blocks``): in ``sent``, neither null nor
  newly allocated.
- ``allocated``: ids taken from the free pool in this step
  (``BlockPool.get_new_blocks``).
- ``zeroed``: the allocated ids the scheduler lists in
  ``new_block_ids_to_zero`` (groups whose manager records them, when the
  config needs zeroing; :func:`stepwarm.compile.new_block_ids_to_zero`).

Example (``prefix-hit`` on the embedded tiny Llama, block_size 128): step 0
starts ``hit1[0]`` after a one-block hit, ``sent`` = ``table`` = ``[1, 3]``,
``hit`` = ``[1]``, ``allocated`` = ``[3]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from stepwarm.compile import new_block_ids_to_zero
from stepwarm.plan import Plan, PlannedStep, ScheduledRequest
from stepwarm.profile import RunnerProfile


@dataclass(frozen=True)
class GroupBlocks:
    """One request's block ids in one KV cache group in one step."""

    #: KV cache group index.
    group: int
    #: Ids in the request's row of the ``SchedulerOutput`` (whole table for
    #: a new or resumed request, the appended ones for a running request).
    sent: tuple[int, ...]
    #: The runner's block table for the request after the step.
    table: tuple[int, ...]
    #: Positions in ``sent`` holding the null block (id 0).
    null: tuple[int, ...]
    #: Ids from a prefix-cache hit (shared with the request that cached them).
    hit: tuple[int, ...]
    #: Ids newly allocated from the free pool in this step.
    allocated: tuple[int, ...]
    #: The allocated ids listed in ``new_block_ids_to_zero``.
    zeroed: tuple[int, ...]


@dataclass(frozen=True)
class RequestBlocks:
    """One scheduled request's blocks in one step, per group."""

    #: The request as its scenario names it (``NAME`` or ``NAME[i]``).
    request: str
    #: ``new``, ``resumed`` or ``running`` (which ``SchedulerOutput`` row).
    row: str
    groups: tuple[GroupBlocks, ...]


@dataclass(frozen=True)
class StepBlocks:
    """One step's block ids."""

    index: int
    kind: str
    requests: tuple[RequestBlocks, ...]
    #: ``SchedulerOutput.new_block_ids_to_zero`` (None: not set, as when the
    #: config needs no zeroing or nothing was allocated).
    new_block_ids_to_zero: tuple[int, ...] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (tuples as lists)."""
        return asdict(self)


def _row_kind(row: ScheduledRequest) -> str:
    return "new" if row.new else "resumed" if row.resumed else "running"


def alloc_hit(step: PlannedStep, num_groups: int) -> tuple[list[int], list[int]]:
    """The blocks ``step`` allocates from the pool and those a prefix-cache
    hit gives it, per group, all requests together (``show``'s ``alloc
    blk`` and ``hit blk``, as :func:`step_blocks` splits them; null
    placeholders are neither)."""
    alloc, hit = [0] * num_groups, [0] * num_groups
    for row in step.scheduled:
        for g, sent in enumerate(row.block_ids[:num_groups]):
            allocated = row.allocated[g] if row.allocated else ()
            fresh = set(allocated)
            alloc[g] += len(allocated)
            hit[g] += sum(1 for b in sent if b and b not in fresh)
    return alloc, hit


def step_blocks(plan: Plan, profile: RunnerProfile) -> list[StepBlocks]:
    """Every step's block ids of ``plan`` (planned for ``profile``).

    Returns:
        One :class:`StepBlocks` per step, in order; a step that schedules no
        request (finish, cleanup) has no ``requests``.
    """
    tables: dict[str, list[list[int]]] = {}
    out = []
    for st in plan.steps:
        for rid in st.finished_req_ids | st.preempted_req_ids:
            tables.pop(rid, None)
        rows = []
        for row in st.scheduled:
            if row.new or row.resumed or row.req_id not in tables:
                tables[row.req_id] = [list(ids) for ids in row.block_ids]
            else:
                for table, ids in zip(tables[row.req_id], row.block_ids):
                    table.extend(ids)
            groups = []
            for g, sent in enumerate(row.block_ids):
                allocated = row.allocated[g] if row.allocated else ()
                fresh = set(allocated)
                groups.append(GroupBlocks(
                    group=g, sent=sent, table=tuple(tables[row.req_id][g]),
                    null=tuple(i for i, b in enumerate(sent) if b == 0),
                    hit=tuple(b for b in sent if b and b not in fresh),
                    allocated=allocated,
                    zeroed=allocated if profile.zeroes_group(g) else ()))
            rows.append(RequestBlocks(plan.display_name(row.req_id), _row_kind(row), tuple(groups)))
        zero = new_block_ids_to_zero(st, profile)
        out.append(StepBlocks(st.index, st.kind, tuple(rows),
                              None if zero is None else tuple(zero)))
    return out


def id_ranges(ids: tuple[int, ...]) -> str:
    """Block ids as text, runs of consecutive ids shortened:
    ``(0, 0, 5, 6, 7, 9)`` -> ``0 0 5-7 9``; ``()`` -> ``-``."""
    if not ids:
        return "-"
    parts: list[list[int]] = []
    for b in ids:
        if parts and b and parts[-1][1] + 1 == b and parts[-1][1]:
            parts[-1][1] = b
        else:
            parts.append([b, b])
    return " ".join(str(a) if a == b else f"{a}-{b}" if b > a + 1 else f"{a} {b}"
                    for a, b in parts)
