"""Reading a recording (``STEPWARM_RECORD``, :mod:`stepwarm.record`): its
format as pydantic models and :func:`load_recording`, which checks every line
before anything is made of it.

Each error names the file and the line (and the field, for a value of the
wrong type): an empty or binary file, a truncated last line, a line that is
not JSON or not of the format, a step before any header, a recording from
another vLLM release or (with ``model``) another model, steps whose counts
disagree (``batch`` and ``tokens`` against their requests, a request sent
before it was ``new``). Errors are collected and raised together
(:class:`RecordError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from stepwarm.files import FileTooLarge, NotUtf8, read_text_capped
from stepwarm.record import CAPPED_KEY, header_differences, model_identity
from stepwarm.scenario.errors import joined

#: Largest recording read, in bytes (a recording's own cap defaults to 256 MiB:
#: reduce a part of a larger one).
MAX_RECORD_BYTES = 256 << 20


class RecordError(ValueError):
    """A recording that cannot be reduced; its message has one line per
    fault, each naming the file and line (``errors``: those lines)."""

    def __init__(self, message: str, errors: list[str] | None = None):
        super().__init__(message)
        self.errors = errors or [message]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SamplerClassModel(_Strict):
    """A request's sampler class (:func:`stepwarm.record.sampler_class`)."""

    kind: Literal["greedy", "random", "top_k", "top_p", "top_k_top_p", "pool"]
    penalties: StrictBool
    seeded: StrictBool
    logprobs: StrictInt | None = Field(ge=-1)
    prompt_logprobs: StrictInt | None = Field(ge=-1)
    structured: StrictBool


class ModelIdentity(_Strict):
    architecture: StrictStr
    config_hash: StrictStr


class MoeTuning(_Strict):
    """What picks a fused MoE kernel's variant at a token count
    (:func:`stepwarm.vllm_facts.moe_kernel_tuning`)."""

    top_k: StrictInt = Field(ge=0)
    experts: StrictInt = Field(ge=0)
    align_experts: StrictInt = Field(default=0, ge=0)
    tuned_sizes: list[StrictInt] | None = None
    tuned_block_m: list[StrictInt] | None = None


class RecordHeader(_Strict):
    """The first line of a recording session."""

    stepwarm_record: Literal[1]
    stepwarm: StrictStr
    vllm: StrictStr
    model: ModelIdentity
    block_size: StrictInt = Field(gt=0)
    max_num_seqs: StrictInt = Field(gt=0)
    max_num_batched_tokens: StrictInt = Field(gt=0)
    num_spec_tokens: StrictInt = Field(ge=0)
    runner: Literal["v1", "v2"]
    cudagraph_sizes: list[StrictInt]
    max_logprobs: StrictInt = Field(ge=-1)
    #: a model with fused MoE layers; absent in recordings before it was kept
    moe: MoeTuning | None = None


class RecordedRequest(_Strict):
    """One request of a step: ordinal, tokens scheduled, tokens computed
    before the step, prompt length; on its first step ``new``, the
    prefix-hit blocks and the sampler class."""

    r: StrictInt = Field(ge=0)
    scheduled: StrictInt = Field(gt=0)
    computed: StrictInt = Field(ge=0)
    prompt: StrictInt = Field(ge=0)
    new: StrictBool = False
    hit_blocks: StrictInt = Field(default=0, ge=0)
    sampler: SamplerClassModel | None = None
    resumed: StrictBool = False
    drafts: StrictInt = Field(default=0, ge=0)
    accepted: StrictInt | None = Field(default=None, ge=0)
    encoder_inputs: StrictInt = Field(default=0, ge=0)


class RecordedStep(_Strict):
    step: StrictInt = Field(ge=0)
    batch: StrictInt = Field(gt=0)
    tokens: StrictInt = Field(gt=0)
    finished: StrictInt = Field(ge=0)
    preempted: StrictInt = Field(ge=0)
    reqs: list[RecordedRequest] = Field(min_length=1)


@dataclass
class Recording:
    """A checked recording: its header and its steps, each with the line it
    was read from; ``samplers`` is each request's sampler class by
    (session, ordinal)."""

    file: str
    header: RecordHeader
    steps: list[tuple[int, int, RecordedStep]] = field(default_factory=list)  # (line, session, step)
    samplers: dict[tuple[int, int], SamplerClassModel] = field(default_factory=dict)
    #: Each request's prompt length as its first step recorded it, and that line.
    prompts: dict[tuple[int, int], tuple[int, str]] = field(default_factory=dict)
    #: Each request's ``computed`` on its last line (it never goes back but on a resume).
    computed: dict[tuple[int, int], int] = field(default_factory=dict)
    #: Where the recorder reached its cap (``STEPWARM_RECORD_MAX_MB``):
    #: ``(line, the step it could not write)`` of each capped session.
    capped: list[tuple[int, int]] = field(default_factory=list)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _pydantic_errors(e: ValidationError, where: str) -> list[str]:
    return [f"{where}: {_loc(err['loc']) or 'line'}: {err['msg']} (got {err['input']!r})"
            for err in e.errors(include_url=False)]


