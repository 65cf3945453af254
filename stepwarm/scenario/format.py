"""The scenario format: pydantic models of a scenario file, the single source of
the format (validation, ``stepwarm schema``'s JSON Schema and the documentation).

A scenario is one TOML file: what it ``needs`` from the runner, the
``[requests.NAME]`` it declares and the ordered ``[[steps]]`` that schedule
them (see ``scenarios/README.md``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Union, get_type_hints

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, field_validator

from stepwarm.expressions import check_condition_names
from stepwarm.scenario.sampling import PRESET_HELP, Sampling
from stepwarm.scenario.sweeps import MAX_SWEEP, SIZE_HELP, Expr, Size, within


#: Most requests one ``[requests.NAME]`` entry may declare with ``count``
#: (as many as a sweep's values: ``count = "max_num_seqs"`` on a 4096-seq runner).
MAX_COUNT = MAX_SWEEP
#: Most plan steps one ``[[steps]]`` entry may expand to (as many as a sweep's values).
MAX_EXPANDED = MAX_SWEEP
#: Most requests one scenario may declare, all ``[requests.NAME]`` entries together
#: (4 x the largest ``max_num_seqs`` a built-in fills; accepting them takes ~0.5 s).
MAX_REQUESTS = 4 * MAX_SWEEP
#: Most plan steps one scenario may expand to, all ``[[steps]]`` entries together
#: (the built-ins expand to at most ~70; planning takes ~1 ms a step).
MAX_STEPS = MAX_SWEEP
#: Most plan steps all the scenarios of one start-up (``STEPWARM_SCENARIOS``,
#: ``run``'s ``-s``) may expand to together: two of the largest scenarios
#: (``all`` plans at most ~160 on the runners measured). Expansion stops at the
#: scenario that crosses it, so no more than this and one scenario is held.
MAX_STARTUP_STEPS = 2 * MAX_STEPS
#: The longest word a ``label`` or ``description`` may hold: reports wrap
#: them at spaces, and a longer word would run past an 80-column line.
MAX_WORD = 60


def _report_text(value: str) -> str:
    """A ``label`` / ``description``: printable text (a control character,
    an escape sequence above all, would reach the terminal as it is), its
    words at most :data:`MAX_WORD` terminal columns wide."""
    bad = sorted({c for c in value if not c.isprintable()})
    if bad:
        raise ValueError(f"holds control character(s) {', '.join(repr(c) for c in bad)}; "
                         "allowed: printable text on one line")
    from rich.cells import cell_len

    # by terminal cells: a wide (CJK, full-width) character takes two
    long = next((w for w in value.split() if cell_len(w) > MAX_WORD), None)
    if long is not None:
        raise ValueError(f"holds a word {cell_len(long)} columns wide ({long[:20]!r}...); "
                         f"allowed: words at most {MAX_WORD} columns wide, a wide (CJK) "
                         "character two (reports wrap at spaces)")
    return value


ReportText = Annotated[str, AfterValidator(_report_text)]
#: ``repeat`` and ``count``: a literal outside these limits is a format error.
Repeat = Annotated[Expr, within(1, MAX_EXPANDED)]
Count = Annotated[Expr, within(1, MAX_COUNT)]
#: Largest scenario file read, in bytes (the built-ins are under 8 KiB).
MAX_FILE_BYTES = 1 << 20
#: Deepest nesting of arrays, inline tables and dotted keys in a scenario file
#: (the format itself needs at most 7; Python's TOML parser recurses per level).
MAX_NESTING = 32


Need = Literal["speculator", "mamba_align", "encoder_decoder", "pooling", "structured_output",
               "images", "spec_top_k_top_p", "prefix_caching"]
Sequence = Literal["vllm-default", "vllm-warmup-kernels", "vllm-mixed-prefill-decode"]

_REPEAT_HELP = ("Run the step this many times, each continuing from the last (a "
                "prefill with tokens = N: consecutive chunks of N).")


_SELECTOR = re.compile(r"^\s*([A-Za-z][A-Za-z0-9_-]*)\s*(?:\[([^\]]*)\])?\s*$")
_SEL_HELP = ('request names declared under [requests]: "NAME" (all of its count), '
             '"NAME[i]", or "NAME[i:j]" (i, j expressions)')


def _check_selectors(v: list[str]) -> list[str]:
    for s in v:
        if not _SELECTOR.match(s):
            raise ValueError(f"{s!r} is not a request selector; allowed: {_SEL_HELP}")
    return v


Selectors = Annotated[list[str], Field(min_length=1, description=_SEL_HELP)]


class RequestSpec(BaseModel):
    """``[requests.NAME]``: one or ``count`` identical requests."""

    model_config = ConfigDict(extra="forbid")
    prompt: Size = Field(description="Prompt length in tokens: " + SIZE_HELP
                         + ". A sweep declares one request per value.")
    count: Count = Field(default=1, description=f"How many such requests (1..{MAX_COUNT}).")
    kind: Literal["sample", "pool"] = Field(
        default="sample", description="\"sample\" (SamplingParams) or \"pool\" (PoolingParams; needs pooling).")
    sampling: Sampling = Field(
        default="warmup", description="A preset: " + PRESET_HELP + "; or a table of "
        "SamplingParams fields ({ top_k = 5, temperature = 0.8 }), whose swept fields declare one request "
        "per combination.")
    structured_output: StrictBool = Field(
        default=False, description="Sample with an all-ones grammar bitmask (needs structured_output).")
    encoder: Expr | None = Field(
        default=None, description="Encoder input tokens (needs encoder_decoder); default "
        "max_encoder_len on encoder-decoder runners, else none.")
    images: Expr | None = Field(
        default=None, description="Images per request (needs images), 1..max_images_per_prompt; "
        "the prompt then holds the processor's image placeholders, followed by `prompt` text "
        "tokens. The request is prefilled in one step, with its encoder inputs.")
    image_class: Union[Expr, Literal["each"]] = Field(
        default=0, description="Which image-size class of the model's processor (0 = the "
        "smallest, num_image_classes - 1 = the largest), or \"each\": one request per class.")


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: ReportText | None = Field(default=None, description="Text for reports (default: generated).")


class _Scheduling(_Step):
    requests: Selectors
    batch: Size | None = Field(
        default=None, description="Schedule only the first N selected requests; with "
        "{ buckets = ... } one step per N.")

    _check = field_validator("requests")(_check_selectors)


class PrefillStep(_Scheduling):
    """Prefill waiting requests (or continue a chunked prefill) in one step."""

    kind: Literal["prefill"]
    tokens: Size | None = Field(default=None, description="Prompt tokens per request "
                                "(default: the rest of the prompt): " + SIZE_HELP)
    each: StrictBool = Field(default=False, description="One step per selected request.")
    finish_previous: StrictBool = Field(default=False, description=(
        "With each = true: each step also finishes the request the step before it "
        "prefilled (its finished_req_ids), so one request slot suffices; the last "
        "stays running."))
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


class ChunkedPrefillStep(_Scheduling):
    """One chunk of a prefill, continuing from ``num_computed_tokens``."""

    kind: Literal["chunked_prefill"]
    tokens: Size = Field(description="Chunk length per request: " + SIZE_HELP)
    each: StrictBool = Field(default=False, description="One step per selected request.")
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


class PrefixHitStep(_Scheduling):
    """Prefill of new requests whose first ``cached`` tokens hit the prefix cache."""

    kind: Literal["prefix_hit"]
    cached: Expr = Field(description="Tokens already cached: a multiple of lcm_block_size, "
                         "below the prompt length.")
    tokens: Size | None = Field(default=None, description="Tokens to compute per request "
                                "(default: the rest of the prompt): " + SIZE_HELP)
    each: StrictBool = Field(default=False, description="One step per selected request.")
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


_SPEC_SWEEP = (" An expression, or a sweep ({ values = [...] }, { range = [...] }, "
               "{ buckets = ... }; values may be 0) making one step per value.")


class DecodeStep(_Scheduling):
    """Decode running requests: ``1 + spec_tokens`` tokens each."""

    kind: Literal["decode"]
    spec_tokens: Size = Field(default=0, description="Draft tokens per request (needs speculator if > 0)." + _SPEC_SWEEP)
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


class SpecDecodeStep(_Scheduling):
    """Decode with ``spec_tokens`` draft tokens per request."""

    kind: Literal["spec_decode"]
    spec_tokens: Size = Field(default="num_spec_steps", description="Draft tokens per request." + _SPEC_SWEEP)
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


class MixedDecodeStep(_Step):
    """One decode step with spec requests (drafts) and non-spec requests (no drafts)."""

    kind: Literal["mixed_decode"]
    spec: Selectors = Field(description="Requests decoded with drafts. " + _SEL_HELP)
    non_spec: Selectors = Field(default_factory=list, description=(
        "Requests decoded without drafts (may be left out when `partial` is given). " + _SEL_HELP))
    spec_tokens: Size = Field(default="num_spec_steps", description="Draft tokens per spec request." + _SPEC_SWEEP)
    partial: Selectors = Field(default_factory=list, description=(
        "Requests decoded with fewer drafts in the same step (the scheduler "
        "sends a request fewer drafts when its proposer found fewer). " + _SEL_HELP))
    partial_tokens: Expr = Field(default="max(1, num_spec_steps - 1)",
                                 description="Draft tokens per partial request.")
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)

    _check = field_validator("spec", "non_spec", "partial")(_check_selectors)


class MixedPrefillDecodeStep(_Step):
    """One step that prefills some requests and decodes others."""

    kind: Literal["mixed_prefill_decode"]
    prefill: Selectors = Field(description="Requests prefilled. " + _SEL_HELP)
    tokens: Size | None = Field(default=None, description="Prefill tokens per request "
                                "(default: the rest of the prompt): " + SIZE_HELP)
    decode: Selectors = Field(description="Running requests decoded. " + _SEL_HELP)
    spec_tokens: Size = Field(default=0, description="Draft tokens per decoded request." + _SPEC_SWEEP)
    cached: Expr | None = Field(default=None, description=(
        "New prefilled requests whose first `cached` tokens hit the prefix cache: a multiple "
        "of lcm_block_size, below the prompt length (a prefix hit beside decodes)."))
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)

    _check = field_validator("prefill", "decode")(_check_selectors)


class PreemptStep(_Scheduling):
    """Preempt running requests (blocks freed, progress reset)."""

    kind: Literal["preempt"]


class ResumeStep(_Scheduling):
    """Resume preempted requests: recompute prompt + outputs (or a chunk)
    past the prefix-cache hit vLLM's scheduler finds for them."""

    kind: Literal["resume"]
    tokens: Size | None = Field(default=None, description="Tokens per request (default: all "
                                "of prompt + outputs past the request's prefix-cache hit, "
                                "found as vLLM's scheduler finds it on resumption): "
                                + SIZE_HELP)
    repeat: Repeat = Field(default=1, description=_REPEAT_HELP)


