"""Scenario files: the format (a pydantic model), the TOML loader, and expansion to plans.

A scenario is one TOML file: what it ``needs`` from the runner, the
``[requests.NAME]`` it declares and the ordered ``[[steps]]`` that schedule
them (see ``scenarios/README.md``). :class:`ScenarioFile` is the single
source of the format: it validates the parsed TOML and is exported as JSON
Schema (:func:`json_schema`, ``stepwarm schema``).

:func:`expand` turns a validated scenario into a :class:`~stepwarm.plan.Plan`
for one :class:`~stepwarm.profile.RunnerProfile`: sizes are evaluated by
:mod:`stepwarm.expressions`, every step goes through
:class:`~stepwarm.plan.PlanBuilder` (so lifecycle and limit errors are the
builder's), and errors become a :class:`ScenarioError` naming the file, the
line, the step index and the field. :func:`plans_for` expands every
scenario named before any of them runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
)

from stepwarm.expressions import (
    ExpressionError,
    block_sizes_of,
    buckets,
    evaluate,
    evaluate_condition,
    facts_of,
    functions_of,
)
from stepwarm.plan import REQ_ID_PREFIX, Plan, PlanBuilder, PlanError, PlannedRequest
from stepwarm.profile import RunnerProfile, tiny_profile  # noqa: F401 - re-exported

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Most requests one ``[requests.NAME]`` entry may declare.
MAX_COUNT = 1024
#: Most plan steps one ``[[steps]]`` entry may expand to.
MAX_EXPANDED = 1024


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names file, line, step and field.

    Attributes:
        file: the scenario file (or name).
        line: 1-based line in the file, or None where it cannot be told.
        step: index of the ``[[steps]]`` entry (from 0), or None.
        field: the TOML key, or None.
    """

    def __init__(self, message: str, *, file: str = "", line: int | None = None,
                 step: int | None = None, field: str | None = None):
        super().__init__(message)
        self.file, self.line, self.step, self.field = file, line, step, field


# --------------------------------------------------------------------------
# The format.

Need = Literal["speculator", "mamba_align", "encoder_decoder", "pooling", "structured_output"]
Sequence = Literal["vllm-default", "vllm-warmup-kernels", "vllm-mixed-prefill-decode"]

_EXPR_HELP = ('an integer, or an expression string over runner facts such as '
              '"max_num_batched_tokens // 2" or "block_size(0) * 2"')
_SIZE_HELP = _EXPR_HELP + ', or { buckets = "<limit expression>" } (Triton classes 1, 16k, neither)'


def _check_expr(v: Any) -> Any:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"got {type(v).__name__} {v!r}; allowed: {_EXPR_HELP}")
    return v


def _check_size(v: Any) -> Any:
    if isinstance(v, dict):
        extra = set(v) - {"buckets", "min"}
        if extra or "buckets" not in v:
            raise ValueError(
                f"got table with keys {sorted(v)}; allowed: {{ buckets = \"<limit>\" }} "
                "with an optional min = <expression>")
        for k in v:
            _check_expr(v[k])
        return Buckets(**v)
    return _check_expr(v)


Expr = Annotated[Union[int, str], BeforeValidator(_check_expr)]


class Buckets(BaseModel):
    """A size swept over Triton's specialization classes: 1, a multiple of 16
    and neither, within ``min..buckets`` (see ``stepwarm.expressions.buckets``)."""

    model_config = ConfigDict(extra="forbid")
    buckets: Expr = Field(description="Upper limit (expression), e.g. \"max_num_batched_tokens\".")
    min: Expr = Field(default=1, description="Lower limit (expression).")


