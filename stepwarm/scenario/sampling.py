"""Sampling in scenario files: presets, the ``sampling`` table, its sweeps, and
its validation with vLLM's own ``SamplingParams``.

A request's ``sampling`` is a preset name or a table of the
``SamplingParams`` fields that change what the worker executes (see
:class:`SamplingTable`). A field may be swept (``logprobs = { values = [1, 5,
"max_logprobs"] }``): the request then stands for one request per
combination (:func:`variants`). Each combination is built into a real
``SamplingParams`` exactly as :func:`stepwarm.compile.sampling_params` builds
it for the worker, and checked with ``SamplingParams.verify`` against the
runner's facts (``max_logprobs``, ``vocab_size``, the speculator): what vLLM's
front end would refuse is refused here, before any step, with vLLM's own
message (:func:`refusal`).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    FiniteFloat,
    StrictInt,
    Tag,
    field_validator,
)

from stepwarm.scenario.errors import got
from stepwarm.expressions import ExpressionError
from stepwarm.profile import RunnerProfile
from stepwarm.scenario.sweeps import MAX_SWEEP, SIZE_HELP, Size, Sweep, sweep_values

Preset = Literal["warmup", "greedy", "random", "seeded"]
PRESET_HELP = ('"warmup" (SamplingParams.for_sampler_warmup(): every sampler feature, '
               'prompt_logprobs 1 included, so vLLM reads no prefix cache for it), '
               '"greedy" (temperature 0), "random" (temperature 1, nothing else: the '
               'plain random path) or "seeded" (temperature 1, seed 0: per-request generators)')


class FloatValues(BaseModel):
    """``{ values = [0.5, 1.0] }``: a float field swept over these values."""

    model_config = ConfigDict(extra="forbid")
    values: list[float] = Field(min_length=1, description="The values, in order.")


def _check_float(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) != {"values"}:
            raise ValueError(f"got table with keys {sorted(v)}; allowed: a number or "
                             "{ values = [<number>, ...] }")
        return FloatValues.model_validate(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{got(v)}; allowed: a number or "
                         "{ values = [<number>, ...] }")
    return float(v)


FloatField = Annotated[Union[float, FloatValues], BeforeValidator(_check_float)]
_INT_HELP = "an integer: " + SIZE_HELP


class SamplingTable(BaseModel):
    """``sampling = { ... }``: ``SamplingParams`` fields; a field left out takes
    ``SamplingParams``' default (so ``temperature`` is 1.0: random sampling).
    Number fields may be swept; the request stands for one request per
    combination of swept values."""

    model_config = ConfigDict(extra="forbid")
    temperature: FloatField | None = Field(default=None, description=(
        "0: greedy; > 0 random (Gumbel-max / exponential sampling)."))
    top_p: FloatField | None = Field(default=None, description="Nucleus sampling, (0, 1].")
    top_k: Size | None = Field(default=None, description=(
        "Top-k (0 or -1: off); " + _INT_HELP))
    min_p: FloatField | None = Field(default=None, description=(
        "Min-p, [0, 1]; vLLM refuses it with a speculator."))
    seed: Size | None = Field(default=None, description=(
        "A per-request generator seeded with this; " + _INT_HELP))
    logprobs: Size | None = Field(default=None, description=(
        "Logprobs of this many top tokens per sampled token (-1: the vocabulary), at most "
        "max_logprobs; " + _INT_HELP))
    prompt_logprobs: Size | None = Field(default=None, description=(
        "Logprobs of this many top tokens per prompt token, at most max_logprobs; " + _INT_HELP))
    presence_penalty: FloatField | None = Field(default=None, description="[-2, 2].")
    frequency_penalty: FloatField | None = Field(default=None, description="[-2, 2].")
    repetition_penalty: FloatField | None = Field(default=None, description="> 0 (1: off).")
    min_tokens: Size | None = Field(default=None, description=(
        "Stop tokens are masked until this many tokens were sampled (with stop_token_ids); "
        + _INT_HELP))
    stop_token_ids: list[StrictInt] | None = Field(default=None, description=(
        "Token ids that stop the request (masked while below min_tokens)."))
    bad_words: list[list[StrictInt]] | None = Field(default=None, description=(
        "Banned token-id sequences, e.g. [[0], [1, 2]] (SamplingParams' bad_words "
        "after tokenization)."))
    allowed_token_ids: list[StrictInt] | None = Field(default=None, description=(
        "Only these token ids may be sampled."))
    logit_bias: dict[str, FiniteFloat] | None = Field(default=None, description=(
        "Token id -> bias added to its logit, e.g. { 0 = -1.0, 7 = 0.5 }; vLLM refuses "
        "it with a speculator."))

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for k in v or {}:
            if not k.lstrip("-").isdigit():
                raise ValueError(f"logit_bias key {k!r} is not a token id; allowed: "
                                 "integer token ids as keys, e.g. { 0 = -1.0 }")
        return v


def _sampling_tag(v: Any) -> str:
    return "table" if isinstance(v, (dict, SamplingTable)) else "preset"


Sampling = Annotated[
    Union[Annotated[Preset, Tag("preset")], Annotated[SamplingTable, Tag("table")]],
    Discriminator(_sampling_tag),
]

#: What a planned request carries: a preset name, or ``SamplingParams``
#: keyword arguments as sorted (name, value) pairs (tuples for lists,
#: ((token id, bias), ...) for logit_bias): hashable plain data.
SamplingArgs = Union[str, tuple[tuple[str, Any], ...]]


class SweepFieldError(ExpressionError):
    """A sampling field's sweep cannot be expanded; ``field`` names it."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def shown(args: SamplingArgs) -> str:
    """Sampling args as a TOML-like table for messages: ``{ logprobs = 5 }``."""
    if isinstance(args, str):
        return repr(args)

    def plain(k: str, v: Any) -> str:
        if k == "logit_bias":
            return "{ " + ", ".join(f"{t} = {b!r}" for t, b in v) + " }"
        return repr(json.loads(json.dumps(v)))  # tuples as lists

    return "{ " + ", ".join(f"{k} = {plain(k, v)}" for k, v in args) + " }"


