"""Expansion: a validated scenario and a :class:`~stepwarm.profile.RunnerProfile`
become a :class:`~stepwarm.plan.Plan`.

Sizes are evaluated by :mod:`stepwarm.expressions`, every step goes through
:class:`~stepwarm.plan.PlanBuilder` (so lifecycle and limit errors are the
builder's), and errors become a :class:`ScenarioError` naming the file, the
line, the step index and the field. :func:`plans_for` expands every scenario
named before any of them runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, cast

from stepwarm.expressions import (
    ExpressionError,
    block_sizes_of,
    evaluate,
    facts_of,
    functions_of,
)
from stepwarm.plan import (
    REQ_ID_PREFIX,
    Plan,
    PlanBuilder,
    PlanError,
    PlannedRequest,
    bad_drafts,
    collector_paused,
    max_prompt_len,
    over_token_budget,
    too_many_seqs,
)
from stepwarm.profile import RunnerProfile
from stepwarm.scenario.errors import ScenarioError, unknown_request
from stepwarm.scenario.format import (
    ChunkedPrefillStep,
    DecodeStep,
    FinishStep,
    MAX_COUNT,
    MAX_EXPANDED,
    MAX_REQUESTS,
    MAX_STARTUP_STEPS,
    MAX_STEPS,
    MixedDecodeStep,
    MixedPrefillDecodeStep,
    PreemptStep,
    PrefillStep,
    PrefixHitStep,
    ResumeStep,
    STEP_MODELS,
    SpecDecodeStep,
    _SELECTOR,
)
from stepwarm.scenario.load import LoadedScenario, _where, builtin_names, load, resolve_names
from stepwarm.scenario.needs import unmet_need, unmet_requirement
from stepwarm.scenario.sampling import (
    SweepFieldError,
    has_prompt_logprobs,
    pooling_skips_prefix_cache,
    skips_prefix_cache,
    refusals,
    refused_anywhere,
    shown,
    variants,
    vllm_check_skipped,
)
from stepwarm.scenario.sweeps import MAX_SWEEP, Sweep, describe, sweep_values

#: Step kinds whose ``repeat`` the expander applies to the whole step (the
#: decode kinds repeat each batch themselves).
_REPEATED_WHOLE = ("prefill", "chunked_prefill", "prefix_hit", "resume", "mixed_prefill_decode")


_ALLOWED_BY_FIELD = {
    "requests": "at most max_num_seqs = {p.max_num_seqs} distinct requests per step, "
                "each scheduled once, in a state the step kind accepts",
    "prefill": "prefill a waiting request, or continue a running request's chunked prefill",
    "decode": "decode a running request whose prompt is fully computed",
    "tokens": "1 or more tokens per request, at most the prompt left, at most "
              "max_num_batched_tokens = {p.max_num_batched_tokens} per step and "
              "max_model_len = {p.max_model_len} per request",
    "spec_tokens": "0..num_spec_steps = {p.num_speculative_steps} draft tokens",
    "resume": "resume a request preempted earlier",
    "finish": "finish running requests",
    "preempt": "preempt running requests",
    "blocks": "at most num_blocks - 1 = {blocks} blocks held by all live requests",
    "prefix_hit": "a waiting request, a hit below its prompt length",
    "prompt_len": "1..max_model_len - 1 = {p.max_model_len - 1} tokens (a pooling "
                  "request: 1..max_model_len)",
}


class _Expander:
    """Expands one loaded scenario for one profile through a PlanBuilder."""

    def __init__(self, sc: LoadedScenario, profile: RunnerProfile):
        self.sc, self.p = sc, profile
        self.facts = facts_of(profile)
        self.block_sizes = block_sizes_of(profile)
        self.functions = functions_of(profile)
        self.b = PlanBuilder(profile, name=sc.name)
        self.groups: dict[str, list[str]] = {}
        self.prompt_len: dict[str, int] = {}
        self.sampling: dict[str, Any] = {}
        #: which run of a repeated step is expanding (0: the first)
        self.rep = 0
        #: request id -> "name" or "name[i]", for messages
        self.display: dict[str, str] = {}
        self.step_i: int | None = None
        self.kind: str | None = None
        #: an entry went past MAX_REQUESTS (declare stops listing there)
        self.requests_capped = False
        #: an entry went past MAX_STEPS (expand stops listing there)
        self.steps_capped = False
        #: [requests] entries that could not be declared: a step selecting
        #: one is not checked (what it would schedule is unknown)
        self.failed_requests: set[str] = set()
        #: [[steps]] entries not checked for selecting one of those
        self.steps_unchecked: list[int] = []
        #: the [[steps]] entry expanding
        self.st: Any = None

    # -- errors --------------------------------------------------------------
    def err(self, what: str, field: str | None, *, request: str | None = None,
            allowed: str = "") -> ScenarioError:
        if request is not None:
            sec: tuple = ("requests", request)
        elif self.step_i is not None:
            sec = ("steps", self.step_i)
        else:
            sec = ("top",)
        line = self.sc.index.line(sec, field)
        if sec == ("top",) and line is None:
            line = None
        where = _where(self.sc.file, line, sec, field, self.kind if sec[0] == "steps" else None)
        if allowed and "allowed" not in what:
            what = f"{what}; allowed: {allowed}"
        return ScenarioError(f"{where}: {what}", file=self.sc.file, line=line,
                             step=self.step_i if sec[0] == "steps" else None, field=field)

    def value(self, expr: Any, field: str, *, request: str | None = None,
              low: int | None = 1, high: int | None = None, what: str = "",
              fixed_high: bool = False) -> int:
        """Evaluate an expression and range-check it (``fixed_high``: ``high``
        is a cap of the format, the same on every runner)."""
        try:
            v = evaluate(expr, self.facts, self.block_sizes, self.functions)
        except ExpressionError as e:
            raise self.err(str(e), field, request=request) from None
        rng = f"{low}..{high}" if high is not None else f">= {low}"
        shown = f"{expr!r} = {v}" if isinstance(expr, str) else str(v)
        below = low is not None and v < low
        if below or high is not None and v > high:
            error = self.err(f"{what or field} {shown} is out of range", field,
                             request=request, allowed=f"{rng}")
            # a literal past a fixed bound: wrong on any runner (low is always a constant)
            error.profile_free = not isinstance(expr, str) and (below or fixed_high)
            raise error
        return v

    def sizes(self, size: Any, field: str, *, request: str | None = None,
              low: int = 1, high: int | None = None) -> list[int]:
        """A size as the list of values it stands for (one, or a sweep's),
        each in ``low..high``."""
        if not isinstance(size, Sweep.__args__):  # type: ignore[attr-defined]
            return [self.value(size, field, request=request, low=low, high=high)]
        try:
            values = sweep_values(size, lambda e, what: self.value(
                e, field, request=request, low=None, what=what))
        except ExpressionError as e:
            raise self.err(str(e), field, request=request) from None
        for v in values:
            if v < low or high is not None and v > high:
                rng = f"{low}..{high}" if high is not None else f">= {low}"
                raise self.err(f"{describe(size)}: value {v} is out of range", field,
                               request=request, allowed=rng)
        return values

    def sampling_variants(self, name: str, spec: Any) -> list[Any]:
        """The sampling args a request declaration stands for, each checked
        with vLLM's ``SamplingParams``, every refusal at once
        (:func:`~stepwarm.scenario.sampling.refusals`)."""
        if spec.kind == "pool":
            if "sampling" in spec.model_fields_set:
                raise self.err('sampling on a kind = "pool" request', "sampling", request=name,
                               allowed='no sampling key on pooling requests (PoolingParams)')
            return ["warmup"]
        try:
            out = variants(spec.sampling, lambda e, fld: self.value(
                e, f"sampling.{fld}", request=name, low=None))
        except SweepFieldError as e:
            raise self.err(str(e), f"sampling.{e.field}", request=name) from None
        if len(out) > MAX_SWEEP:
            raise self.err(f"the sampling sweeps make {len(out)} combinations", "sampling",
                           request=name, allowed=f"at most {MAX_SWEEP}")
        allowed = (f"what vLLM accepts on this runner (max_logprobs {self.p.max_logprobs}, "
                   f"vocab_size {self.p.vocab_size}, num_speculative_steps "
                   f"{self.p.num_speculative_steps})")
        for args in out:
            refused = refusals(args, self.p)
            if refused:
                errors = []
                for one, fld, msg in refused:
                    # refused on the most permissive runner too: on any runner
                    anywhere = refused_anywhere(one)
                    error = self.err(f"vLLM's SamplingParams refuses {shown(one)}: "
                                     f"{msg.rstrip().removesuffix('.')}; allowed: "
                                     f"{'what vLLM accepts on any runner' if anywhere else allowed}",
                                     f"sampling.{fld}", request=name)
                    error.profile_free = anywhere
                    errors.append(error)
                raise ScenarioError.of(errors)
        return out

    # -- requests -------------------------------------------------------------
    def declare(self) -> None:
        """Every ``[requests]`` entry as planned requests.

        Raises:
            ScenarioError: every entry that cannot be (one error per entry,
                all of them: :meth:`ScenarioError.of`).
        """
        errors: list[ScenarioError] = []
        # entries the format refused (said by the loader): their steps go unchecked
        self.failed_requests.update(self.sc.refused_requests)
        for name, spec in self.sc.model.requests.items():
            try:
                self._declare_one(name, spec)
            except ScenarioError as e:
                errors.extend(e.errors)
                self.failed_requests.add(name)
                if self.requests_capped:
                    break
        if errors:
            raise ScenarioError.of(errors)

    def _declare_one(self, name: str, spec: Any) -> None:
        p = self.p
        errors: list[ScenarioError] = []  # prompt, count and sampling: each field's, at once

        def field(fn: Any) -> Any:
            try:
                return fn()
            except ScenarioError as e:
                errors.extend(e.errors)
                return None

        prompts = field(lambda: self.sizes(spec.prompt, "prompt", request=name))
        swept = isinstance(spec.prompt, Sweep.__args__)  # type: ignore[attr-defined]
        n = 1
        if swept:
            if "count" in spec.model_fields_set:
                errors.append(self.err("count cannot be combined with a swept prompt (the "
                                       "sweep sets the count)", "count", request=name,
                                       allowed="count or a prompt sweep, not both"))
        else:
            n = field(lambda: self.value(spec.count, "count", request=name, high=MAX_COUNT,
                                         fixed_high=True))
        samplings = field(lambda: self.sampling_variants(name, spec))
        if errors:
            raise ScenarioError.of(errors)
        prompts = prompts * n
        if len(prompts) * len(samplings) > MAX_SWEEP:
            raise self.err(f"{len(prompts)} prompt(s) x {len(samplings)} sampling "
                           f"combination(s) make {len(prompts) * len(samplings)} requests",
                           "prompt", request=name, allowed=f"at most {MAX_SWEEP}")
        longest = max_prompt_len(p, spec.kind)
        for v in prompts:
            if v > longest:
                raise self.err(
                    f"prompt of {v} tokens exceeds {longest}, the longest prompt vLLM "
                    f"takes (max_model_len {p.max_model_len}"
                    + (" less the token sampled after it)" if spec.kind == "sample" else ")"),
                    "prompt", request=name, allowed=f"1..{longest}")
        if spec.kind == "pool" and not p.is_pooling_model:
            raise self.err('kind = "pool" but the runner is not a pooling model', "kind",
                           request=name, allowed='"sample" here, or add needs = ["pooling"] '
                           "to skip on such runners")
        if spec.structured_output and unmet_need(["structured_output"], p):
            raise self.err("structured_output on a runner that does not sample here",
                           "structured_output", request=name,
                           allowed='false, or add needs = ["structured_output"]')
        if spec.encoder is None:
            enc = p.max_encoder_len if p.is_encoder_decoder else 0
        else:
            enc = self.value(spec.encoder, "encoder", request=name, low=0,
                             high=p.max_encoder_len if p.is_encoder_decoder else 0)
        images, prompts = self.images(spec, name, prompts)
        total = len(self.prompt_len) + len(prompts) * len(samplings)
        if total > MAX_REQUESTS:
            self.requests_capped = True  # every later entry would say the same
            raise self.err(f"the scenario declares more than {MAX_REQUESTS} requests "
                           f"({total} with this entry)", "count" if "count" in
                           spec.model_fields_set else "prompt", request=name,
                           allowed=f"at most {MAX_REQUESTS} requests in all [requests] "
                           "entries (MAX_REQUESTS)")
        single = len(prompts) == 1 and len(samplings) == 1 and not swept \
            and spec.image_class != "each"
        ids = []
        for i, (sampling, (v, imgs)) in enumerate(
                (s, p) for s in samplings for p in zip(prompts, images)):
            rid = f"{REQ_ID_PREFIX}{self.sc.name}_{name}_" + ("" if single else f"{i}_")
            try:
                self.b.add_request(PlannedRequest(
                    req_id=rid, prompt_len=v, kind=spec.kind,
                    structured_output=spec.structured_output, encoder_len=enc,
                    sampling=sampling, images=imgs, name=name,
                    index=None if single else i,
                    skip_reading_prefix_cache=(
                        skips_prefix_cache(sampling) if spec.kind == "sample"
                        else pooling_skips_prefix_cache(p.pooling_task))))
            except PlanError as e:
                raise self.err(str(e), "prompt", request=name,
                               allowed=f"1..{longest}") from None
            ids.append(rid)
            self.prompt_len[rid] = v
            self.sampling[rid] = sampling
            self.display[rid] = name if single else f"{name}[{i}]"
        self.groups[name] = ids

    def images(self, spec: Any, name: str, prompts: list[int]
               ) -> tuple[list[tuple[int, ...]], list[int]]:
        """Each request's images (class indices) and prompt length: the
        processor's image prompt plus ``prompt`` text tokens. ``image_class =
        "each"`` declares the requests once per class."""
        p = self.p
        if spec.images is None:
            return [()] * len(prompts), prompts
        if not p.image_classes:
            raise self.err("images on a runner whose model takes no image input", "images",
                           request=name, allowed='no images here, or add needs = ["images"] '
                           "to skip on such runners")
        n = self.value(spec.images, "images", request=name, high=p.max_images_per_prompt)
        if spec.image_class == "each":
            classes = list(range(len(p.image_classes)))
        else:
            classes = [self.value(spec.image_class, "image_class", request=name, low=0,
                                  high=len(p.image_classes) - 1)]
        pairs = [(v, c) for c in classes for v in prompts]
        return ([(c,) * n for _, c in pairs],
                [v + n * p.image_classes[c].prompt_tokens for v, c in pairs])

    def select(self, selectors: list[str] | None, field: str) -> list[str]:
        """Request ids for selectors, in order, without duplicates."""
        out: list[str] = []
        seen: set[str] = set()
        names = [_SELECTOR.match(s).group(1) for s in selectors or []]  # type: ignore[union-attr]
        unknown = [n for n in dict.fromkeys(names)
                   if n not in self.groups and n not in self.failed_requests]
        if unknown:  # every one of them, as the loader says them
            declared = sorted(  # file order
                (n for n in dict.fromkeys((*self.sc.model.requests, *self.sc.refused_requests))
                 if n in self.groups or n in self.failed_requests),
                key=lambda n: self.sc.index.line(("requests", n)) or 0)
            declared += [n for n in self.groups if n not in declared]
            raise ScenarioError.of([self.err(what, field, allowed=allowed) for what, allowed in
                                    (unknown_request(n, declared) for n in unknown)])
        if self.failed_requests.intersection(names):
            raise _SelectsFailedRequest(field)
        for s in selectors or []:
            m = _SELECTOR.match(s)
            name, sub = m.group(1), m.group(2)  # type: ignore[union-attr]
            ids = self.groups[name]
            if sub is not None:
                if ":" in sub:
                    lo_s, _, hi_s = sub.partition(":")
                    lo = self.value(lo_s, field, low=None) if lo_s.strip() else 0
                    hi = self.value(hi_s, field, low=None) if hi_s.strip() else len(ids)
                    picked = ids[lo:hi]
                    if not picked:
                        raise self.err(f"{s!r} selects no request ({name} has {len(ids)})",
                                       field, allowed=f"a non-empty slice of 0..{len(ids)}")
                else:
                    i = self.value(sub, field, low=None)
                    if not -len(ids) <= i < len(ids):
                        raise self.err(f"{s!r}: index {i} out of range ({name} has "
                                       f"{len(ids)} request(s))", field,
                                       allowed=f"0..{len(ids) - 1}")
                    picked = [ids[i]]
            else:
                picked = ids
            for r in picked:
                if r not in seen:
                    seen.add(r)
                    out.append(r)
        return out

    # -- steps -----------------------------------------------------------------
    def check_step_limit(self, field: str) -> None:
        """Raises ScenarioError when the entry already expanded to its limit."""
        if self.b.next_index >= self._limit:
            raise self.err(f"the scenario expands to more than {self._limit} steps",
                           field, allowed=f"at most {MAX_EXPANDED} steps per [[steps]] entry")
        if self.b.next_index >= MAX_STEPS:
            self.steps_capped = True
            raise self.err(f"the scenario expands to more than {MAX_STEPS} steps", field,
                           allowed=f"at most {MAX_STEPS} steps in all [[steps]] entries "
                           "(MAX_STEPS)")

    def run_step(self, kind: str, label: str, field: str,
                 selected_by: Mapping[str, str] | None = None, **kw: Any) -> None:
        """Plan one step; a :class:`PlanError` becomes the entry's error on
        ``field``, or on the selector that holds the request it names
        (``selected_by``: request id -> field, for steps of several selectors)."""
        self.check_step_limit(field)
        try:
            self.b.step(kind, label, **kw)  # type: ignore[arg-type]
        except PlanError as e:
            named = {f for rid, f in (selected_by or {}).items() if repr(rid) in e.reason}
            raise self.plan_err(e, named.pop() if len(named) == 1 else field) from None
        if self.b.next_index > self._limit:  # parts the builder deferred
            self.check_step_limit(field)

    def plan_err(self, e: PlanError, field: str) -> ScenarioError:
        key = {"spec_tokens": "spec_tokens", "prefix_hit": "cached"}.get(e.field or "", field)
        if self.rep > 0:
            key = "repeat"  # the first run passed: repeating is what the builder refuses
        elif e.field == "tokens":
            st = self.st
            if getattr(st, "tokens", None) is not None:
                key = "tokens"
            elif getattr(st, "repeat", 1) != 1:
                key = "repeat"
        if key not in (STEP_MODELS[self.kind].model_fields if self.kind else {}):
            key = field
        allowed = _ALLOWED_BY_FIELD.get(e.field or "", "see scenarios/README.md").format(
            p=self.p, blocks=self.p.num_blocks - 1)
        msg = e.reason
        if e.limit == "max_num_seqs" and getattr(self.st, "batch", None) is not None:
            # a batch (or a sweep's point) past max_num_seqs
            key = "batch"
            allowed = f"batches of at most max_num_seqs = {self.p.max_num_seqs}"
        for rid, name in self.display.items():  # ids named in the reason, as written
            if rid in msg:
                msg = msg.replace(repr(rid), repr(name))
        if e.step is not None and e.step != self.step_i and isinstance(self.b, PlanBuilder):
            msg += f" (expanded plan step {e.step})"
        return self.err(msg, key, allowed=allowed)

    def expand(self) -> Plan:
        """The plan, or every error of the scenario's entries, in file order.

        An entry that fails does not stop the others: the entries after it
        are expanded against :class:`_ProgressUnknown`, which checks what
        holds whatever the failed entry would have left (fields, sizes,
        sweeps, selectors, the per-step limits), and the message ends with
        one line saying so.

        Raises:
            ScenarioError: every ``[requests]`` entry that cannot be declared
                (the steps are then checked as after a failed step, those
                selecting a failed entry's requests not at all), and every
                ``[[steps]]`` entry that cannot be expanded.
        """
        errors, note = self.declare_and_expand_steps()
        if errors:
            raise ScenarioError.of(errors, note=note)
        try:
            self.b.cleanup("cleanup (auto)")
        except PlanError as e:  # pragma: no cover - finishing never fails
            raise self.err(str(e), None) from None
        return self.b.build()

    def declare_and_expand_steps(self) -> tuple[list[ScenarioError], str]:
        """:meth:`declare`, then :meth:`expand_steps`; where some
        ``[requests]`` entries cannot be declared, the steps are planned up to
        the first that selects a request of a failed entry (not checked), and
        checked after it as after a failed step (:class:`_ProgressUnknown`);
        where a step fails or was not checked, one last line says which were
        checked in part or not at all (scenarios/README.md: "not checked, and
        named by the last line").

        Returns:
            The request entries' errors, then the steps', and the note line.
        """
        declared: list[ScenarioError] = []
        try:
            self.declare()
        except ScenarioError as d:
            if self.requests_capped:  # every step would name a capped entry
                return list(d.errors), ""
            declared = list(d.errors)
        if not self.failed_requests:  # (the format's refused entries count as failed)
            return self.expand_steps()
        # Planned for real up to the first step that selects a failed entry's
        # request (the others' lifecycle does not depend on it), then as after
        # a failed step (expand_steps).
        errors, _ = self.expand_steps()
        if not errors and not self.steps_unchecked:  # the request errors alone
            return declared, ""
        # a step that failed of itself also left the steps after it checked in part
        failed_step = min((e.step for e in errors if e.step is not None), default=None)
        after = failed_step is not None and any(i > failed_step for i in self._numbers())
        return [*declared, *errors], (
            f"{self.sc.file}: the steps were checked only as far as they do not depend on "
            f"the requests above that failed ({', '.join(sorted(self.failed_requests))})"
            + (f" or on step {failed_step}, which failed" if after else "") + "; "
            + (f"not checked: step{'s' if len(self.steps_unchecked) > 1 else ''} "
               f"{', '.join(map(str, self.steps_unchecked))}, which "
               f"select{'' if len(self.steps_unchecked) > 1 else 's'} them; "
               if self.steps_unchecked else "")
            + "fix the errors above and check again")

    def _numbers(self) -> Sequence[int]:
        """Each ``[[steps]]`` entry's index in the file (the format may have
        refused some: :attr:`LoadedScenario.step_numbers`)."""
        return self.sc.step_numbers or range(len(self.sc.model.steps))

    def expand_steps(self) -> tuple[list[ScenarioError], str]:
        """Expand every ``[[steps]]`` entry, collecting the errors.

        Returns:
            Every entry's errors in file order, and the line that says which
            entries were checked only in part ("" if none were).
        """
        errors: list[ScenarioError] = []
        failed: int | None = self.sc.invalid_from
        numbers = self._numbers()
        for i, st in zip(numbers, self.sc.model.steps):
            # after a refused entry (the format's, or one that failed here)
            if failed is not None and i > failed and not isinstance(self.b, _ProgressUnknown):
                # duck-typed: the builder methods the step handlers call
                self.b = cast(PlanBuilder, _ProgressUnknown(self.b))
            try:
                self._entry(i, st)
            except _SelectsFailedRequest:
                self.steps_unchecked.append(i)
                # what it schedules is unknown (declare_and_expand_steps says
                # so): the steps after it are checked as after a failed one
                failed = i if failed is None else min(failed, i)
                continue
            except ScenarioError as e:
                errors.extend(e.errors)
                failed = i if failed is None else min(failed, i)
                if self.steps_capped:  # every later entry would say the same
                    break
        self.step_i = self.kind = self.st = None
        if failed is None or not any(i > failed for i in numbers):
            return errors, ""
        return errors, (f"{self.sc.file}: the steps after step {failed} were checked only as "
                        "far as they do not depend on it (which requests run, how far along, "
                        "their blocks): fix the errors above and check again")

    def _entry(self, i: int, st: Any) -> None:
        """Expand ``[[steps]]`` entry ``i`` (its index in the file)."""
        self.step_i, self.kind, self.st = i, st.kind, st
        self._limit = self.b.next_index + MAX_EXPANDED
        reps = (self.value(st.repeat, "repeat", high=MAX_EXPANDED, fixed_high=True)
                if st.kind in _REPEATED_WHOLE else 1)
        for self.rep in range(reps):
            getattr(self, f"_{st.kind}")(st)
        self.rep = 0

    def _short(self, ids: list[str]) -> str:
        names = [self.display[r] for r in ids]
        return ",".join(names) if len(names) <= 3 else f"{names[0]}..{names[-1]} ({len(names)})"

    def _batches(self, st: Any) -> list[list[str]]:
        ids = self.select(st.requests, "requests")
        if st.batch is None:
            return [ids]
        out = []
        for n in self.sizes(st.batch, "batch", high=len(ids)):
            if n > len(ids):
                raise self.err(f"batch {n} but the step selects {len(ids)} request(s)",
                               "batch", allowed=f"1..{len(ids)}")
            out.append(ids[:n])
        return out

    def _prefill_like(self, st: Any, kind: str) -> None:
        finish_previous = getattr(st, "finish_previous", False)
        if finish_previous and not st.each:
            raise self.err("finish_previous = true without each = true", "finish_previous",
                           allowed="finish_previous = true only with each = true (one step "
                           "per request)")
        previous: tuple[str, ...] = ()
        for ids in self._batches(st):
            token_values = [None] if st.tokens is None else self.sizes(st.tokens, "tokens")
            for tokens in token_values:
                for group in ([[r] for r in ids] if st.each else [ids]):
                    step_kind = kind
                    if kind == "prefix_hit" and self.rep == 0:
                        if not self._hit(group, st.cached):
                            step_kind = "prefill"  # as the scheduler makes it: no hit
                    elif kind == "prefix_hit":  # a repeat continues the prefill
                        step_kind = "prefill"
                    sched = {r: tokens if tokens is not None else self._prompt_left(r)
                             for r in group}
                    def make_label(ids: list[str], kind=kind, tokens=tokens) -> str:
                        return st.label or (
                            f"{kind.replace('_', ' ')} {self._short(ids)} x "
                            + ("rest" if tokens is None else str(tokens)))
                    # A prefix_hit step's requests that MambaManager leaves
                    # waiting run in the next steps (PlanBuilder.step), each
                    # part labelled by the requests it runs.
                    finish = tuple(r for r in previous if r not in sched)
                    self.run_step(step_kind, make_label(group), "requests", prefill=sched,
                                  relabel=make_label, finish=finish)
                    if finish_previous:
                        previous = tuple(group)

    def _hit(self, ids: list[str], cached_expr: Any) -> bool:
        """Requests ``ids`` arrive with ``cached`` prompt tokens in the prefix
        cache, those that read it: a request that reads no prefix cache
        (``skip_reading_prefix_cache``: a sampling preset with prompt
        logprobs, a per-token pooling task) gets no hit and is a plain
        prefill, as vLLM's scheduler makes it. A sampling table that asks for
        both ``prompt_logprobs`` and a hit is refused, and so is a step none
        of whose requests reads the cache (it would be a plain prefill under
        a prefix hit's name: a first-contact trial copied the format's
        example, whose requests sampled with the default preset); ``cached``
        is within every request's prompt either way.

        Returns:
            Whether any of ``ids`` got a hit.
        """
        hit = False
        cached = self.value(cached_expr, "cached", low=1)
        g = self.facts["lcm_block_size"]
        if cached % g:
            raise self.err(f"cached {cached} is not a whole number of blocks",
                           "cached", allowed=f"a multiple of lcm_block_size = {g}")
        for r in ids:
            if has_prompt_logprobs(self.sampling.get(r, "warmup")):
                raise self.err(
                    f"request {self.display[r]!r} asks for prompt_logprobs, and vLLM never "
                    "serves such a request from the prefix cache "
                    "(SamplingParams.skip_reading_prefix_cache)", "cached",
                    allowed="prefix hits of requests without prompt_logprobs")
            n = self._prompt_len(r)
            if cached >= n:  # `cached` is at least 1 (the format's rule)
                top = (n - 1) // g * g  # the longest hit: whole blocks below the prompt's end
                raise self.err(
                    f"request {self.display[r]!r}: prefix hit of {cached} tokens must be "
                    f"shorter than its prompt (prompt_len {n})", "cached",
                    allowed=(f"{g}..{top} in steps of lcm_block_size = {g}" if top > g else
                             f"{g} (lcm_block_size)" if top == g else
                             f"none: a prompt of {n} tokens holds no whole block of "
                             f"lcm_block_size = {g} (a hit needs at least {g + 1} prompt tokens)"))
            if self.b.request(r).skip_reading_prefix_cache:
                continue
            try:
                self.b.set_computed(r, cached)
            except PlanError as e:
                raise self.plan_err(e, "cached") from None
            hit = True
        if not hit and ids:
            r = ids[0]
            why = (f"pools per token (pooling task {self.p.pooling_task!r})"
                   if self.b.request(r).kind == "pool" else
                   f"samples with {self.sampling.get(r, 'warmup')!r}, a preset that asks for "
                   "prompt logprobs (the default 'warmup' is SamplingParams.for_sampler_warmup())")
            raise self.err(
                f"no request of this prefix_hit step reads the prefix cache "
                f"(SamplingParams.skip_reading_prefix_cache): {self.display[r]!r} {why}, so "
                "vLLM's scheduler would send a plain prefill", "requests",
                allowed="requests that read the prefix cache, e.g. sampling = \"greedy\"")
        return hit

    def _prompt_left(self, rid: str) -> int:
        left = self._prompt_len(rid) - self.b.num_computed_tokens(rid)
        return left if left > 0 else 1  # let the builder say why it cannot prefill

    def _prompt_len(self, rid: str) -> int:
        return self.prompt_len[rid]

    def _prefill(self, st: PrefillStep) -> None:
        self._prefill_like(st, "prefill")

    def _chunked_prefill(self, st: ChunkedPrefillStep) -> None:
        self._prefill_like(st, "chunked_prefill")

    def _prefix_hit(self, st: PrefixHitStep) -> None:
        self._prefill_like(st, "prefix_hit")

    def _resume(self, st: ResumeStep) -> None:
        for ids in self._batches(st):
            token_values = [None] if st.tokens is None else self.sizes(st.tokens, "tokens")
            for tokens in token_values:
                # the scheduler looks a preempted request up in the prefix
                # cache when it resumes it: tokens count past its hit
                for r in ids:
                    try:
                        self.b.resume_lookup(r)
                    except PlanError as e:
                        raise self.plan_err(e, "requests") from None
                sched = {r: (tokens if tokens is not None else
                             max(1, self.b.num_tokens(r) - self.b.num_computed_tokens(r)))
                         for r in ids}
                label = st.label or f"resume {self._short(ids)}"
                self.run_step("resume", label, "requests", resume=sched)

    def _decode_like(self, st: Any, default_kind: str) -> None:
        reps = self.value(st.repeat, "repeat", high=MAX_EXPANDED, fixed_high=True)
        for k in self.sizes(st.spec_tokens, "spec_tokens", low=0):  # a sweep: a step each
            for ids in self._batches(st):
                kind = "spec_decode" if k else "decode"
                label = st.label or f"{kind.replace('_', ' ')} {self._short(ids)}" + (
                    _drafts(k) if k else "")
                for _ in range(reps):
                    self.run_step(kind, label, "requests", decode={r: k for r in ids})

    def _decode(self, st: DecodeStep) -> None:
        self._decode_like(st, "decode")

    def _no_speculator(self) -> None:
        if not self.p.has_speculator:
            raise self.err(
                f"{self.kind} step but the runner has no speculator (num_speculative_steps "
                f"{self.p.num_speculative_steps}); add needs = [\"speculator\"] to skip on "
                "such runners, or use kind = \"decode\"", "kind",
                allowed="spec_decode and mixed_decode steps only on a runner with a speculator")

    def _spec_decode(self, st: SpecDecodeStep) -> None:
        self._no_speculator()
        self._decode_like(st, "spec_decode")

    def _mixed_decode(self, st: MixedDecodeStep) -> None:
        self._no_speculator()
        reps = self.value(st.repeat, "repeat", high=MAX_EXPANDED, fixed_high=True)
        if not st.non_spec and not st.partial:
            raise self.err("a mixed_decode step needs non_spec or partial requests beside "
                           "its spec ones", "non_spec", allowed="non_spec or partial selectors")
        spec = self.select(st.spec, "spec")
        non = self.select(st.non_spec, "non_spec") if st.non_spec else []
        part = self.select(st.partial, "partial") if st.partial else []
        kp = self.value(st.partial_tokens, "partial_tokens", low=0) if part else 0
        for field, a, b in (("non_spec", spec, non), ("partial", spec, part), ("partial", non, part)):
            both = set(a) & set(b)
            if both:
                raise self.err(f"request(s) {self._short(sorted(both))} are selected twice "
                               "(spec, non_spec, partial)", field,
                               allowed="disjoint spec, non_spec and partial selections")
        for k in self.sizes(st.spec_tokens, "spec_tokens", low=0):  # a sweep: a step each
            parts = [f"{self._short(spec)}{_drafts(k)}", *([self._short(non)] if non else []),
                     *([f"{self._short(part)}{_drafts(kp)}"] if part else [])]
            label = st.label or "mixed decode " + " / ".join(parts)
            for _ in range(reps):
                self.run_step("mixed_decode", label, "spec",
                              {**{r: "spec" for r in spec}, **{r: "partial" for r in part},
                               **{r: "non_spec" for r in non}},
                              decode={**{r: k for r in spec}, **{r: kp for r in part},
                                      **{r: 0 for r in non}})

    def _mixed_prefill_decode(self, st: MixedPrefillDecodeStep) -> None:
        pre = self.select(st.prefill, "prefill")
        dec = self.select(st.decode, "decode")
        token_values = [None] if st.tokens is None else self.sizes(st.tokens, "tokens")
        spec_values = self.sizes(st.spec_tokens, "spec_tokens", low=0)
        for tokens, k in ((t, k) for t in token_values for k in spec_values):
            if st.cached is not None and self.rep == 0:
                self._hit(pre, st.cached)
            sched = {r: tokens if tokens is not None else self._prompt_left(r) for r in pre}
            label = st.label or (f"decode {self._short(dec)}{_drafts(k) if k else ''} + "
                                 + ("prefix hit " if st.cached is not None else "prefill ")
                                 + f"{self._short(pre)} x "
                                 + ("rest" if tokens is None else str(tokens)))
            self.run_step("mixed_prefill_decode", label, "prefill",
                          {**{r: "prefill" for r in pre}, **{r: "decode" for r in dec}},
                          prefill=sched, decode={r: k for r in dec})

    def _preempt(self, st: PreemptStep) -> None:
        for ids in self._batches(st):
            self.run_step("preempt", st.label or f"preempt {self._short(ids)}", "requests",
                          preempt=tuple(ids))

    def _finish(self, st: FinishStep) -> None:
        ids = (self.select(st.requests, "requests") if st.requests is not None
               else list(self.b.live_req_ids()))
        if not ids:
            raise self.err("no live request to finish", "requests",
                           allowed="finish requests that were scheduled and are not finished")
        self.run_step("finish", st.label or f"finish {self._short(ids)}", "requests",
                      finish=tuple(ids))


class _SelectsFailedRequest(Exception):
    """A step selects a request of a ``[requests]`` entry that could not be
    declared: the step is not checked (:meth:`_Expander.declare_and_expand_steps`)."""


class _ProgressUnknown:
    """The builder for the ``[[steps]]`` entries after one that failed.

    Where each request stands after a failed entry is unknown, so a later
    entry's steps are checked only against the rules that hold whatever came
    before: at most ``max_num_seqs`` requests, a prefill no longer than the
    prompt, drafts the speculator takes, and the token budget with every
    amount that depends on progress (a prefill or resumption of "the rest")
    at its least, one token. Nothing is planned; only the step count grows,
    for the caps (``MAX_EXPANDED``, ``MAX_STEPS``).
    """

    def __init__(self, b: PlanBuilder):
        self.profile = b.profile
        self.next_index = b.next_index
        self._requests = {r.req_id: r for r in b.build().requests}

    def request(self, req_id: str) -> PlannedRequest:
        """The declared request ``req_id``."""
        return self._requests[req_id]

    def live_req_ids(self) -> tuple[str, ...]:
        """Every declared request (which ones are live is unknown)."""
        return tuple(self._requests)

    def num_computed_tokens(self, req_id: str) -> int:
        """As far as a request can be and still prefill: one prompt token left."""
        return self._requests[req_id].prompt_len - 1

    def num_tokens(self, req_id: str) -> int:
        """One token past :meth:`num_computed_tokens`: a resumption's least."""
        return self._requests[req_id].prompt_len

    def set_computed(self, req_id: str, num_tokens: int) -> None:
        """A prefix hit: nothing to check without the request's state."""

    def resume_lookup(self, req_id: str) -> int:
        """A resumed request's prefix hit: unknown, taken as none
        (:meth:`num_computed_tokens` is what the sizes read)."""
        return 0

    def step(self, kind: str, label: str, *, prefill: dict[str, int] | None = None,
             decode: dict[str, int] | None = None, resume: dict[str, int] | None = None,
             **_: Any) -> None:
        """Check one step against the rules that hold in any state.

        Raises:
            PlanError: the builder's reason, as :meth:`PlanBuilder.step` gives it.
        """
        p, at = self.profile, self.next_index
        prefill, decode, resume = prefill or {}, decode or {}, resume or {}
        n = len({*prefill, *decode, *resume})
        if n > p.max_num_seqs:
            raise PlanError(too_many_seqs(n, p), step=at, field="requests", limit="max_num_seqs")
        for rid, tokens in prefill.items():
            prompt = self._requests[rid].prompt_len
            if tokens > prompt:
                raise PlanError(f"request {rid!r}: {tokens} prefill tokens scheduled but its "
                                f"prompt has {prompt}", step=at, field="tokens", request=rid)
        for rid, k in decode.items():
            why = bad_drafts(rid, k, p)
            if why:
                raise PlanError(why, step=at, field="spec_tokens", request=rid)
        total = sum(prefill.values()) + sum(1 + k for k in decode.values()) \
            + sum(resume.values())
        if total + n * p.draft_slots > p.max_num_batched_tokens:
            raise PlanError(over_token_budget(total, p, n, p.draft_slots), step=at,
                            field="tokens", limit="max_num_batched_tokens")
        self.next_index += 1


def _drafts(k: int) -> str:
    """`` +1 draft`` / `` +2 drafts``: a decode label's draft tokens per request."""
    return f" +{k} draft{'' if k == 1 else 's'}"


def _skip_reason(sc: LoadedScenario, profile: RunnerProfile) -> str | None:
    """Why ``sc`` does not run on ``profile`` (``Plan.skipped``), or None."""
    why = unmet_need(list(sc.model.needs), profile)
    if not why and profile.role != "both" and profile.role not in sc.model.roles:
        why = (f"for roles {', '.join(sc.model.roles)}: this worker's role is "
               f"{profile.role}")
    if not why and profile.is_encoder_only:
        why = "encoder-only model: vLLM warms no step"
    if not why and profile.is_pooling_model and sc.model.sequence is None and any(
            r.kind == "sample" for r in sc.model.requests.values()):
        why = "scenario samples tokens but the runner is a pooling model"
    return why or unmet_requirement(sc, profile)


def expand(sc: LoadedScenario, profile: RunnerProfile) -> Plan:
    """The plan of a loaded scenario for ``profile``.

    A scenario whose ``needs`` the runner does not meet, whose ``roles``
    leave out the worker's role (``profile.role``), one of whose
    ``requires`` comparisons is false on it (or that samples tokens on a
    pooling runner, or any scenario on an encoder-only runner) gives an
    empty plan with ``skipped`` set. A ``sequence`` scenario is the
    named :mod:`stepwarm.sequences` plan. Otherwise every request and step
    goes through :class:`PlanBuilder`; requests still live after the last
    step are finished by an appended cleanup step.

    Raises:
        ScenarioError: an expression, a limit or the request lifecycle
            rejects a step, or a ``spec_decode``/``mixed_decode`` step meets a
            runner with no speculator (file, line, step index, field, what is
            allowed).
    """
    from stepwarm import sequences

    why = _skip_reason(sc, profile)
    if why:
        return Plan(name=sc.name, requests=(), steps=(), skipped=why)
    if sc.model.sequence is not None:
        fn = {"vllm-default": sequences.default_plan,
              "vllm-warmup-kernels": sequences.warmup_kernels_plan,
              "vllm-mixed-prefill-decode": sequences.mixed_prefill_decode_plan,
              }[sc.model.sequence]
        try:
            plan = fn(profile)
        except PlanError as e:
            line = sc.index.line(("top",), "sequence")
            raise ScenarioError(
                f"{sc.file}:{line}: field 'sequence': {sc.model.sequence} cannot be built for "
                f"this runner: {e}; allowed: a runner whose limits fit vLLM's own warmup",
                file=sc.file, line=line, step=e.step, field="sequence") from None
        return dataclasses.replace(plan, name=sc.name)
    return _Expander(sc, profile).expand()


def profile_free_errors(loaded: LoadedScenario | ScenarioError) -> ScenarioError | None:
    """The errors in a scenario that no runner can mend, as ``stepwarm
    check`` words them, in file order; None if none. ``run``, ``bench``,
    ``coverage`` and ``check`` / ``show`` with an engine give them before
    vLLM is imported.

    Args:
        loaded: what :func:`~stepwarm.scenario.load.load` returned, or the
            error it raised (its format errors are kept).

    Besides the format's errors, those of the expander for a literal value
    out of its field's fixed range (``prompt = -5``): found by expanding
    against the tiny Llama's profile (the rest of a file the format refused
    in part, as :func:`load_and_expand` does) and keeping those.
    """
    from stepwarm.profile import tiny_profile

    if isinstance(loaded, ScenarioError):
        more, note = (_rest_of(loaded.partial, tiny_profile(), profile_free=True)
                      if loaded.partial is not None else ([], ""))
        # a field the format refused is not told again (an expression too
        # long for the format is too long for the expander)
        said = {(x.line, x.step, x.field) for x in loaded.errors}
        rest = [x for x in more if (x.line, x.step, x.field) not in said]
        # the last line names the requests that failed: only where their
        # errors are all told here (one left to the runner would be named
        # without its error)
        if any(not x.profile_free for x in rest):
            note = ""
        return ScenarioError.of(sorted(
            [*loaded.errors, *(x for x in rest if x.profile_free)],
            key=lambda x: x.line or 1 << 30), note=note)
    if loaded.model.sequence is not None:
        return None
    # also where the scenario's needs or requires skip it on this profile
    errors, note = _Expander(loaded, tiny_profile()).declare_and_expand_steps()
    free = [x for x in errors if x.profile_free]
    if free:  # the last line (steps left unchecked) where every error is told here
        return ScenarioError.of(free, note=note if len(free) == len(errors) else "")
    return None


def load_checked(name: str) -> tuple[LoadedScenario | None, ScenarioError | None]:
    """:func:`~stepwarm.scenario.load.load` ``name``, with the errors no
    runner can mend (:func:`profile_free_errors`; a built-in is checked
    against every runner by the test suite): the scenario, or the error
    naming every such fault, as ``stepwarm check`` says them. What ``run``,
    ``coverage``, ``bench`` and the plugin's start-up check before an
    engine (or the model) is loaded."""
    builtin = name in builtin_names()
    try:
        scenario = load(name)
    except ScenarioError as e:
        return None, e if builtin else profile_free_errors(e) or e
    free = None if builtin else profile_free_errors(scenario)
    return (scenario, None) if free is None else (None, free)


def load_and_expand(name: str, profile: RunnerProfile) -> Plan:
    """:func:`~stepwarm.scenario.load.load` and :func:`expand` ``name`` for
    ``profile``.

    Where the format refused only some ``[[steps]]`` entries, the others are
    still expanded (as far as they do not depend on the refused ones), so
    that one message lists the format's errors and the runner's together.

    Raises:
        ScenarioError: every error found, in file order.
    """
    try:
        sc = load(name)
    except ScenarioError as e:
        more, note = _rest_of(e.partial, profile) if e.partial is not None else ([], "")
        if not more and not note:
            raise
        # a field the format refused is not told again (an expression's
        # names, one too long: the format's and ours)
        said = {(x.line, x.step, x.field) for x in e.errors}
        errors = sorted([*e.errors, *(x for x in more if (x.line, x.step, x.field) not in said)],
                        key=lambda x: x.line or 1 << 30)
        raise ScenarioError.of(errors, note=note) from None
    plan = expand(sc, profile)
    if plan.skipped and name not in builtin_names():  # (the built-ins are tested)
        # skipped here, still wrong on every runner: said now, not where it runs
        free = profile_free_errors(sc)
        if free is not None:
            raise free
    return plan


def _rest_of(partial: LoadedScenario, profile: RunnerProfile, *, profile_free: bool = False
             ) -> tuple[list[ScenarioError], str]:
    """The errors of the ``[[steps]]`` entries the format passed in a file
    where it refused others (:attr:`ScenarioError.partial`), and the line
    saying which were checked in part; none where the scenario would be
    skipped on ``profile`` (``profile_free``: checked all the same, for the
    errors no runner mends). Requests that cannot be declared are errors too
    (:meth:`_Expander.declare_and_expand_steps`)."""
    try:
        if partial.model.sequence is not None or (_skip_reason(partial, profile)
                                                  and not profile_free):
            return [], ""
    except ScenarioError as d:  # a requires the runner refuses
        if not profile_free:
            return list(d.errors), ""
    return _Expander(partial, profile).declare_and_expand_steps()


def plans_for(names: list[str], profile: RunnerProfile) -> list[Plan]:
    """Load and expand every scenario named (built-in names or ``.toml`` paths)
    for ``profile``, all of them before any runs.

    A set name (``all``) stands for its members
    (:func:`~stepwarm.scenario.load.resolve_names`).

    Raises:
        ScenarioError: every scenario that cannot be loaded or expanded (each
            with all its errors, in the order named), or a runner stepwarm
            cannot run on at all (``profile.unsupported``: the installed
            vLLM's reason, before any scenario is loaded).
    """
    if profile.unsupported:
        raise ScenarioError(f"stepwarm cannot run on this runner: {profile.unsupported}",
                            field="profile")
    results = check(names, profile)
    bad = [r for _, r in results if isinstance(r, ScenarioError)]
    if bad:
        raise bad[0] if len(bad) == 1 else ScenarioError(
            "\n".join(str(e) for e in bad), file=bad[0].file, line=bad[0].line,
            step=bad[0].step, field=bad[0].field, errors=[x for e in bad for x in e.errors])
    return [r for _, r in results if not isinstance(r, ScenarioError)]


def check(names: list[str], profile: RunnerProfile, *, builtins_tested: bool = False
          ) -> list[tuple[str, Plan | ScenarioError]]:
    """Load and expand each scenario, collecting errors instead of raising.

    ``builtins_tested``: ``profile`` is the packaged tiny-Llama one, on which
    the test suite checks every built-in against vLLM: their sampling tables
    are not put to vLLM's ``SamplingParams`` again (which imports vLLM).

    Returns:
        (name, plan or the error) per name, in order.
    """
    out: list[tuple[str, Plan | ScenarioError]] = []
    total = 0
    builtins = set(builtin_names()) if builtins_tested else set()
    with collector_paused():
        for name in resolve_names(names):
            try:
                with vllm_check_skipped() if name in builtins else contextlib.nullcontext():
                    plan = load_and_expand(name, profile)
            except ScenarioError as e:
                out.append((name, e))
                continue
            total += len(plan.steps)
            if total > MAX_STARTUP_STEPS:  # the rest is not expanded, nor held
                out.append((name, too_many_steps(name, len(plan.steps), total)))
                break
            out.append((name, plan))
    return out


def too_many_steps(name: str, steps: int, total: int) -> ScenarioError:
    """The error for scenario ``name`` (``steps`` steps) taking the scenarios
    of a start-up to ``total`` steps, past :data:`MAX_STARTUP_STEPS`."""
    return ScenarioError(
        f"{name}: the scenarios named plan {total} steps with this one ({steps} steps), more "
        f"than the {MAX_STARTUP_STEPS} one start-up may plan (MAX_STARTUP_STEPS); allowed: "
        "fewer or smaller scenarios; nothing ran, and the scenarios named after it were not "
        "checked", file=name, field="steps")