Size = Annotated[Union[int, str, Buckets], BeforeValidator(_check_size)]

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
    prompt: Size = Field(description="Prompt length in tokens: " + _SIZE_HELP
                         + ". A bucket sweep declares one request per value.")
    count: Expr = Field(default=1, description=f"How many such requests (1..{MAX_COUNT}).")
    kind: Literal["sample", "pool"] = Field(
        default="sample", description="\"sample\" (SamplingParams) or \"pool\" (PoolingParams; needs pooling).")
    sampling: Literal["warmup", "greedy"] = Field(
        default="warmup", description="\"warmup\": SamplingParams.for_sampler_warmup(); \"greedy\": temperature 0.")
    structured_output: StrictBool = Field(
        default=False, description="Sample with an all-ones grammar bitmask (needs structured_output).")
    encoder: Expr | None = Field(
        default=None, description="Encoder input tokens (needs encoder_decoder); default "
        "max_encoder_len on encoder-decoder runners, else none.")


class _Step(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str | None = Field(default=None, description="Text for reports (default: generated).")


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
                                "(default: the rest of the prompt). " + _SIZE_HELP)
    each: StrictBool = Field(default=False, description="One step per selected request.")


class ChunkedPrefillStep(_Scheduling):
    """One chunk of a prefill, continuing from ``num_computed_tokens``."""

    kind: Literal["chunked_prefill"]
    tokens: Size = Field(description="Chunk length per request. " + _SIZE_HELP)
    each: StrictBool = Field(default=False, description="One step per selected request.")


class PrefixHitStep(_Scheduling):
    """Prefill of new requests whose first ``cached`` tokens hit the prefix cache."""

    kind: Literal["prefix_hit"]
    cached: Expr = Field(description="Tokens already cached: a multiple of lcm_block_size, "
                         "below the prompt length.")
    tokens: Size | None = Field(default=None, description="Tokens to compute per request "
                                "(default: the rest of the prompt).")
    each: StrictBool = Field(default=False, description="One step per selected request.")


class DecodeStep(_Scheduling):
    """Decode running requests: ``1 + spec_tokens`` tokens each."""

    kind: Literal["decode"]
    spec_tokens: Expr = Field(default=0, description="Draft tokens per request (needs speculator if > 0).")
    repeat: Expr = Field(default=1, description="Run the step this many times.")


class SpecDecodeStep(_Scheduling):
    """Decode with ``spec_tokens`` draft tokens per request."""

    kind: Literal["spec_decode"]
    spec_tokens: Expr = Field(default="num_spec_steps", description="Draft tokens per request.")
    repeat: Expr = Field(default=1, description="Run the step this many times.")


class MixedDecodeStep(_Step):
    """One decode step with spec requests (drafts) and non-spec requests (no drafts)."""

    kind: Literal["mixed_decode"]
    spec: Selectors = Field(description="Requests decoded with drafts. " + _SEL_HELP)
    non_spec: Selectors = Field(description="Requests decoded without drafts. " + _SEL_HELP)
    spec_tokens: Expr = Field(default="num_spec_steps", description="Draft tokens per spec request.")
    repeat: Expr = Field(default=1, description="Run the step this many times.")

    _check = field_validator("spec", "non_spec")(_check_selectors)


class MixedPrefillDecodeStep(_Step):
    """One step that prefills some requests and decodes others."""

    kind: Literal["mixed_prefill_decode"]
    prefill: Selectors = Field(description="Requests prefilled. " + _SEL_HELP)
    tokens: Size | None = Field(default=None, description="Prefill tokens per request "
                                "(default: the rest of the prompt). " + _SIZE_HELP)
    decode: Selectors = Field(description="Running requests decoded. " + _SEL_HELP)
    spec_tokens: Expr = Field(default=0, description="Draft tokens per decoded request.")

    _check = field_validator("prefill", "decode")(_check_selectors)


class PreemptStep(_Scheduling):
    """Preempt running requests (blocks freed, progress reset)."""

    kind: Literal["preempt"]


class ResumeStep(_Scheduling):
    """Resume preempted requests: recompute prompt + outputs (or a chunk)."""

    kind: Literal["resume"]
    tokens: Size | None = Field(default=None, description="Tokens per request (default: all "
                                "of prompt + outputs).")


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