def variants(sampling: Preset | SamplingTable,
             value: Callable[[Any, str], int]) -> list[SamplingArgs]:
    """Every combination a request's ``sampling`` stands for, in field order
    (the last field varies fastest).

    Args:
        sampling: a preset name or a table.
        value: evaluates an integer expression of field ``name``
            (``value(expr, name)``) against the runner's facts.

    Raises:
        SweepFieldError: a swept field's bounds (from
            :func:`~stepwarm.scenario.sweeps.sweep_values`), naming the field.
    """
    if isinstance(sampling, str):
        return [sampling]
    axes: list[list[tuple[str, Any]]] = []
    for name in SamplingTable.model_fields:
        v = getattr(sampling, name)
        if v is None:
            continue
        if isinstance(v, FloatValues):
            axes.append([(name, x) for x in dict.fromkeys(v.values)])
        elif isinstance(v, Sweep.__args__):  # type: ignore[attr-defined]
            try:
                swept = sweep_values(v, lambda e, what, n=name: value(e, n))
            except ExpressionError as e:
                raise SweepFieldError(str(e), name) from None
            axes.append([(name, x) for x in swept])
        elif name in ("top_k", "seed", "logprobs", "prompt_logprobs", "min_tokens"):
            axes.append([(name, value(v, name))])
        elif name == "logit_bias":
            axes.append([(name, tuple(sorted((int(k), b) for k, b in v.items())))])
        elif name == "bad_words":
            axes.append([(name, tuple(tuple(w) for w in v))])
        elif isinstance(v, list):
            axes.append([(name, tuple(v))])
        else:
            axes.append([(name, v)])
        if math.prod(len(a) for a in axes) > MAX_SWEEP:  # before the product is built
            raise SweepFieldError(
                f"the sampling sweeps make {math.prod(len(a) for a in axes)} combinations "
                f"(up to {name}); allowed: at most {MAX_SWEEP}", name)
    return [tuple(sorted(combo)) for combo in itertools.product(*axes)]


class _ModelFacts:
    """What ``SamplingParams.verify`` reads off ``ModelConfig``, from a profile."""

    def __init__(self, profile: RunnerProfile):
        self.max_logprobs = profile.max_logprobs
        self.max_model_len = profile.max_model_len
        self.is_diffusion = False
        self._vocab = profile.vocab_size

    def get_vocab_size(self) -> int:
        return self._vocab

    def __getattr__(self, name: str) -> Any:  # a field a later vLLM reads: unset
        return None


