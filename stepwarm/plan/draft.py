"""A step being scheduled: what a caller asks of it (:class:`StepAsk`) and
its rows as the builder's phases add them (:class:`StepDraft`), before the
scheduler output is constructed."""

from __future__ import annotations

from dataclasses import dataclass, field

from stepwarm.blocks import Growth, StepAllocation
from stepwarm.plan.output import LazyRows, QuickRow, ScheduledRequest
from stepwarm.plan.request import LiveRequest


@dataclass
class StepAsk:
    """What a caller asks of one step (:meth:`PlanBuilder.step`'s arguments)."""

    prefill: dict[str, int] = field(default_factory=dict)
    decode: dict[str, int] = field(default_factory=dict)
    resume: dict[str, int] = field(default_factory=dict)
    finish: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()
    #: decoded request -> draft tokens the runner accepted (absent: all).
    accepted: dict[str, int] = field(default_factory=dict)


#: A row as scheduled, before its blocks: the fields of a
#: :class:`ScheduledRequest` but ``block_ids`` and ``allocated`` (req_id,
#: num_computed_tokens, num_scheduled_tokens, spec_token_ids, new, resumed,
#: num_output_tokens, samples, encoder_inputs), a plain tuple: the named one
#: is built once, when the ledger has the blocks (:meth:`PlanBuilder._allocate`).
Row = tuple[str, int, int, tuple[int, ...], bool, bool, int, bool, tuple[int, ...]]


@dataclass
class StepDraft:
    """A step being scheduled: its rows in order, each with the update
    ``_update_after_schedule`` applies (live, computed +=, outputs +=)."""

    #: (A decode row answered from the ledger's quick entries is a
    #: :data:`~stepwarm.plan.output.QuickRow`: ``growths`` holds its Growth.)
    rows: list[Row | QuickRow] = field(default_factory=list)
    #: The rows with their blocks (:meth:`PlanBuilder._allocate`), without
    #: those left waiting.
    scheduled: list[ScheduledRequest] | LazyRows = field(default_factory=list)
    #: Prefilled and resumed rows' updates (decodes: ``decoded``).
    updates: list[tuple[LiveRequest, int, int]] = field(default_factory=list)
    #: The decoded requests, in order (rows ``decode_start`` on): each
    #: advances computed and output tokens by its row's scheduled tokens.
    decoded: list[LiveRequest] = field(default_factory=list)
    decode_start: int = 0
    #: Some decode carries drafts (else each advances by one token).
    drafts: bool = False
    #: Resumed requests and whether they are still recomputing after it.
    resuming: list[tuple[LiveRequest, bool]] = field(default_factory=list)
    #: Blocks each scheduled request holds after the step, per group.
    held: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    total: int = 0
    encoder_tokens: int = 0
    #: A pooling request is scheduled (no ``sample_tokens`` after the step).
    pooling: bool = False
    #: The ledger call of each row not answered from the ledger's quick
    #: entries (``StepAllocation``), built with the row.
    allocs: list[StepAllocation] = field(default_factory=list)
    #: Per row, its ``Growth`` when the ledger's quick entry answers it
    #: (:meth:`BlockLedger.quick_entries`), else None (it is in ``allocs``).
    growths: list[Growth | None] = field(default_factory=list)
    #: The ``held`` entries of the answered rows, in order.
    held_pairs: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    #: The most tokens a row reaches after sampling (the ``max_model_len``
    #: check names the first row beyond it only when this is).
    most_tokens: int = 0

    def all_updates(self) -> list[tuple[LiveRequest, int, int]]:
        """Every row's update (live, computed +=, outputs +=), in row order."""
        ds, decoded = self.decode_start, self.decoded
        if not decoded:
            return self.updates
        rows = self.rows[ds:ds + len(decoded)]
        return self.updates[:ds] + [(live, r[2], r[2]) for live, r in zip(decoded, rows)] + \
            self.updates[ds:]

    def add(self, row: Row, live: LiveRequest, dn: int, dout: int) -> None:
        """Append ``row``, its update (computed ``+= dn``, outputs ``+=
        dout``) and its ledger call: slots for its scheduled tokens
        (``row[2]``: ``dn``, or more for placeholder drafts the runner
        rejects)."""
        self.rows.append(row)
        self.updates.append((live, dn, dout))
        self.total += row[2]
        self.growths.append(None)
        c, decl = live.num_computed_tokens, live.decl
        num_tokens = decl.prompt_len + live.num_output_tokens
        end = c + row[2]
        self.allocs.append(tuple.__new__(StepAllocation, (
            decl.req_id, end, c, min(end, num_tokens), decl.prompt_len, decl.encoder_len,
            num_tokens)))
        self.most_tokens = max(self.most_tokens, c + dn,
                               num_tokens + (dout if decl.kind == "sample" else 0))