class ScenarioFile(BaseModel):
    """One scenario file (the top-level TOML table)."""

    model_config = ConfigDict(extra="forbid", title="stepwarm scenario")
    description: str = Field(default="", description="One line for `stepwarm list`.")
    needs: list[Need] = Field(default_factory=list, description=(
        "Runner features the scenario needs; without them it is skipped, not failed."))
    requires: list[str] = Field(default_factory=list, description=(
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


def json_schema() -> dict[str, Any]:
    """The scenario format as JSON Schema (``ScenarioFile.model_json_schema()``)."""
    return ScenarioFile.model_json_schema()


# --------------------------------------------------------------------------
# Finding files and lines.

def builtin_dir() -> Any:
    """The packaged ``stepwarm.scenarios`` directory (a Traversable).

    Falls back to the source tree's ``scenarios/`` when stepwarm runs from a
    checkout on ``PYTHONPATH`` without being installed (e.g. on a GPU box).
    """
    try:
        return resources.files("stepwarm.scenarios")
    except ModuleNotFoundError:
        return resources.files("stepwarm").joinpath("..", "scenarios")


def builtin_names() -> list[str]:
    """Names of the built-in scenarios (``scenarios/*.toml`` without ``.toml``), sorted."""
    return sorted(p.name[:-5] for p in builtin_dir().iterdir()
                  if p.name.endswith(".toml") and not p.name.startswith("_"))


@dataclass(frozen=True)
class LoadedScenario:
    """A parsed, validated scenario file."""

    name: str
    #: Where it came from, for messages (a path, or "builtin:NAME.toml").
    file: str
    text: str
    model: ScenarioFile
    index: _TomlIndex


def load(name_or_path: str) -> LoadedScenario:
    """Read and validate a scenario: a built-in name or a path to a ``.toml`` file.

    Raises:
        ScenarioError: unknown name, unreadable file, malformed TOML, or a
            file the format rejects (file, line, step, field, what is allowed).
    """
    path = Path(name_or_path)
    if path.is_dir():
        raise ScenarioError(f"{name_or_path!r} is a directory, not a scenario file (*.toml); "
                            "allowed: a path to a .toml file or a built-in name: "
                            f"{', '.join(builtin_names())}", file=name_or_path)
    looks_like_path = name_or_path.endswith(".toml") or "/" in name_or_path \
        or (os.sep != "/" and os.sep in name_or_path)
    if looks_like_path and not path.exists():
        raise ScenarioError(f"{name_or_path}: cannot read scenario file: no such file; allowed: "
                            "a path to an existing .toml file or a built-in name: "
                            + ", ".join(builtin_names()),
                            file=name_or_path)
    if looks_like_path or path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ScenarioError(f"{name_or_path}: cannot read scenario file: "
                                f"{e.strerror or e}", file=name_or_path) from None
        except UnicodeDecodeError as e:
            raise ScenarioError(f"{name_or_path}: cannot read scenario file: not UTF-8 "
                                f"(byte {e.object[e.start]:#04x} at offset {e.start}); "
                                "allowed: TOML in UTF-8", file=name_or_path) from None
        return loads(text, str(path), path.stem)
    known = builtin_names()
    if name_or_path not in known:
        close = difflib.get_close_matches(name_or_path, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ScenarioError(f"unknown scenario {name_or_path!r}{hint}; allowed: a path to a "
                            f".toml file or a built-in name: {', '.join(known)}",
                            file=name_or_path)
    text = (builtin_dir() / f"{name_or_path}.toml").read_text(encoding="utf-8")
    return loads(text, f"scenarios/{name_or_path}.toml", name_or_path)


def loads(text: str, file: str, name: str) -> LoadedScenario:
    """Parse and validate scenario TOML ``text`` (``file`` for messages)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        line = int(m.group(1)) if m else getattr(e, "lineno", None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        col = f", column {m.group(2)}" if m else ""
        raise ScenarioError(
            f"{file}:{line or '?'}: malformed TOML{col}: {msg}; allowed: TOML 1.0 "
            "(key = value, [requests.NAME] and [[steps]] tables, see scenarios/README.md)",
            file=file, line=line) from None
    index = _TomlIndex(text)
    reqs = data.get("requests")
    if isinstance(reqs, dict):
        for rname in reqs:
            if not _REQUEST_NAME.fullmatch(rname):
                line = index.line(("requests", rname))
                raise ScenarioError(
                    f"{file}:{line or '?'}: bad request name {rname!r}; allowed: {_NAME_HELP}",
                    file=file, line=line, field="requests")
    try:
        model = ScenarioFile.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e, file, index) from None
    if model.sequence is not None and (model.requests or model.steps):
        raise ScenarioError(
            f"{file}:{index.line(('top',), 'sequence')}: field 'sequence': a scenario "
            "with sequence = ... has no [requests] or [[steps]]; allowed: one or the other",
            file=file, line=index.line(("top",), "sequence"), field="sequence")
    if model.sequence is None and not model.steps:
        raise ScenarioError(
            f"{file}:1: field 'steps': empty scenario: no [[steps]]; allowed: at least one [[steps]] "
            "table with a kind (or sequence = \"vllm-default\")", file=file, line=1,
            field="steps")
    return LoadedScenario(name=name, file=file, text=text, model=model, index=index)


class _TomlIndex:
    """Where tables and keys sit in a TOML text (tomllib keeps no positions)."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.sections: list[tuple[tuple, int, int]] = []  # key, first, last (0-based)
        current: tuple = ("top",)
        start, n_steps = 0, 0
        for i, raw in enumerate(self.lines):
            m = self._HEADER.match(raw)
            if not m:
                continue
            self.sections.append((current, start, i - 1))
            name = [p.strip().strip('"').strip("'") for p in m.group(2).split(".")]
            if m.group(1) == "[[" and name == ["steps"]:
                current = ("steps", n_steps)
                n_steps += 1
            elif name[0] == "requests" and len(name) == 2:
                current = ("requests", name[1])
            elif name == ["requests"]:
                current = ("requests",)
            else:
                current = ("other", i)
            start = i
        self.sections.append((current, start, len(self.lines) - 1))

    def line(self, section: tuple, key: str | None = None) -> int | None:
        """1-based line of ``key`` in ``section`` (or of the section header)."""
        for sec, first, last in self.sections:
            if sec != section:
                continue
            if key is not None:
                pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*[=.]")
                for i in range(first, last + 1):
                    if pat.match(self.lines[i]):
                        return i + 1
            return first + 1 if section != ("top",) else (1 if key is None else None)
        if section[0] == "requests" and len(section) == 2:
            # inline: [requests] NAME = { ... }
            return self.line(("requests",), section[1])
        return None


def _model_at(loc: tuple) -> tuple[type[BaseModel] | None, tuple, str | None]:
    """(model, TOML section, field) for a pydantic error location."""
    if loc and loc[0] == "steps" and len(loc) >= 2 and isinstance(loc[1], int):
        sec = ("steps", loc[1])
        if len(loc) >= 3 and loc[2] in STEP_MODELS:
            return STEP_MODELS[loc[2]], sec, (str(loc[3]) if len(loc) >= 4 else None)
        return None, sec, ("kind" if len(loc) >= 3 else None)
    if loc and loc[0] == "requests" and len(loc) >= 2:
        if len(loc) == 2:  # the request itself is not a table
            return None, ("requests", loc[1]), None
        return RequestSpec, ("requests", loc[1]), str(loc[2])
    return ScenarioFile, ("top",), (str(loc[0]) if loc else None)


def _where(file: str, line: int | None, sec: tuple, field: str | None,
           kind: str | None = None) -> str:
    parts = [f"{file}:{line}" if line else file]
    if sec[0] == "steps":
        parts.append(f"step {sec[1]}" + (f" ({kind})" if kind else ""))
    elif sec[0] == "requests" and len(sec) == 2:
        parts.append(f"request {sec[1]!r}")
    if field:
        parts.append(f"field {field!r}")
    return ": ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")


_TYPE_ALLOWED = {
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "list_type": "a list of strings",
    "dict_type": "a table", "model_type": "a table", "int_type": "an integer",
    "model_attributes_type": "a table",
}
#: What a section must be, where a wrong type there has a better answer.
_SECTION_ALLOWED = {
    ("steps",): "[[steps]] tables (an array of tables, each with a kind), not a [steps] table",
    ("step",): "a [[steps]] table with a kind, e.g. kind = \"prefill\"",
    ("request",): "a [requests.NAME] table, e.g. prompt = 24",
}


def _validation_error(e: ValidationError, file: str, index: _TomlIndex) -> ScenarioError:
    errors = e.errors()
    # An unknown key (a typo) explains the "missing" error that comes with it:
    # report it first.
    err = min(errors, key=lambda x: x["type"] != "extra_forbidden")
    loc = tuple(err["loc"])
    model, sec, fld = _model_at(loc)
    kind = loc[2] if sec[0] == "steps" and len(loc) >= 3 and loc[2] in STEP_MODELS else None
    typ = err["type"]
    if typ == "extra_forbidden":
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(fld or "", allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        what = f"unknown key {fld!r}{hint}; allowed keys: {', '.join(allowed)}"
    elif typ == "missing":
        desc = model.model_fields[fld].description if model and fld in model.model_fields else ""
        what = f"missing required key {fld!r}; allowed: {desc or 'see scenarios/README.md'}"
    elif typ in ("union_tag_invalid", "union_tag_not_found"):
        fld = "kind"
        tags = ", ".join(STEP_MODELS)
        got = f"unknown step kind {err['input'].get('kind')!r}" if typ == "union_tag_invalid" \
            and isinstance(err["input"], dict) else "a step without kind"
        close = difflib.get_close_matches(str(err["input"].get("kind", "")), list(STEP_MODELS), n=1) \
            if isinstance(err["input"], dict) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        what = f"{got}{hint}; allowed kinds: {tags}"
    elif typ in _TYPE_ALLOWED or typ == "literal_error":
        allowed = _TYPE_ALLOWED.get(typ) or err["msg"].removeprefix("Input should be ")
        if sec == ("top",) and fld == "steps":
            allowed = _SECTION_ALLOWED[("steps",)]
        elif sec[0] == "steps" and fld is None:
            allowed = _SECTION_ALLOWED[("step",)]
        elif sec[0] == "requests" and fld is None:
            allowed = _SECTION_ALLOWED[("request",)]
        what = f"wrong type or value {err['input']!r}; allowed: {allowed}"
        desc = model.model_fields[fld].description if model and fld in model.model_fields else ""
        what += f" ({desc})" if desc else ""
    else:
        msg = err["msg"].removeprefix("Value error, ")
        desc = ""
        if model and fld in model.model_fields and "allowed" not in msg:
            desc = model.model_fields[fld].description or ""
            desc = f"; allowed: {desc}" if desc else ""
        what = f"{msg} (got {err['input']!r}){desc}" if "got" not in msg else msg + desc
        if "allowed" not in what:
            what += "; allowed: see scenarios/README.md"
    line = index.line(sec, fld)
    more = f" ({len(errors) - 1} more error(s) in this file)" if len(errors) > 1 else ""
    return ScenarioError(f"{_where(file, line, sec, fld, kind)}: {what}{more}",
                         file=file, line=line,
                         step=sec[1] if sec[0] == "steps" else None, field=fld)


# --------------------------------------------------------------------------
# Needs.

def unmet_need(needs: list[str], profile: RunnerProfile) -> str:
    """Why ``profile`` cannot run a scenario needing ``needs`` ("" if it can)."""
    p = profile
    for need in needs:
        if need == "speculator" and not p.has_speculator:
            return f"needs speculator: runner has num_speculative_steps {p.num_speculative_steps}"
        if need == "mamba_align" and not p.has_mamba_align:
            return ("needs mamba_align: runner has no Mamba KV cache group in align mode "
                    f"(mamba_cache_mode {p.mamba_cache_mode})")
        if need == "encoder_decoder" and not (p.is_encoder_decoder and p.max_encoder_len > 0):
            return (f"needs encoder_decoder: runner's model is not encoder-decoder "
                    f"(is_encoder_decoder {p.is_encoder_decoder}, max_encoder_len {p.max_encoder_len})")
        if need == "pooling" and not p.is_pooling_model:
            return "needs pooling: runner's model is not a pooling model"
        # Not is_last_pp_rank: every pipeline rank runs the same steps (the
        # plan leaves the grammar bitmask out on non-last ranks, as vLLM's
        # warmup does), or the ranks would fall out of lockstep.
        if need == "structured_output" and p.is_pooling_model:
            return ("needs structured_output: runner does not sample tokens "
                    f"(pooling model {p.is_pooling_model})")
    return ""


def unmet_requirement(sc: LoadedScenario, profile: RunnerProfile) -> str:
    """Why ``profile`` fails one of the scenario's ``requires`` ("" if none).

    Raises:
        ScenarioError: a ``requires`` entry that is not a valid comparison
            (file, line, field 'requires', what is allowed).
    """
    facts, sizes, funcs = facts_of(profile), block_sizes_of(profile), functions_of(profile)
    for cond in sc.model.requires:
        try:
            ok, shown = evaluate_condition(cond, facts, sizes, funcs)
        except ExpressionError as e:
            line = sc.index.line(("top",), "requires")
            raise ScenarioError(f"{sc.file}:{line or '?'}: field 'requires': {e}",
                                file=sc.file, line=line, field="requires") from None
        if not ok:
            return f"requires {cond.strip()}: false on this runner ({shown})"
    return ""


# --------------------------------------------------------------------------
# Expansion.

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
    "prompt_len": "1..max_model_len = {p.max_model_len} tokens",
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
        #: request id -> "name" or "name[i]", for messages
        self.display: dict[str, str] = {}
        self.step_i: int | None = None
        self.kind: str | None = None

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
              low: int | None = 1, high: int | None = None, what: str = "") -> int:
        """Evaluate an expression and range-check it."""
        try:
            v = evaluate(expr, self.facts, self.block_sizes, self.functions)
        except ExpressionError as e:
            raise self.err(str(e), field, request=request) from None
        rng = f"{low}..{high}" if high is not None else f">= {low}"
        shown = f"{expr!r} = {v}" if isinstance(expr, str) else str(v)
        if low is not None and v < low or high is not None and v > high:
            raise self.err(f"{what or field} {shown} is out of range", field,
                           request=request, allowed=f"{rng}")
        return v

    def sizes(self, size: Any, field: str, *, request: str | None = None,
              high: int | None = None) -> list[int]:
        """A size as the list of values it stands for (one, or a bucket sweep)."""
        if isinstance(size, Buckets):
            lim = self.value(size.buckets, field, request=request, what="bucket limit")
            lo = self.value(size.min, field, request=request, what="bucket min")
            if lo > lim:
                raise self.err(f"bucket min {lo} is above the limit {lim}", field,
                               request=request, allowed="min <= buckets")
            return list(buckets(lim, lo))
        return [self.value(size, field, request=request, high=high)]

    # -- requests -------------------------------------------------------------
    def declare(self) -> None:
        p = self.p
        for name, spec in self.sc.model.requests.items():
            prompts = self.sizes(spec.prompt, "prompt", request=name)
            if isinstance(spec.prompt, Buckets):
                if "count" in spec.model_fields_set:
                    raise self.err("count cannot be combined with a bucketed prompt (the "
                                   "sweep sets the count)", "count", request=name,
                                   allowed="count or prompt = { buckets = ... }, not both")
            else:
                n = self.value(spec.count, "count", request=name, high=MAX_COUNT)
                prompts = prompts * n
            for v in prompts:
                if v > p.max_model_len:
                    raise self.err(f"prompt of {v} tokens exceeds max_model_len {p.max_model_len}",
                                   "prompt", request=name, allowed=f"1..{p.max_model_len}")
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
            single = len(prompts) == 1 and not isinstance(spec.prompt, Buckets)
            ids = []
            for i, v in enumerate(prompts):
                rid = f"{REQ_ID_PREFIX}{self.sc.name}_{name}_" + ("" if single else f"{i}_")
                try:
                    self.b.add_request(PlannedRequest(
                        req_id=rid, prompt_len=v, kind=spec.kind,
                        structured_output=spec.structured_output, encoder_len=enc,
                        sampling=spec.sampling))
                except PlanError as e:
                    raise self.err(str(e), "prompt", request=name,
                                   allowed=f"1..max_model_len = {p.max_model_len}") from None
                ids.append(rid)
                self.prompt_len[rid] = v
                self.display[rid] = name if single else f"{name}[{i}]"
            self.groups[name] = ids

    def select(self, selectors: list[str] | None, field: str) -> list[str]:
        """Request ids for selectors, in order, without duplicates."""
        out: list[str] = []
        for s in selectors or []:
            m = _SELECTOR.match(s)
            name, sub = m.group(1), m.group(2)  # type: ignore[union-attr]
            if name not in self.groups:
                close = difflib.get_close_matches(name, list(self.groups), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise self.err(f"unknown request {name!r}{hint}", field,
                               allowed="names declared under [requests]: "
                               + (", ".join(self.groups) or "none"))
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
            out.extend(r for r in picked if r not in out)
        return out

    # -- steps -----------------------------------------------------------------
    def run_step(self, kind: str, label: str, field: str, **kw: Any) -> None:
        if self.b.next_index >= self._limit:
            raise self.err(f"the scenario expands to more than {self._limit} steps",
                           field, allowed=f"at most {MAX_EXPANDED} steps per [[steps]] entry")
        try:
            self.b.step(kind, label, **kw)  # type: ignore[arg-type]
        except PlanError as e:
            raise self.plan_err(e, field) from None

    def plan_err(self, e: PlanError, field: str) -> ScenarioError:
        key = {"spec_tokens": "spec_tokens", "prefix_hit": "cached"}.get(e.field or "", field)
        if e.field == "tokens":
            st = self.sc.model.steps[self.step_i]  # type: ignore[index]
            if getattr(st, "tokens", None) is not None:
                key = "tokens"
            elif getattr(st, "repeat", 1) != 1:
                key = "repeat"
        if key not in (STEP_MODELS[self.kind].model_fields if self.kind else {}):
            key = field
        allowed = _ALLOWED_BY_FIELD.get(e.field or "", "see scenarios/README.md").format(
            p=self.p, blocks=self.p.num_blocks - 1)
        msg = re.sub(r"^step \d+: ", "", str(e))
        msg = re.sub(r"'(" + re.escape(REQ_ID_PREFIX) + r"[^']*)'",
                     lambda m: repr(self.display.get(m.group(1), m.group(1))), msg)
        if e.step is not None and e.step != self.step_i:
            msg += f" (expanded plan step {e.step})"
        return self.err(msg, key, allowed=allowed)

    def expand(self) -> Plan:
        self.declare()
        for i, st in enumerate(self.sc.model.steps):
            self.step_i, self.kind = i, st.kind
            self._limit = self.b.next_index + MAX_EXPANDED
            getattr(self, f"_{st.kind}")(st)
        self.step_i = self.kind = None
        try:
            self.b.cleanup("cleanup (auto)")
        except PlanError as e:  # pragma: no cover - finishing never fails
            raise self.err(str(e), None) from None
        return self.b.build()

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
        for ids in self._batches(st):
            token_values = [None] if st.tokens is None else self.sizes(st.tokens, "tokens")
            for tokens in token_values:
                for group in ([[r] for r in ids] if st.each else [ids]):
                    if kind == "prefix_hit":
                        cached = self.value(st.cached, "cached", low=1)
                        g = self.facts["lcm_block_size"]
                        if cached % g:
                            raise self.err(f"cached {cached} is not a whole number of blocks",
                                           "cached", allowed=f"a multiple of lcm_block_size = {g}")
                        for r in group:
                            try:
                                self.b.set_computed(r, cached)
                            except PlanError as e:
                                raise self.plan_err(e, "cached") from None
                    sched = {r: tokens if tokens is not None else self._prompt_left(r)
                             for r in group}
                    label = st.label or (
                        f"{kind.replace('_', ' ')} {self._short(group)} x "
                        + ("rest" if tokens is None else str(tokens)))
                    self.run_step(kind, label, "requests", prefill=sched)

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
                sched = {r: (tokens if tokens is not None else
                             max(1, self.b.num_tokens(r) - self.b.num_computed_tokens(r)))
                         for r in ids}
                label = st.label or f"resume {self._short(ids)}"
                self.run_step("resume", label, "requests", resume=sched)

    def _decode_like(self, st: Any, default_kind: str) -> None:
        k = self.value(st.spec_tokens, "spec_tokens", low=0)
        reps = self.value(st.repeat, "repeat", high=MAX_EXPANDED)
        for ids in self._batches(st):
            kind = "spec_decode" if k else "decode"
            label = st.label or f"{kind.replace('_', ' ')} {self._short(ids)}" + (
                f" +{k} drafts" if k else "")
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
        k = self.value(st.spec_tokens, "spec_tokens", low=0)
        reps = self.value(st.repeat, "repeat", high=MAX_EXPANDED)
        spec = self.select(st.spec, "spec")
        non = self.select(st.non_spec, "non_spec")
        both = set(spec) & set(non)
        if both:
            raise self.err(f"request(s) {self._short(sorted(both))} are both spec and non_spec",
                           "non_spec", allowed="disjoint spec and non_spec selections")
        label = st.label or f"mixed decode {self._short(spec)} +{k} / {self._short(non)}"
        for _ in range(reps):
            self.run_step("mixed_decode", label, "spec",
                          decode={**{r: k for r in spec}, **{r: 0 for r in non}})

    def _mixed_prefill_decode(self, st: MixedPrefillDecodeStep) -> None:
        k = self.value(st.spec_tokens, "spec_tokens", low=0)
        pre = self.select(st.prefill, "prefill")
        dec = self.select(st.decode, "decode")
        token_values = [None] if st.tokens is None else self.sizes(st.tokens, "tokens")
        for tokens in token_values:
            sched = {r: tokens if tokens is not None else self._prompt_left(r) for r in pre}
            label = st.label or (f"decode {self._short(dec)} + prefill {self._short(pre)} x "
                                 + ("rest" if tokens is None else str(tokens)))
            self.run_step("mixed_prefill_decode", label, "prefill",
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

    why = unmet_need(list(sc.model.needs), profile)
    if not why and profile.role != "both" and profile.role not in sc.model.roles:
        why = (f"for roles {', '.join(sc.model.roles)}: this worker's role is "
               f"{profile.role}")
    if not why and profile.is_encoder_only:
        why = "encoder-only model: vLLM warms no step"
    if not why and profile.is_pooling_model and sc.model.sequence is None and any(
            r.kind == "sample" for r in sc.model.requests.values()):
        why = "scenario samples tokens but the runner is a pooling model"
    if not why:
        why = unmet_requirement(sc, profile)
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


def plans_for(names: list[str], profile: RunnerProfile) -> list[Plan]:
    """Load and expand every scenario named (built-in names or ``.toml`` paths)
    for ``profile``, all of them before any runs.

    Raises:
        ScenarioError: the first scenario that cannot be loaded or expanded.
    """
    return [expand(load(name), profile) for name in names]


def check(names: list[str], profile: RunnerProfile) -> list[tuple[str, Plan | ScenarioError]]:
    """Load and expand each scenario, collecting errors instead of raising.

    Returns:
        (name, plan or the error) per name, in order.
    """
    out: list[tuple[str, Plan | ScenarioError]] = []
    for name in names:
        try:
            out.append((name, expand(load(name), profile)))
        except ScenarioError as e:
            out.append((name, e))
    return out