def read_recording_text(path: str | Path) -> str:
    """A recording's text, refused where it cannot be one whatever it holds
    (missing, unreadable, too large, binary, empty): checks that need no
    vLLM, made before ``scenario from-record`` imports it.

    Raises:
        RecordError: naming the file (and line for binary data).
    """
    file = str(path)
    try:
        text = read_text_capped(Path(path), MAX_RECORD_BYTES)
    except FileTooLarge:
        raise RecordError(f"{file}: larger than {MAX_RECORD_BYTES} bytes; allowed: a smaller "
                          "recording (STEPWARM_RECORD_MAX_MB), or a part of it") from None
    except NotUtf8 as e:
        raise RecordError(f"{file}:{e.line}: not a recording: binary data ({e}); a recording "
                          "is JSON Lines written by STEPWARM_RECORD") from None
    except OSError as e:
        raise RecordError(f"{file}: cannot read: {e.strerror or e}") from None
    if "\x00" in text:
        line = text[:text.index("\x00")].count("\n") + 1
        raise RecordError(f"{file}:{line}: not a recording: binary data (a NUL byte); a "
                          "recording is JSON Lines written by STEPWARM_RECORD")
    if not text.strip():
        raise RecordError(f"{file}: empty; a recording starts with a header line written by "
                          "STEPWARM_RECORD (was the engine stopped before its first step?)")
    return text


def load_recording(path: str | Path, *, vllm_version: str | None = None,
                   model_config: Mapping[str, object] | None = None) -> Recording:
    """Read and check a recording.

    Args:
        path: the file.
        vllm_version: the release it must come from (None: not checked).
        model_config: the ``config.json`` of the model it must come from
            (None: not checked).

    Raises:
        RecordError: every fault found, each naming the file and line.
    """
    file = str(path)
    text = read_recording_text(path)
    lines = text.split("\n")
    ends_cut = lines[-1] != ""  # no newline after the last line
    if not ends_cut:
        lines.pop()
    errors: list[str] = []
    rec: Recording | None = None
    session = -1
    seen: set[tuple[int, int]] = set()
    want_model = model_identity(model_config) if model_config is not None else None
    skipping = False  # the lines of a session whose header was refused
    for number, raw in enumerate(lines, 1):
        where = f"{file}:{number}"
        if not raw.strip():
            continue  # as traffic files: a blank line is no line
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, ValueError) as e:
            if number == len(lines) and ends_cut:
                errors.append(f"{where}: truncated: the last line is cut off ({e}); was the "
                              "file copied while the engine wrote it? remove the line")
            else:
                errors.append(f"{where}: not JSON: {e}")
            continue
        if not isinstance(obj, dict):
            errors.append(f"{where}: got {type(obj).__name__}; allowed: a JSON object")
            continue
        if "stepwarm_record" in obj:
            try:
                head = RecordHeader.model_validate(obj)
            except ValidationError as e:
                errors.extend(_pydantic_errors(e, f"{where} (header)"))
                skipping = True  # its steps are not blamed for having no header
                continue
            skipping = False
            session += 1
            if rec is None:
                rec = Recording(file, head)
                if vllm_version is not None and head.vllm != vllm_version:
                    errors.append(f"{where}: recorded on vLLM {head.vllm}, this is vLLM "
                                  f"{vllm_version}; allowed: a recording from the release "
                                  "that runs the scenario (record again after an upgrade)")
                if want_model is not None and head.model.model_dump() != want_model:
                    errors.append(
                        f"{where}: recorded on another model ({head.model.architecture}, "
                        f"config_hash {head.model.config_hash}); --model is "
                        f"{want_model['architecture']}, config_hash {want_model['config_hash']}")
            elif head.model_dump(exclude={"stepwarm"}) != rec.header.model_dump(exclude={"stepwarm"}):
                differs = "; ".join(header_differences(rec.header.model_dump(mode="json"),
                                                       head.model_dump(mode="json")))
                errors.append(f"{where}: a second session whose header differs from the first's "
                              f"({differs}); allowed: the sessions of one engine "
                              "configuration (one file each)")
                skipping = True  # its steps are not checked against the first header
            continue
        if skipping:
            continue
        if CAPPED_KEY in obj:
            at = obj.get(CAPPED_KEY)
            if not (isinstance(at, int) and not isinstance(at, bool) and at >= 0) or len(obj) != 1:
                errors.append(f"{where}: {CAPPED_KEY}: allowed: {{\"{CAPPED_KEY}\": STEP}}, the "
                              "step the recorder could not write (got "
                              f"{json.dumps(obj)[:80]})")
            elif rec is None:
                errors.append(f"{where}: the recording reached its cap before its header was "
                              "written; raise STEPWARM_RECORD_MAX_MB and record again")
            else:
                rec.capped.append((number, at))
            continue
        if rec is None:
            errors.append(f"{where}: a step before any header; a recording starts with the "
                          "header line STEPWARM_RECORD writes")
            continue
        try:
            step = RecordedStep.model_validate(obj)
        except ValidationError as e:
            errors.extend(_pydantic_errors(e, where))
            # the requests it sent as new, as far as they read: a later line
            # naming one is not blamed for the fault here (the twelfth trial)
            reqs = obj.get("reqs")
            if isinstance(reqs, list):
                seen.update((session, r["r"]) for r in reqs if isinstance(r, dict)
                            and r.get("new") is True and isinstance(r.get("r"), int))
            continue
        errors.extend(_step_errors(step, where, session, seen, rec))
        rec.steps.append((number, session, step))
    if rec is None and not errors:
        errors.append(f"{file}: no header line; a recording starts with the header line "
                      "STEPWARM_RECORD writes")
    if rec is not None and not rec.steps and not errors:
        errors.append(f"{file}: no step recorded: the recording reached its cap (line "
                      f"{rec.capped[0][0]}) before its first step; raise STEPWARM_RECORD_MAX_MB"
                      if rec.capped else
                      f"{file}: no step recorded (a header only); serve some traffic first")
    if errors:
        raise RecordError(joined(errors, file), errors)
    assert rec is not None
    return rec