class _SpeculatorFacts:
    """What ``SamplingParams.verify`` reads off ``SpeculativeConfig``, from a
    profile: its drafts, every other field unset (falsy). vLLM 0.28's
    ``_validate_spec_decode`` (``vllm/sampling_params.py``) reads
    ``enable_adaptive_verification`` (DSpark's confidence-based verification,
    refusing logprobs; ``SpeculativeConfig``'s default False, and a profile
    does not record it), so it reads as off here."""

    def __init__(self, profile: RunnerProfile):
        self.num_speculative_tokens = profile.num_speculative_steps

    def __getattr__(self, name: str) -> Any:
        return None


#: False inside :func:`vllm_check_skipped`: :func:`refusal` asks vLLM nothing.
_VLLM_CHECK: ContextVar[bool] = ContextVar("stepwarm_sampling_vllm_check", default=True)


@contextlib.contextmanager
def vllm_check_skipped() -> Iterator[None]:
    """Within it, :func:`refusal` does not ask vLLM's ``SamplingParams``
    (importing vLLM takes seconds): for the built-in scenarios on the packaged
    tiny-Llama profile, which the test suite checks against vLLM
    (``test_every_builtin_checks_against_the_tiny_profile``)."""
    token = _VLLM_CHECK.set(False)
    try:
        yield
    finally:
        _VLLM_CHECK.reset(token)


def refusals(args: SamplingArgs, profile: RunnerProfile) -> list[tuple[SamplingArgs, str, str]]:
    """Every refusal of ``args`` at once, as (the args refused, the field,
    vLLM's message): where two or more fields are refused alone, each of
    them alone (``{ temperature = -1, top_p = 7 }`` gives two), else the
    whole table's one refusal (shown whole: the fields beside it tell which
    request it is). Empty when vLLM accepts ``args``."""
    whole = refusal(args, profile)
    if whole is None or isinstance(args, str):
        return []
    alone: list[tuple[SamplingArgs, str, str]] = [
        (one, *why) for one in (((k, v),) for k, v in args)
        if (why := refusal(one, profile)) is not None]
    return alone if len(alone) > 1 else [(args, *whole)]


def refused_anywhere(args: SamplingArgs) -> bool:
    """Whether vLLM refuses ``args`` on the most permissive runner (the
    tiny Llama's profile with no speculator and every limit ``verify``
    reads at its widest): then no runner takes them, and the error is told
    before any engine starts, also for a scenario skipped on the runner
    checked (``top_k = -7``; not ``logprobs = 30``, which a runner with
    ``max_logprobs`` 30 takes)."""
    return refusal(args, _widest_profile()) is not None


@functools.cache
def _widest_profile() -> RunnerProfile:
    """:func:`refused_anywhere`'s runner (read and built once)."""
    from stepwarm.profile import tiny_profile

    return tiny_profile().model_copy(update={
        "vocab_size": 1 << 30, "max_logprobs": 1 << 30, "max_model_len": 1 << 30,
        "num_speculative_steps": 0})