class FinishStep(_Step):
    """Finish requests (``finished_req_ids``); default every live request."""

    kind: Literal["finish"]
    requests: Selectors | None = Field(default=None, description="Default: all live requests.")

    _check = field_validator("requests")(lambda v: v if v is None else _check_selectors(v))


Step = Annotated[
    Union[PrefillStep, ChunkedPrefillStep, PrefixHitStep, DecodeStep, SpecDecodeStep,
          MixedDecodeStep, MixedPrefillDecodeStep, PreemptStep, ResumeStep, FinishStep],
    Field(discriminator="kind"),
]
STEP_MODELS: dict[str, type[BaseModel]] = {
    m.model_fields["kind"].annotation.__args__[0]: m  # type: ignore[union-attr]
    for m in (PrefillStep, ChunkedPrefillStep, PrefixHitStep, DecodeStep, SpecDecodeStep,
              MixedDecodeStep, MixedPrefillDecodeStep, PreemptStep, ResumeStep, FinishStep)
}


def _selects(hint: Any) -> bool:
    return hint == Selectors or Selectors in getattr(hint, "__args__", ())


#: The step fields that select requests (typed :data:`Selectors`), over every step kind.
SELECTOR_FIELDS: tuple[str, ...] = tuple(dict.fromkeys(
    name for m in STEP_MODELS.values()
    for name, hint in get_type_hints(m, include_extras=True).items() if _selects(hint)))


