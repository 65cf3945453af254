"""The plan as pure data: what the planner hands the driver.

A :class:`Plan` is what a scenario (or one of vLLM's own warmup sequences)
expands to for one runner profile: requests (:class:`PlannedRequest`), and an
ordered tuple of :class:`PlannedStep`, each one ``SchedulerOutput`` worth of
:class:`ScheduledRequest` rows. Every block id is already decided (by a
:class:`~stepwarm.blocks.BlockLedger`), so a plan can be printed, checked and
compared without an engine. :mod:`stepwarm.compile` turns a step into vLLM's
``SchedulerOutput``; nothing here imports vLLM. The step data plays the part
of vLLM's ``v1/core/sched/output.py``; :class:`~stepwarm.plan.builder.PlanBuilder`
makes it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

#: What a step exercises; reports and tables show it.
StepKind = Literal[
    "prefill", "chunked_prefill", "prefix_hit", "decode", "spec_decode", "mixed_decode",
    "mixed_prefill_decode", "resume", "preempt", "finish", "cleanup", "custom",
]

#: Prefix of every request id stepwarm sends; the runner keeps none after a run.
REQ_ID_PREFIX = "_stepwarm_"


@dataclass(frozen=True, init=False)
class PlannedRequest:
    """A warmup request as declared (before any step schedules it).

    ``prompt_len`` and ``encoder_len`` are in tokens. ``kind`` "sample"
    requests carry ``SamplingParams``, "pool" requests ``PoolingParams``.
    """

    req_id: str
    prompt_len: int
    kind: Literal["sample", "pool"] = "sample"
    #: Sample with a structured-output bitmask (``GrammarOutput``).
    structured_output: bool = False
    #: Encoder input tokens (encoder-decoder models; 0 = none).
    encoder_len: int = 0
    #: A preset name ("warmup": ``SamplingParams.for_sampler_warmup()``,
    #: "greedy", "random", "seeded"; see ``stepwarm.compile.PRESET_ARGS``) or
    #: ``SamplingParams`` keyword arguments as sorted (name, value) pairs,
    #: tuples for lists (``stepwarm.scenario.sampling.SamplingArgs``).
    sampling: str | tuple[tuple[str, Any], ...] = "warmup"
    #: One image per entry, as an index into the profile's ``image_classes``
    #: (multimodal models; the prompt holds their placeholder tokens).
    images: tuple[int, ...] = ()
    #: ``Request.skip_reading_prefix_cache``: the request reads no prefix
    #: cache (it asks for prompt logprobs, or pools per token), so the
    #: scheduler gives it no prefix hit (:meth:`PlanBuilder.set_computed`
    #: refuses one).
    skip_reading_prefix_cache: bool = False
    #: The request as its scenario names it: ``name`` (its ``[requests.NAME]``
    #: table) and ``index`` (its place among that table's requests, None for
    #: a table of one); "" for a request declared without a name.
    name: str = ""
    index: int | None = None
    #: The encoder input is a dummy taken as already encoded, as vLLM's
    #: ``warmup_kernels`` registers one (``MultiModalFeatureSpec`` without
    #: data): cross-attention reads ``encoder_len`` tokens, no step schedules
    #: the encoder.
    encoder_cached: bool = False

    def __init__(self, req_id: str, prompt_len: int, kind: Literal["sample", "pool"] = "sample",
                 structured_output: bool = False, encoder_len: int = 0,
                 sampling: str | tuple[tuple[str, Any], ...] = "warmup",
                 images: tuple[int, ...] = (), skip_reading_prefix_cache: bool = False,
                 name: str = "", index: int | None = None, encoder_cached: bool = False):
        # The fields in one dict update: a frozen dataclass's generated
        # __init__ sets each through object.__setattr__, three times the cost
        # (a plan declares one per request). The defaults are the fields'
        # (tests/unit/test_plan_work.py checks they agree).
        self.__dict__.update(
            req_id=req_id, prompt_len=prompt_len, kind=kind, structured_output=structured_output,
            encoder_len=encoder_len, sampling=sampling, images=images,
            skip_reading_prefix_cache=skip_reading_prefix_cache, name=name, index=index,
            encoder_cached=encoder_cached)

    @property
    def encodes_audio(self) -> bool:
        """An encoder-decoder request whose encoder input a step encodes
        (the driver sends it audio): ``encoder_len``, no images, not
        ``encoder_cached``."""
        return bool(self.encoder_len) and not self.images and not self.encoder_cached

    @property
    def display_name(self) -> str:
        """``NAME`` or ``NAME[i]``; the request id when it has no name."""
        if not self.name:
            return self.req_id
        return self.name if self.index is None else f"{self.name}[{self.index}]"


class ScheduledRequest(NamedTuple):
    """One request's share of a step (what the scheduler decided for it).

    Becomes a ``NewRequestData`` when ``new``, else one row of
    ``CachedRequestData`` (``resumed`` rows replace the runner's block table).
    A named tuple (``_replace`` for a changed copy): a plan holds one per
    request per step, and a frozen dataclass costs ten times a tuple to build.
    """

    req_id: str
    #: ``num_computed_tokens`` before this step (tokens).
    num_computed_tokens: int
    #: ``num_scheduled_tokens[req_id]``, drafts included (tokens).
    num_scheduled_tokens: int
    #: ``scheduled_spec_decode_tokens[req_id]``; ``len`` draft tokens.
    spec_token_ids: tuple[int, ...] = ()
    #: First time the runner sees the request (``NewRequestData``).
    new: bool = False
    #: Resumed after preemption (``CachedRequestData.resumed_req_ids``).
    resumed: bool = False
    #: Block ids per group: all of them for new and resumed requests, the
    #: ``new_block_ids`` delta for running ones.
    block_ids: tuple[tuple[int, ...], ...] = ()
    #: Block ids per group handed out from the pool in this step (what the
    #: scheduler's ``new_block_ids_to_zero`` draws on): ``block_ids`` less a
    #: prefix-cache hit's blocks and null placeholders.
    allocated: tuple[tuple[int, ...], ...] = ()
    #: ``num_output_tokens`` the scheduler would report (tokens sampled so far,
    #: all drafts assumed accepted).
    num_output_tokens: int = 0
    #: Whether this step completes the prompt, so the runner samples a token.
    samples: bool = False
    #: Indices of the request's images whose encoder runs in this step
    #: (``SchedulerOutput.scheduled_encoder_inputs[req_id]``).
    encoder_inputs: tuple[int, ...] = ()

    @property
    def new_block_counts(self) -> tuple[int, ...]:
        """Blocks handed out in this step, per group."""
        return tuple(len(ids) for ids in self.block_ids)

    @property
    def num_drafts_verified(self) -> int:
        """Drafts the runner verifies (``len(spec_token_ids)``), 0 for a
        waiting request padded with :data:`PLACEHOLDER_DRAFT` s: the
        rejection sampler accepts none of those."""
        spec = self.spec_token_ids
        return 0 if spec and spec[0] == PLACEHOLDER_DRAFT else len(spec)


#: The draft token id vLLM's scheduler pads a waiting request with
#: (``pad_spec_decode``: ``[-1] * num_spec_tokens``; the rejection
#: sampler's ``PLACEHOLDER_TOKEN_ID``), so that a step stays a uniform
#: decode (:attr:`~stepwarm.profile.RunnerProfile.pad_spec_decode`).
PLACEHOLDER_DRAFT = -1


#: A row as :meth:`PlanBuilder._schedule_decodes` keeps one the ledger's
#: quick entry answers (req_id, num_computed_tokens, num_scheduled_tokens,
#: spec_token_ids, num_output_tokens): a running decode row that samples,
#: its blocks the row's Growth.
QuickRow = tuple[str, int, int, tuple[int, ...], int]


class LazyRows:
    """A step's scheduled rows as the builder left them, made
    :class:`ScheduledRequest` tuples on first read
    (:attr:`PlannedStep.scheduled`).

    A plan is read step by step (the driver compiles one step when it runs
    it) or not row by row at all (a check that counts steps), and the rows
    of 1,024 requests x 8 steps were the largest part of planning them, and
    of the collector's work after it (a named tuple is never untracked; the
    plain tuples here are, at the first collection). ``rows`` are
    :data:`QuickRow` (5 fields) or :data:`Row` (9) tuples, ``growths``
    their Growths, ``tables`` the whole tables (read when the step was
    planned) of the new and resumed rows that had computed tokens."""

    __slots__ = ("rows", "growths", "tables")

    def __init__(self, rows: list, growths: list, tables: dict[str, tuple[tuple[int, ...], ...]]):
        self.rows, self.growths, self.tables = rows, growths, tables

    def __call__(self) -> tuple[ScheduledRequest, ...]:
        new = tuple.__new__
        tables = self.tables
        out: list[ScheduledRequest] = []
        add = out.append
        for row, g in zip(self.rows, self.growths):
            if len(row) == 5:  # a QuickRow
                rid, c, n, spec, outs = row
                add(new(ScheduledRequest, (rid, c, n, spec, False, False, g[0], g[1], outs,
                                           True, ())))
            else:
                ids = tables.get(row[0]) if tables else None
                add(new(ScheduledRequest, row[:6] + (g[0] if ids is None else ids, g[1])
                        + row[6:]))
        return tuple(out)


class _ScheduledField:
    """The ``scheduled`` field of :class:`PlannedStep`: a tuple, or a
    :class:`LazyRows` built into one the first time it is read (and kept)."""

    def __get__(self, obj: Any, owner: Any = None) -> tuple[ScheduledRequest, ...]:
        if obj is None:
            return ()  # the field's default
        v = obj.__dict__["_scheduled"]
        if type(v) is not tuple:
            v = obj.__dict__["_scheduled"] = v()
        return v

    def __set__(self, obj: Any, value: tuple[ScheduledRequest, ...] | LazyRows) -> None:
        obj.__dict__["_scheduled"] = value


@dataclass(frozen=True)
class PlannedStep:
    """One ``SchedulerOutput`` worth of work, plus whether to sample after it.

    ``scheduled`` may be given as the builder's rows (:class:`LazyRows`), made
    the tuple when first read: equality, ``repr``, hashing, pickling and
    ``dataclasses.replace`` see the tuple."""

    index: int
    kind: StepKind
    label: str
    scheduled: tuple[ScheduledRequest, ...] = _ScheduledField()  # type: ignore[assignment]
    finished_req_ids: frozenset[str] = frozenset()
    preempted_req_ids: frozenset[str] = frozenset()
    #: Call ``sample_tokens`` after ``execute_model`` (not for pooling steps).
    sample: bool = True
    #: Requests sampled with an all-ones ``GrammarOutput`` bitmask.
    grammar_req_ids: tuple[str, ...] = ()
    #: ``SchedulerOutput.num_spec_tokens_to_schedule``.
    num_spec_tokens_to_schedule: int = 0
    #: Blocks each scheduled request holds after this step, per group.
    held_blocks: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        self.scheduled  # noqa: B018 - built, so a pickle holds the tuple
        return self.__dict__

    @property
    def total_num_scheduled_tokens(self) -> int:
        """``SchedulerOutput.total_num_scheduled_tokens`` (tokens)."""
        return sum(r.num_scheduled_tokens for r in self.scheduled)

    @property
    def req_ids(self) -> tuple[str, ...]:
        """Scheduled request ids, in schedule order."""
        return tuple(r.req_id for r in self.scheduled)

    @property
    def new_block_counts(self) -> tuple[int, ...]:
        """Blocks handed out in this step, per group, all requests together."""
        counts = [r.new_block_counts for r in self.scheduled if r.block_ids]
        return tuple(sum(c) for c in zip(*counts)) if counts else ()

    @property
    def num_sampling_requests(self) -> int:
        """Requests that get one sampled-token list from ``sample_tokens``."""
        return sum(1 for r in self.scheduled if r.samples)


@dataclass(frozen=True)
class Plan:
    """A whole warmup: requests and steps, ready for the driver."""

    name: str
    requests: tuple[PlannedRequest, ...]
    steps: tuple[PlannedStep, ...]
    #: Why the plan is empty when it was skipped (a scenario whose needs the
    #: runner does not meet), else "".
    skipped: str = ""
    #: Steps :meth:`only` left out (the plan had ``len(steps) + left_out``).
    left_out: int = 0

    def lockstep_signature(self) -> str:
        """What every tensor / pipeline parallel rank must run identically, as
        text: the plan's name, whether it was skipped, and per step its kind,
        each scheduled request's ``(req_id, num_computed_tokens,
        num_scheduled_tokens, drafts, block ids)``, finished and preempted ids
        and whether it samples. The grammar bitmask is left out: only the last
        pipeline rank gets one (:mod:`stepwarm.ranks` compares these)."""
        lines = [f"{self.name} skipped={bool(self.skipped)}"]
        for st in self.steps:
            reqs = ";".join(
                f"{r.req_id},{r.num_computed_tokens},{r.num_scheduled_tokens},"
                f"{len(r.spec_token_ids)},{r.block_ids}" for r in st.scheduled)
            lines.append(f"{st.index} {st.kind} sample={st.sample} [{reqs}] "
                         f"fin={sorted(st.finished_req_ids)} pre={sorted(st.preempted_req_ids)}")
        return "\n".join(lines)

    def segments(self) -> tuple[range, ...]:
        """The plan cut where no request is left in the runner: positions in
        :attr:`steps`. A segment starts at a step that schedules a new
        request while none of the plan's earlier requests is left once the
        step's ``finished_req_ids`` are removed (a preempted request still
        counts: the runner keeps it for its resumption). A plan with images
        or an encoder input is one segment (a later request may read an
        earlier one's encoder output from the runner's encoder cache).

        A segment runs the same without the ones before it (:meth:`only`):
        the runner holds nothing of theirs, and the block ids it is given
        are only memory (a prefix hit reads blocks whose contents a warmup
        does not check)."""
        cached = self.__dict__.get("_segments_cache")
        if cached is None:
            cached = self._segments()
            object.__setattr__(self, "_segments_cache", cached)
        return cached

    def _segments(self) -> tuple[range, ...]:
        if not self.steps:
            return ()
        if any(r.images or r.encoder_len for r in self.requests):
            return (range(len(self.steps)),)
        cuts: list[range] = []
        live: set[str] = set()
        start = 0
        for pos, step in enumerate(self.steps):
            live.difference_update(step.finished_req_ids)
            new = [r.req_id for r in step.scheduled if r.new]
            if new and not live and pos > start:
                cuts.append(range(start, pos))
                start = pos
            live.update(new)
        cuts.append(range(start, len(self.steps)))
        return tuple(cuts)

    def only(self, segments: Iterable[int]) -> Plan:
        """This plan with the steps of the :meth:`segments` numbered
        ``segments`` alone; the steps keep their indices. A request a left-out
        step would have finished is finished by the next step kept (else by
        the driver's cleanup), and a kept step finishes no request the kept
        steps never started."""
        keep = {pos for i in set(segments) for pos in self.segments()[i]}
        steps: list[PlannedStep] = []
        live: set[str] = set()
        owed: set[str] = set()
        for pos, step in enumerate(self.steps):
            if pos not in keep:
                owed |= step.finished_req_ids & live
                continue
            finished = (step.finished_req_ids | owed) & live
            owed = set()
            if finished != step.finished_req_ids:
                step = dataclasses.replace(step, finished_req_ids=frozenset(finished))
            live -= finished
            live.update(r.req_id for r in step.scheduled if r.new)
            steps.append(step)
        return dataclasses.replace(self, steps=tuple(steps),
                                   left_out=self.left_out + len(self.steps) - len(steps))

    def display_name(self, req_id: str) -> str:
        """A request of this plan as its scenario names it
        (:attr:`PlannedRequest.display_name`: ``NAME`` or ``NAME[i]``;
        ``req[i]`` and ``mixed_decode`` / ``mixed_prefill`` for vLLM's own
        sequences); other ids unchanged."""
        req = self._by_id().get(req_id)
        return req.display_name if req is not None else req_id

    def with_display_names(self, text: str) -> str:
        """``text`` with every request id of this plan replaced by its
        :meth:`display_name` (for messages: vLLM's errors name request ids).
        Longer ids first, so no id is cut inside another."""
        for req in sorted(self.requests, key=lambda r: -len(r.req_id)):
            if req.req_id in text:
                text = text.replace(req.req_id, req.display_name)
        return text

    def _by_id(self) -> dict[str, PlannedRequest]:
        by_id = self.__dict__.get("_by_id_cache")
        if by_id is None:
            by_id = {r.req_id: r for r in self.requests}
            object.__setattr__(self, "_by_id_cache", by_id)
        return by_id

    @property
    def max_block_id(self) -> int:
        """The highest KV block id a step hands a request (0: none): the
        blocks the worker's cache must back for this plan."""
        return max((i for st in self.steps for row in st.scheduled for ids in row.block_ids
                    for i in ids), default=0)

    def request(self, req_id: str) -> PlannedRequest:
        """The declared request ``req_id``.

        Raises:
            KeyError: no such request.
        """
        for r in self.requests:
            if r.req_id == req_id:
                return r
        raise KeyError(req_id)