def _step_errors(step: RecordedStep, where: str, session: int, seen: set[tuple[int, int]],
                 rec: Recording) -> list[str]:
    """A step's counts that disagree with its requests (a hand edit)."""
    out = []
    if step.batch != len(step.reqs):
        out.append(f"{where}: batch: {step.batch}, but {len(step.reqs)} request(s) listed in reqs")
    if step.tokens != sum(r.scheduled for r in step.reqs):
        out.append(f"{where}: tokens: {step.tokens}, but the requests' scheduled tokens add up "
                   f"to {sum(r.scheduled for r in step.reqs)}")
    for i, r in enumerate(step.reqs):
        key = (session, r.r)
        if r.new:
            if r.sampler is None:
                out.append(f"{where}: reqs[{i}].sampler: missing on a new request")
            else:
                rec.samplers[key] = r.sampler
            seen.add(key)
        elif key not in seen:
            out.append(f"{where}: reqs[{i}].r: request {r.r} was never sent as new before")
        if r.new:
            rec.prompts[key] = (r.prompt, where)
        elif key in rec.prompts and rec.prompts[key][0] != r.prompt:
            # a hand edit of one line (the second fresh trial: a prompt of 600
            # sent as new, then decoded after 3 computed tokens)
            first, at = rec.prompts[key]
            out.append(f"{where}: reqs[{i}].prompt: {r.prompt}, but request {r.r} was sent as "
                       f"new with a prompt of {first} tokens ({at}); allowed: the same prompt "
                       "length on every line of a request")
        if not r.new and not r.resumed and r.computed < rec.computed.get(key, 0):
            out.append(f"{where}: reqs[{i}].computed: {r.computed}, but request {r.r} had "
                       f"{rec.computed[key]} computed on its last line; allowed: no fewer, but "
                       "on a resume (resumed: true)")
        rec.computed[key] = r.computed
        if r.new and r.sampler is not None:
            for what in ("logprobs", "prompt_logprobs"):
                n = getattr(r.sampler, what)
                top = rec.header.max_logprobs
                if n is not None and top != -1 and (n == -1 or n > top):
                    out.append(f"{where}: reqs[{i}].sampler.{what}: {n}"
                               f"{' (the whole vocabulary)' if n == -1 else ''} is above the "
                               f"header's max_logprobs {top}")
        if r.scheduled > rec.header.max_num_batched_tokens:
            out.append(f"{where}: reqs[{i}].scheduled: {r.scheduled} is above the header's "
                       f"max_num_batched_tokens {rec.header.max_num_batched_tokens}")
    return out