def _comparison(cond: str) -> str:
    """A ``requires`` entry whose names and operators are allowed
    (:func:`~stepwarm.expressions.check_condition_names`)."""
    check_condition_names(cond)
    return cond


class ScenarioFile(BaseModel):
    """One scenario file (the top-level TOML table)."""

    model_config = ConfigDict(extra="forbid", title="stepwarm scenario")
    description: ReportText = Field(default="", description="One line for `stepwarm list`.")
    needs: list[Need] = Field(default_factory=list, description=(
        "Runner features the scenario needs; without them it is skipped, not failed."))
    # each comparison's names and operators with the format (an error per
    # entry), whatever needs says: a scenario skipped for its needs would
    # otherwise hide them
    requires: list[Annotated[str, AfterValidator(_comparison)]] = Field(
        default_factory=list, description=(
        "Comparisons over runner facts, e.g. \"max_num_seqs >= 2\"; the scenario is "
        "skipped (not failed) on a runner where one is false."))
    roles: list[Literal["prefill", "decode"]] = Field(
        default_factory=lambda: ["prefill", "decode"], min_length=1, description=(
            "Worker roles in disaggregated serving the scenario is for. A decode-only "
            "worker (kv_role \"kv_consumer\") skips scenarios without \"decode\" "
            "(long prefills, encoder inputs); a prefill-only worker (\"kv_producer\") "
            "skips those without \"prefill\"."))
    sequence: Sequence | None = Field(default=None, description=(
        "Delegate to one of vLLM's own warmup sequences (stepwarm.sequences) "
        "instead of [requests]/[[steps]]."))
    requests: dict[str, RequestSpec] = Field(default_factory=dict, description=(
        "[requests.NAME] tables; NAME is letters, digits, _ and -."))
    steps: list[Step] = Field(default_factory=list, description="[[steps]] tables, in order.")

    @field_validator("requests")
    @classmethod
    def _names(cls, v: dict[str, RequestSpec]) -> dict[str, RequestSpec]:
        for name in v:
            if not _REQUEST_NAME.fullmatch(name):
                raise ValueError(f"bad request name {name!r}; allowed: {_NAME_HELP}")
        return v


_REQUEST_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_NAME_HELP = "a letter, then letters, digits, _ and - (e.g. [requests.long_1])"


#: The integer bounds of each size field, for the JSON Schema (the loader and
#: the expander check the same, in their own words: an expression's value too).
INTEGER_BOUNDS: dict[str, tuple[int, int | None]] = {
    "prompt": (1, None), "tokens": (1, None), "batch": (1, None), "spec_tokens": (0, None),
    "cached": (1, None), "count": (1, MAX_COUNT), "repeat": (1, MAX_EXPANDED)}


def json_schema() -> dict[str, Any]:
    """The scenario format as JSON Schema (``ScenarioFile.model_json_schema()``),
    each size field's integer form bounded (:data:`INTEGER_BOUNDS`: an
    editor flags ``prompt = -5`` as the loader does)."""
    schema = ScenarioFile.model_json_schema()
    for model in schema.get("$defs", {}).values():
        for name, prop in model.get("properties", {}).items():
            if name not in INTEGER_BOUNDS:
                continue
            low, high = INTEGER_BOUNDS[name]
            for form in prop.get("anyOf", [prop]):
                if form.get("type") == "integer":
                    form["minimum"] = low
                    if high is not None:
                        form["maximum"] = high
    return schema