def refusal(args: SamplingArgs, profile: RunnerProfile) -> tuple[str, str] | None:
    """Why vLLM would refuse a request with these sampling args on this
    runner, as (the field, vLLM's message), or None when it accepts them.

    Builds the ``SamplingParams`` the worker would get
    (:func:`stepwarm.compile.sampling_params`), so its ``__post_init__``
    checks run, then ``SamplingParams.verify`` (the check vLLM's
    ``InputProcessor`` runs on every request) with the runner's
    ``max_logprobs``, ``vocab_size`` and speculator; ``bad_words`` and
    ``allowed_token_ids`` token ids must be below ``vocab_size`` (vLLM
    checks them with the tokenizer). Returns
    None without checking when vLLM cannot be imported.
    """
    if isinstance(args, str) or not _VLLM_CHECK.get():
        return None
    try:
        from stepwarm.compile import sampling_params

        import vllm.sampling_params  # noqa: F401
    except ImportError:  # pragma: no cover - stepwarm without vLLM
        return None
    fields = dict(args)
    from stepwarm.vllm_facts import seed_refusal

    if (why := seed_refusal(fields.get("seed"))) is not None:
        return "seed", why
    # vLLM checks these against the tokenizer (bad_words after tokenizing;
    # allowed_token_ids in 0.26), which check-time validation does not have.
    for name, ids in [("bad_words", t) for t in fields.get("bad_words", ())] + [
            ("allowed_token_ids", fields.get("allowed_token_ids", ()))]:
        bad = [t for t in ids if not 0 <= t < profile.vocab_size]
        if bad:
            return name, (f"token id(s) {bad} in {name} are out of the vocabulary "
                          f"(vocab_size {profile.vocab_size})")
    try:
        params = sampling_params(args, profile)
        params.verify(_ModelFacts(profile),
                      _SpeculatorFacts(profile) if profile.has_speculator else None, None, None)
    except Exception as e:  # noqa: BLE001 - VLLMValidationError (0.32) is no ValueError
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        field = getattr(e, "parameter", None)
        if field not in fields:
            field = next((f for f in fields if f in msg and _set(f, fields[f])),
                         next(iter(fields), None))
        if profile.has_speculator and "speculative" in msg:
            msg += f" (this runner has a speculator: num_speculative_steps {profile.num_speculative_steps})"
        return str(field), msg
    if profile.has_speculator and not profile.top_k_top_p_with_drafts:
        # vLLM's CPU build takes the request and its rejection sampler fails
        # on it mid-step (a raw RuntimeError from torch: the fresh trial)
        field = next((f for f in ("top_k", "top_p") if f in fields and (
            fields[f] > 0 if f == "top_k" else fields[f] < 1)), None)
        if field is not None:
            return field, (f"{field} = {fields[field]} beside this runner's speculator: this "
                           "vLLM build's sampler fails on top-k / top-p requests with a "
                           "speculator (vLLM's CPU build); allowed here: greedy or "
                           "temperature sampling, or needs = [\"spec_top_k_top_p\"] (the "
                           "scenario is then skipped on such runners)")
    # vLLM 0.32 refuses these in verify ("stop_token_ids are used as column
    # indices into the logits tensor"); an older vLLM accepts them and its
    # min_tokens masking indexes past the logits mid-step.
    bad = [t for t in fields.get("stop_token_ids") or () if not 0 <= t < profile.vocab_size]
    if bad:
        return "stop_token_ids", (f"token id(s) {bad} in stop_token_ids are out of the vocabulary "
                                  f"(vocab_size {profile.vocab_size}; they index the logits)")
    return None


def _set(name: str, value: Any) -> bool:
    """Whether a field's value turns its feature on (min_p 0 does not)."""
    return bool(value) if name in ("min_p", "logit_bias") else True


#: Presets whose ``SamplingParams`` ask for prompt logprobs: ``warmup`` is
#: ``SamplingParams.for_sampler_warmup()``, which sets ``prompt_logprobs=1``.
PRESETS_WITH_PROMPT_LOGPROBS = frozenset({"warmup"})

#: Pooling tasks whose ``PoolingParams`` skip the prefix cache
#: (``PoolingParams.verify``: "plugin"; ``_merge_default_parameters``: the
#: per-token tasks, whose output covers every prompt token).
POOLING_TASKS_SKIPPING_PREFIX_CACHE = frozenset({"token_embed", "token_classify", "plugin"})


def has_prompt_logprobs(args: SamplingArgs) -> bool:
    """Whether a sampling table asks for prompt logprobs (presets: see
    :func:`skips_prefix_cache`)."""
    if isinstance(args, str):
        return False
    return dict(args).get("prompt_logprobs") is not None


def skips_prefix_cache(args: SamplingArgs) -> bool:
    """``SamplingParams.skip_reading_prefix_cache`` as vLLM sets it in
    ``__post_init__``: a request that asks for prompt logprobs reads no
    prefix cache (the logprobs of cached prompt tokens would be missing), so
    ``KVCacheManager.get_computed_blocks`` gives it no hit
    (``prefix_cache_lookup_enabled``). True for a table with
    ``prompt_logprobs`` and for the presets in
    :data:`PRESETS_WITH_PROMPT_LOGPROBS`."""
    if isinstance(args, str):
        return args in PRESETS_WITH_PROMPT_LOGPROBS
    return has_prompt_logprobs(args)


def pooling_skips_prefix_cache(task: str | None) -> bool:
    """``PoolingParams.skip_reading_prefix_cache`` for a request of pooling
    ``task`` (as stepwarm sends it: ``PoolingParams(task=...)``, verified by
    the front end): True for the tasks in
    :data:`POOLING_TASKS_SKIPPING_PREFIX_CACHE`; no task: False."""
    return task in POOLING_TASKS_SKIPPING_PREFIX_CACHE
