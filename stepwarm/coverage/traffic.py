"""The traffic file: requests that ``stepwarm coverage`` replays, one a line (JSON Lines).

Each line is a JSON object::

    {"name": "top-p batch 40", "prompt": 11, "count": 40,
     "sampling": {"temperature": 0.8, "top_p": 0.9, "top_k": 20}}

* ``prompt``: a length (tokens; the ids are made up, distinct per request) or
  a list of prompt token ids, sent as given.
* ``count``: how many such requests go into the same ``LLM.generate`` call
  (the batch the scheduler sees; default 1).
* ``sampling``: keyword arguments of vLLM's own ``SamplingParams``, checked by
  constructing one. ``logprobs`` / ``prompt_logprobs`` may be ``"max"``: the
  engine's ``max_logprobs``. stepwarm adds ``max_tokens = 4``,
  ``ignore_eos = true`` and ``detokenize = false`` unless the line sets them.
* ``server_defaults``: ``true``: the line's ``sampling`` starts from the
  model's ``generation_config.json`` as vLLM's OpenAI server applies it to a
  request that leaves those fields unset (``ModelConfig.get_diff_sampling_param``:
  :data:`SERVER_DEFAULT_KEYS`), the line's own keys over it; ``max_tokens``
  stays stepwarm's.
* ``prefix``: ``{"group": NAME, "tokens": N}``: the prompt's first ``N``
  tokens are the group's shared prefix, cached by a priming request before
  each replay, so the measured request is a prefix hit.
* ``if_fits``: ``true``: where prompt + ``max_tokens`` is longer than the
  engine's ``max_model_len`` the line is left out, with a note, instead of
  refused (:func:`fitting`): one file for engines of every length (the
  built-in file's long prompt).
* ``name``: how the report calls the request (default ``line N``).

Every line is checked before the engine starts (:func:`load_traffic`): its
format, and the model's vocabulary and length where ``config.json`` and the
engine arguments tell them (:func:`config_limits`); then against the engine's
own limits once it is up (:func:`check_limits`). Each error names the file,
the line and the field; a file's errors are reported together (at most
:data:`~stepwarm.scenario.errors.MAX_ERRORS` listed). The caps
(:data:`MAX_FILE_BYTES`, :data:`MAX_LINES`, :data:`MAX_COUNT`,
:data:`MAX_REQUESTS`, :data:`MAX_NESTING`) are in ``docs/traffic.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
)

from stepwarm.files import MAX_INT_DIGITS, FileTooLarge, NotUtf8, read_text_capped
from stepwarm.scenario.errors import joined

#: Name of the traffic file shipped with stepwarm (``stepwarm coverage`` with no TRAFFIC).
BUILTIN = "builtin"
#: ``SamplingParams`` values stepwarm sets unless a line gives them: short,
#: fixed-length outputs and no detokenization (a ``--model`` directory may
#: have no tokenizer).
SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 4, "ignore_eos": True, "detokenize": False}
#: The ``SamplingParams`` fields vLLM's server takes from a model's
#: ``generation_config.json`` where a request leaves them unset
#: (``ModelConfig.get_diff_sampling_param``; its ``max_tokens`` is left out:
#: coverage keeps its short outputs).
SERVER_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                       "presence_penalty", "frequency_penalty")
#: Fields that may be ``"max"`` (the engine's ``max_logprobs``).
MAX_FIELDS = ("logprobs", "prompt_logprobs")
#: The first token id made-up prompts use (0-2 are often pad/bos/eos).
FIRST_TOKEN_ID = 3
#: Largest traffic file read, in bytes.
MAX_FILE_BYTES = 64 << 20
#: Most request lines in a traffic file (each is replayed twice, one by one).
MAX_LINES = 4096
#: Most requests one line may stand for (``count``: one ``LLM.generate`` batch).
MAX_COUNT = 4096
#: Most requests in a whole file (``count`` summed over the lines).
MAX_REQUESTS = 65536
#: Deepest nesting of JSON arrays and objects in a line (Python's JSON
#: decoder recurses per level; a JSON schema in ``structured_outputs`` may nest).
MAX_NESTING = 64


class TrafficError(ValueError):
    """A traffic file stepwarm will not replay; the message names the file,
    the line and the field (``FILE:LINE: FIELD: what is wrong``), one error a line.

    Attributes:
        errors: each error's message (this one's alone for a single error).
    """

    def __init__(self, message: str, errors: Sequence[str] = ()):
        super().__init__(message)
        self.errors: tuple[str, ...] = tuple(errors) or (message,)
        #: lines whose ``sampling`` table vLLM's ``SamplingParams`` did not
        #: check (the file was read without importing vLLM)
        self.unchecked_sampling: tuple[int, ...] = ()

    @classmethod
    def of(cls, errors: Sequence[TrafficError], file: str) -> TrafficError:
        """One error for all of ``errors`` (not empty), one a line."""
        messages = [m for e in errors for m in e.errors]
        return errors[0] if len(messages) == 1 else cls(joined(messages, file), messages)


class Prefix(BaseModel):
    """A shared prompt prefix: ``tokens`` leading tokens common to every line of ``group``."""

    model_config = ConfigDict(extra="forbid")
    group: str = Field(min_length=1)
    tokens: PositiveInt


class TrafficRequest(BaseModel):
    """One line of a traffic file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: StrictStr | None = None
    # Strict: JSON true is not a 1-token prompt.
    prompt: Union[Annotated[StrictInt, Field(gt=0)],
                  Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]]
    count: Annotated[StrictInt, Field(gt=0, le=MAX_COUNT)] = 1
    sampling: dict[str, Any] = Field(default_factory=dict)
    server_defaults: StrictBool = False
    prefix: Prefix | None = None
    if_fits: StrictBool = False

    @property
    def prompt_len(self) -> int:
        """Prompt length in tokens."""
        return self.prompt if isinstance(self.prompt, int) else len(self.prompt)

    def sampling_kwargs(self, max_logprobs: int,
                        server: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments: :data:`SAMPLING_DEFAULTS`,
        then (for a ``server_defaults`` line) ``server``'s
        :data:`SERVER_DEFAULT_KEYS`, then the line's table, ``"max"``
        replaced by ``max_logprobs``.

        Args:
            max_logprobs: the engine's ``max_logprobs``.
            server: the model's generation-config defaults
                (:func:`server_sampling`); None: not known yet (no engine).
        """
        defaults = ({k: v for k, v in (server or {}).items() if k in SERVER_DEFAULT_KEYS}
                    if self.server_defaults else {})
        kwargs = {**SAMPLING_DEFAULTS, **defaults, **self.sampling}
        for key in MAX_FIELDS:
            if kwargs.get(key) == "max":
                kwargs[key] = max_logprobs
        return kwargs


@dataclass(frozen=True)
class TrafficLine:
    """A validated request and where it came from."""

    #: 1-based line number in the file.
    line: int
    request: TrafficRequest

    @property
    def name(self) -> str:
        """The request's name in reports."""
        return self.request.name or f"line {self.line}"


@dataclass(frozen=True)
class Traffic:
    """A whole traffic file."""

    source: str
    lines: tuple[TrafficLine, ...]


@dataclass(frozen=True)
class TrafficLimits:
    """What the engine accepts: read off it once it is up, or before it
    starts what the model's config tells (None: not known, not checked)."""

    max_model_len: int | None
    vocab_size: int | None
    max_logprobs: int | None
    #: Where the limits come from, for messages ("the engine's", "config.json's").
    source: str = "the engine's"


def _error(file: str, line: int, field: str | None, message: str) -> TrafficError:
    return TrafficError(f"{file}:{line}: " + (f"{field}: " if field else "") + message)


def _did_you_mean(key: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _nesting_error(text: str, file: str, line: int) -> TrafficError | None:
    """The error for a line nested deeper than :data:`MAX_NESTING`, or None
    (counted before ``json.loads``, which recurses per level)."""
    from stepwarm.files import json_nested_deeper

    if json_nested_deeper(text, MAX_NESTING):
        return _error(file, line, None, f"nested deeper than {MAX_NESTING} levels of "
                      f"arrays and objects; allowed: at most {MAX_NESTING} (MAX_NESTING, "
                      "see docs/traffic.md)")
    return None


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


def server_sampling(llm: Any) -> dict[str, Any]:
    """The sampling defaults vLLM's OpenAI server gives a request from the
    model's ``generation_config.json`` (``ModelConfig.get_diff_sampling_param``,
    read as the server reads it; ``{}`` where the model has none), restricted
    to :data:`SERVER_DEFAULT_KEYS`."""
    diff = llm.llm_engine.model_config.get_diff_sampling_param() or {}
    return {k: v for k, v in diff.items() if k in SERVER_DEFAULT_KEYS}


def make_sampling_params(kwargs: dict[str, Any]) -> Any:
    """vLLM's ``SamplingParams`` from JSON values: converted by msgspec against
    its field types (``SamplingParams`` is a ``msgspec.Struct``; JSON object
    keys such as ``logit_bias``'s token ids become ints), then vLLM's own
    checks (``__post_init__``).

    Raises:
        KeyError: a key that is not a ``SamplingParams`` field (the key).
        Exception: what msgspec or vLLM raise for a bad value.
    """
    from vllm import SamplingParams

    fields = getattr(SamplingParams, "__struct_fields__", None)
    if fields is None:  # not a msgspec Struct: the constructor checks names
        return SamplingParams(**kwargs)
    unknown = [k for k in kwargs if k not in fields]
    if unknown:
        raise KeyError(unknown[0])
    import msgspec

    return msgspec.convert(kwargs, SamplingParams, strict=False)


#: Where msgspec says a value is wrong: ``... - at `$.seed```.
_MSGSPEC_PATH = re.compile(r"`\$\.(\w+)")


def _check_sampling(table: dict[str, Any], file: str, line: int) -> None:
    """Build vLLM's ``SamplingParams`` from ``table`` (with stepwarm's
    defaults, ``"max"`` as 1) and turn its refusals into located errors, all
    at once: every unknown key; then, of the known ones, each field vLLM
    refuses alone where two or more are, else the table's one refusal."""
    from vllm import SamplingParams

    from stepwarm.vllm_facts import seed_refusal

    errors = []
    if (why := seed_refusal(table.get("seed"))) is not None:
        errors.append(_error(file, line, "sampling.seed", why))
    bias = table.get("logit_bias")
    if isinstance(bias, dict) and any(isinstance(b, float) and not math.isfinite(b)
                                      for b in bias.values()):
        errors.append(_error(file, line, "sampling.logit_bias", "a bias that is not a finite "
                             "number; allowed: finite numbers (vLLM's server clamps them to "
                             "-100 .. 100)"))
    known = getattr(SamplingParams, "__struct_fields__", None)
    if known is not None:
        errors += [_error(file, line, f"sampling.{k}", "not a SamplingParams field"
                          + _did_you_mean(k, known)) for k in table if k not in known]
        table = {k: v for k, v in table.items() if k in known}
    whole = _sampling_refusal(table, file, line)
    if whole is not None:
        alone = [e for k, v in table.items()
                 if (e := _sampling_refusal({k: v}, file, line)) is not None]
        errors += alone if len(alone) > 1 else [whole]
    if errors:
        raise TrafficError.of(errors, file)


def _sampling_refusal(table: dict[str, Any], file: str, line: int) -> TrafficError | None:
    """vLLM's refusal of ``table`` (with stepwarm's defaults) as a located
    error, or None when ``SamplingParams`` takes it."""
    kwargs = {**SAMPLING_DEFAULTS, **{k: (1 if k in MAX_FIELDS and v == "max" else v)
                                      for k, v in table.items()}}
    try:
        make_sampling_params(kwargs)
    except KeyError as e:  # a SamplingParams that is not a msgspec Struct
        return _error(file, line, f"sampling.{e.args[0]}", "not a SamplingParams field")
    except Exception as e:  # noqa: BLE001 - msgspec and vLLM raise several types
        text = re.sub(r" \(parameter=.*\)$", "", str(e))
        path = _MSGSPEC_PATH.search(text)
        param = getattr(e, "parameter", None) or (path.group(1) if path else None)
        field = param if param in table else next(
            (k for k in sorted(table, key=len, reverse=True) if k in text), None)
        return _error(file, line, f"sampling.{field}" if field else "sampling",
                      f"vLLM's SamplingParams refused it: {text}")
    return None


def _json_object(text: str, file: str, line: int) -> dict[str, Any]:
    """One line's JSON object (no vLLM needed).

    Raises:
        TrafficError: nested too deep, invalid JSON (``FILE:LINE:COLUMN``), an
            integer past Python's digit limit, or not an object.
    """
    too_deep = _nesting_error(text, file, line)
    if too_deep is not None:
        raise too_deep
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TrafficError(f"{file}:{line}:{e.colno}: invalid JSON: {e.msg}") from None
    except ValueError:  # an integer past Python's digit limit (int_max_str_digits)
        raise TrafficError(f"{file}:{line}: an integer of more than {MAX_INT_DIGITS} digits; "
                           f"allowed: integers of up to {MAX_INT_DIGITS} digits") from None
    if not isinstance(data, dict):
        raise _error(file, line, None, f"expected a JSON object (one request a line), "
                                       f"got {type(data).__name__}")
    return data


def parse_line(text: str, file: str, line: int, sampling: bool = True) -> TrafficRequest:
    """One JSON line -> :class:`TrafficRequest`, checked by pydantic and (with
    ``sampling``, which imports vLLM) by vLLM's ``SamplingParams``.

    Raises:
        TrafficError: ``FILE:LINE: FIELD: message`` (``FILE:LINE:COLUMN`` for
            invalid JSON), every field pydantic refuses, one a line.
    """
    data = _json_object(text, file, line)
    try:
        request = TrafficRequest.model_validate(data)
    except ValidationError as e:
        errors = _field_errors(e, data, file, line)
        table = data.get("sampling")
        if sampling and isinstance(table, dict) and not any(
                m.split(": ")[1].startswith("sampling") for x in errors for m in x.errors
                if m.count(": ") >= 1):
            try:  # the line's sampling too, said with its other errors (fresh trial)
                _check_sampling(table, file, line)
            except TrafficError as more:
                errors.append(more)
        raise TrafficError.of(errors, file) from None
    if request.prefix is not None and request.prefix.tokens >= request.prompt_len:
        raise _error(file, line, "prefix.tokens",
                     f"{request.prefix.tokens} must be less than the prompt's "
                     f"{request.prompt_len} tokens (the request adds tokens of its own)")
    if request.prefix is not None and isinstance(request.prompt, list):
        raise _error(file, line, "prefix", "a prompt of token ids is sent as given, with no "
                     "shared prefix made up or primed; allowed: a prompt length with a prefix")
    if request.prefix is not None and request.sampling.get("prompt_logprobs") is not None:
        raise _error(file, line, "prefix", "vLLM skips the prefix cache for a request with "
                     "prompt_logprobs, so it would not be a prefix hit; allowed: one or the other")
    for key in MAX_FIELDS:
        value = request.sampling.get(key)
        if isinstance(value, str) and value != "max":
            raise _error(file, line, f"sampling.{key}", f"{value!r}: allowed: a number or \"max\"")
    if sampling:
        _check_sampling(request.sampling, file, line)
    return request


def _field_errors(e: ValidationError, data: dict[str, Any], file: str,
                  line: int) -> list[TrafficError]:
    """Each field pydantic refuses in a line, once (a prompt's union reports
    one error per member), unknown fields first with a did-you-mean."""
    out: dict[str, TrafficError] = {}
    suggested: set[str] = set()  # fields a misspelt field's did-you-mean names
    for err in sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden"):
        loc = _loc(err["loc"]) or "line"
        msg = err["msg"]
        if err["loc"][0] == "prompt" and err["type"] != "missing":
            loc = "prompt"
            msg = (f"{json.dumps(data.get('prompt'))}: allowed: a length (an integer > 0) or a list of "
                   "token ids (integers >= 0, at least one)")
        elif err["type"] == "extra_forbidden":
            known = list(TrafficRequest.model_fields if len(err["loc"]) == 1
                         else Prefix.model_fields)
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            suggested.update(_loc((*err["loc"][:-1], c)) for c in close)
            msg = (f"unknown field{_did_you_mean(str(err['loc'][-1]), known)}; allowed: "
                   + ", ".join(known))
        elif err["type"] == "missing" and loc in suggested:
            continue  # the misspelt field's error names it already
        if loc == "count" and err["type"] in ("greater_than", "less_than_equal", "int_type"):
            # in the words of the other fields: the value, then what is allowed
            msg = (f"{json.dumps(err['input'])}; allowed: an integer from 1 to {MAX_COUNT} "
                   "(MAX_COUNT, see docs/traffic.md)")
        out.setdefault(loc, _error(file, line, loc, msg))
    return list(out.values())


def _request_lines(text: str, file: str) -> list[tuple[int, str]]:
    """(line number, text) of each line that is not blank (a leading
    byte-order mark dropped).

    Raises:
        TrafficError: no such line, or more than :data:`MAX_LINES`.
    """
    raw_lines = [(i, raw) for i, raw in enumerate(text.removeprefix("\ufeff").splitlines(), 1)
                 if raw.strip()]
    if not raw_lines:
        raise TrafficError(f"{file}: no request (one JSON object a line)")
    if len(raw_lines) > MAX_LINES:
        raise _error(file, raw_lines[MAX_LINES][0], None, f"more than {MAX_LINES} request "
                     f"lines ({len(raw_lines)}); allowed: at most {MAX_LINES} (MAX_LINES, see "
                     "docs/traffic.md)")
    return raw_lines


def refuse_other_formats(text: str, file: str) -> None:
    """Refuse, as one error, a file that is stepwarm's other input given
    where traffic goes: a ``STEPWARM_RECORD`` recording (JSON Lines, but
    steps without prompts) or a scenario file (TOML: every line would be
    refused as invalid JSON).

    Raises:
        TrafficError: what the file is and where it goes instead.
    """
    from stepwarm.record import looks_like_recording
    from stepwarm.scenario.load import looks_like_scenario

    if looks_like_recording(text):
        raise TrafficError(f"{file}:1: a STEPWARM_RECORD recording, not a traffic file (its "
                           "steps hold no prompts); make a scenario of it with `stepwarm "
                           f"scenario from-record {file} -o FILE.toml` and give it with -s")
    if looks_like_scenario(text):
        raise TrafficError(f"{file}: a scenario file (TOML), not a traffic file (JSON Lines, one "
                           "request a line: docs/traffic.md); give a scenario with -s "
                           f"{file}")


def check_json(text: str, file: str, limits: TrafficLimits | None = None) -> None:
    """The checks that need neither vLLM nor the model: the file holds
    request lines, at most :data:`MAX_LINES`, each a JSON object. A junk file
    (empty, binary, not JSON) is refused by these before vLLM is imported.
    Where some lines are not JSON objects, the others' fields are checked
    too (as :func:`parse_line` does, less vLLM's ``SamplingParams``, which
    would import vLLM), so that every bad line is named at once.

    With ``limits`` (the model's, read without vLLM), those lines are
    checked against them too (the twelfth trial: a prompt past
    ``max_model_len`` beside a line that is no JSON went unsaid).

    Raises:
        TrafficError: every line that is not a JSON object and every field
            error of those that are (one a line, in line order; at most
            :data:`~stepwarm.scenario.errors.MAX_ERRORS`, then how many more),
            and a last line naming the lines whose ``sampling`` vLLM checks
            once the file is JSON.
    """
    refuse_other_formats(text, file)
    errors: list[TrafficError] = []
    unchecked, json_errors = [], 0
    for i, raw in _request_lines(text, file):
        try:
            _json_object(raw, file, i)
        except TrafficError as e:
            errors.append(e)
            json_errors += 1
            continue
        try:  # its fields too, in case another line is no JSON object
            request = parse_line(raw, file, i, sampling=False)
        except TrafficError as e:
            errors.append(e)
            if _has_sampling(raw):  # its sampling: checked once the file is JSON
                unchecked.append(i)
            continue
        if request.sampling:
            unchecked.append(i)
        if limits is not None:
            errors.extend(_limit_errors(TrafficLine(i, request), file, limits))
    if not json_errors:
        return  # the fields' errors come with the limits' (loads_traffic)
    raise _unchecked_sampling(errors, file, unchecked, "every line is a JSON object")


def _unchecked_sampling(errors: list[TrafficError], file: str, unchecked: list[int],
                        once: str) -> TrafficError:
    """``errors`` as one, with a last line naming the lines whose
    ``sampling`` vLLM's ``SamplingParams`` checks ``once`` (none: no line)."""
    err = TrafficError.of(errors, file)
    if not unchecked:
        return err
    note = (f"{file}: the sampling of line(s) {_ranges(unchecked)} is checked by vLLM's "
            f"SamplingParams once {once}")
    out = TrafficError(f"{err}\n{note}", [*err.errors, note])
    out.unchecked_sampling = tuple(unchecked)
    return out


def _ranges(numbers: list[int]) -> str:
    """``[1, 2, 3, 7]`` -> ``1-3, 7``."""
    out: list[str] = []
    for n in numbers:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def loads_traffic(text: str, file: str, limits: TrafficLimits | None = None,
                  sampling: bool = True) -> Traffic:
    """Parse a whole traffic file (blank lines are skipped; a leading
    byte-order mark is dropped).

    Args:
        text: the file's text.
        file: its name, for messages.
        limits: also check every line that parses against these
            (:func:`check_limits`), so that a file's format and limit errors
            are reported together, in line order.
        sampling: check each ``sampling`` table with vLLM's
            ``SamplingParams`` (which imports vLLM; False: not checked).

    Raises:
        TrafficError: every bad line's errors (one a line), a file of more
            than :data:`MAX_LINES` lines or :data:`MAX_REQUESTS` requests, one
            that holds no request, or a recording or scenario file
            (:func:`refuse_other_formats`).
    """
    refuse_other_formats(text, file)
    raw_lines = _request_lines(text, file)
    lines, errors, requests = [], [], 0
    unchecked: list[int] = []  # lines whose sampling table vLLM has not checked
    for i, raw in raw_lines:
        try:
            tl = TrafficLine(i, parse_line(raw, file, i, sampling))
        except TrafficError as e:
            errors.append(e)
            if not sampling and _has_sampling(raw):  # its sampling: checked with the rest
                unchecked.append(i)
            if sampling and limits is not None:  # vLLM refused its sampling: its limits too
                with contextlib.suppress(TrafficError):
                    errors.extend(_limit_errors(
                        TrafficLine(i, parse_line(raw, file, i, sampling=False)), file, limits))
            continue
        lines.append(tl)
        if not sampling and tl.request.sampling:
            unchecked.append(i)
        if limits is not None:
            errors.extend(_limit_errors(tl, file, limits))
        requests += tl.request.count
        if requests > MAX_REQUESTS:
            errors.append(_error(file, i, "count", f"the file's requests add up to {requests} "
                                 f"here; allowed: at most {MAX_REQUESTS} in all lines "
                                 "(MAX_REQUESTS, see docs/traffic.md)"))
            break
    if errors:
        raise _unchecked_sampling(errors, file, unchecked, "the errors above are mended")
    traffic = Traffic(source=file, lines=tuple(lines))
    if limits is not None:
        fitting(traffic, limits)  # refuses a file whose every line is left out
    return traffic


def _has_sampling(raw: str) -> bool:
    """Whether a line is a JSON object with a ``sampling`` table that is not empty."""
    try:
        data = json.loads(raw)
    except ValueError:
        return False
    return isinstance(data, dict) and isinstance(data.get("sampling"), dict) and \
        bool(data["sampling"])


def builtin_path() -> Path:
    """The built-in traffic file (``stepwarm/coverage/builtin.jsonl``)."""
    # beside this module (a clone named stepwarm in the working directory
    # would be importlib.resources' package)
    return Path(__file__).with_name("builtin.jsonl")


def load_traffic(path: str | Path | None, limits: TrafficLimits | None = None) -> Traffic:
    """Read and check a traffic file; ``None`` or ``"builtin"`` is the built-in one;
    with ``limits``, every line is checked against them too (:func:`loads_traffic`).

    Raises:
        TrafficError: unreadable file, not UTF-8, or a bad line (file, line, field).
    """
    return loads_traffic(*read_traffic(path), limits)


def read_traffic(path: str | Path | None) -> tuple[str, str]:
    """A traffic file's text and its name for messages (``None`` or
    ``"builtin"``: the built-in one), at most :data:`MAX_FILE_BYTES` read.

    Raises:
        TrafficError: unreadable, too large, or not UTF-8.
    """
    p = builtin_path() if path is None or str(path) == BUILTIN else Path(path)
    try:
        text = read_text_capped(p, MAX_FILE_BYTES)  # a BOM (Windows editors) is dropped
    except FileTooLarge:
        raise TrafficError(f"{p}: traffic file of more than {MAX_FILE_BYTES} bytes; allowed: at "
                           f"most {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES, see docs/traffic.md)"
                           ) from None
    except NotUtf8 as e:
        raise TrafficError(f"{p}:{e.line}: not UTF-8 (byte {e.byte:#04x} at offset "
                           f"{e.offset})") from None
    except OSError as e:
        raise TrafficError(f"{p}: cannot read: {e.strerror or e}") from None
    return text, str(p)


def check_limits(traffic: Traffic, limits: TrafficLimits) -> None:
    """Check every line against the engine: prompt + ``max_tokens`` within
    ``max_model_len``, token ids below ``vocab_size``, logprob counts within
    ``max_logprobs`` (each where ``limits`` knows it).

    Raises:
        TrafficError: every line the engine would refuse (file, line, field), one a line.
    """
    errors = [e for tl in traffic.lines for e in _limit_errors(tl, traffic.source, limits)]
    if errors:
        raise TrafficError.of(errors, traffic.source)


def _limit_errors(tl: TrafficLine, file: str, limits: TrafficLimits) -> list[TrafficError]:
    """What :func:`check_limits` finds wrong with one line (empty: it fits)."""
    errors = []
    src = limits.source
    req, where = tl.request, (file, tl.line)
    kwargs = req.sampling_kwargs(limits.max_logprobs or 0)
    total = _total_len(req, kwargs)
    if limits.max_model_len is not None and total > limits.max_model_len and not req.if_fits:
        errors.append(_error(*where, "prompt", f"{req.prompt_len} tokens + max_tokens "
                             f"{kwargs.get('max_tokens')} = {total} > {src} max_model_len "
                             f"{limits.max_model_len}"))
    if limits.vocab_size is not None:
        for key, ids in (("allowed_token_ids", kwargs.get("allowed_token_ids") or []),
                         ("logit_bias", [int(k) for k in (kwargs.get("logit_bias") or {})
                                         if str(k).lstrip("-").isdigit()])):
            if ids and max(ids) >= limits.vocab_size:
                errors.append(_error(*where, f"sampling.{key}", f"token id {max(ids)} >= the "
                                     f"model's vocab_size {limits.vocab_size}"))
    if (limits.vocab_size is not None and isinstance(req.prompt, list)
            and max(req.prompt) >= limits.vocab_size):
        errors.append(_error(*where, "prompt", f"token id {max(req.prompt)} >= the model's "
                             f"vocab_size {limits.vocab_size}"))
    for key in MAX_FIELDS if limits.max_logprobs is not None else ():
        value = kwargs.get(key)
        if isinstance(value, int) and value > limits.max_logprobs:  # type: ignore[operator]
            errors.append(_error(*where, f"sampling.{key}", f"{value} > {src} max_logprobs "
                                 f"{limits.max_logprobs} (use \"max\", or -e max_logprobs=N)"))
    return errors


def _total_len(req: TrafficRequest, kwargs: Mapping[str, Any]) -> int:
    """The tokens a request reaches: its prompt and ``max_tokens`` (of its
    ``SamplingParams`` keyword arguments ``kwargs``)."""
    return req.prompt_len + int(kwargs.get("max_tokens") or 0)


def fitting(traffic: Traffic, limits: TrafficLimits) -> tuple[Traffic, list[str]]:
    """``traffic`` less its ``if_fits`` lines whose prompt + ``max_tokens``
    is longer than ``limits.max_model_len``, and a note for each line left
    out (``FILE:LINE: prompt: ...: left out``).

    Raises:
        TrafficError: every line is left out (nothing would be replayed, and
            a gate on the report would pass on nothing).
    """
    if limits.max_model_len is None:
        return traffic, []
    kept, notes = [], []
    for tl in traffic.lines:
        req = tl.request
        total = _total_len(req, req.sampling_kwargs(limits.max_logprobs or 0))
        if req.if_fits and total > limits.max_model_len:
            notes.append(f"{traffic.source}:{tl.line}: prompt: {req.prompt_len} tokens + "
                         f"max_tokens {total - req.prompt_len} > {limits.source} max_model_len "
                         f"{limits.max_model_len}: left out (if_fits)")
        else:
            kept.append(tl)
    if traffic.lines and not kept:
        raise TrafficError(f"{traffic.source}: every line is left out (if_fits: prompt + "
                           f"max_tokens > {limits.source} max_model_len "
                           f"{limits.max_model_len}), so no request would be replayed; give "
                           "a line that fits, or a longer max_model_len (-e max_model_len=N)")
    return Traffic(traffic.source, tuple(kept)), notes


#: ``config.json`` keys vLLM derives the longest sequence from
#: (``ModelArchConfigConvertor.derive_max_model_len_and_key``: the smallest wins).
MAX_LEN_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")


def config_limits(config: Mapping[str, Any], engine_args: Mapping[str, Any]) -> TrafficLimits:
    """What a model accepts, told before its engine starts: ``vocab_size``
    from ``config.json`` (its ``text_config`` for a multimodal model), and
    ``max_model_len`` from the engine arguments, else as vLLM derives it
    (``_get_and_verify_max_len``: the smallest of :data:`MAX_LEN_KEYS`),
    left unknown where RoPE scaling may raise it or vLLM fits it to memory
    (``max_model_len = -1``). ``max_logprobs`` is left to the engine.

    Args:
        config: the model's ``config.json``.
        engine_args: the ``vllm.LLM`` keyword arguments it will start with.

    Returns:
        Limits whose unknown fields are None, never stricter than the engine's.
    """
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    vocab = text.get("vocab_size", config.get("vocab_size"))
    max_len = engine_args.get("max_model_len")
    if max_len is None:
        found = [text[k] for k in MAX_LEN_KEYS if isinstance(text.get(k), int)]
        scaled = any(text.get(k) or config.get(k) for k in ("rope_scaling", "rope_parameters"))
        max_len = min(found) if found and not scaled else None
    if isinstance(max_len, str) or not isinstance(max_len, int) or max_len <= 0:
        max_len = None  # "32k"-style strings and -1 are vLLM's to read
    return TrafficLimits(max_model_len=max_len,
                         vocab_size=vocab if isinstance(vocab, int) else None,
                         max_logprobs=None, source="the model's")


def limits_before_start(model: str | None, engine_args: Mapping[str, Any]) -> TrafficLimits:
    """:func:`config_limits` of what ``--model`` names (a directory, a zoo
    model, or None: the embedded tiny Llama with its small limits), with
    the ``-e`` engine arguments; all unknown where there is no readable
    ``config.json`` (the engine start then says why), but ``max_logprobs``:
    ``-e max_logprobs`` or vLLM's default (20)."""
    from stepwarm.engine import TINY_MODEL_ENGINE_ARGS
    from stepwarm.zoo import ZOO, resolve, write_model

    if model is None:
        path, args = write_model("tiny-llama"), {**ZOO["tiny-llama"].engine_args,
                                                 **TINY_MODEL_ENGINE_ARGS}
    else:
        found, args = resolve(model)
        path = found or Path(model)
    from stepwarm.engine_args import facts

    max_logprobs = {**args, **engine_args}.get("max_logprobs", facts()["max_logprobs"])
    if not isinstance(max_logprobs, int) or isinstance(max_logprobs, bool) or max_logprobs < 0:
        max_logprobs = None  # -1 (the vocabulary) or a value vLLM will refuse itself
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return TrafficLimits(max_model_len=None, vocab_size=None, max_logprobs=max_logprobs)
    if not isinstance(config, dict):
        return TrafficLimits(max_model_len=None, vocab_size=None, max_logprobs=max_logprobs)
    return dataclasses.replace(config_limits(config, {**args, **engine_args}),
                               max_logprobs=max_logprobs)


def prompts_for(tl: TrafficLine, round_: int, vocab_size: int,
                extra: int = 0) -> tuple[list[list[int]], list[int] | None]:
    """The prompt token ids of one replay of a line, and its priming prompt.

    Made-up ids are distinct across the line's requests and its two rounds
    (different first token), so no request hits another's cached blocks
    unless the line has a ``prefix``; then every request starts with the
    group's prefix (the same in both rounds) and the priming prompt is that
    prefix plus one token.

    Args:
        tl: the line.
        round_: 0 for the first replay, 1 for the second.
        vocab_size: the model's vocabulary (ids stay below it).
        extra: tokens added to (or, negative, taken from) the end of every
            prompt: the same requests at a token count the line's own runs
            did not have (the new-size control, :func:`new_size_delta`).

    Returns:
        (one token id list per request, the priming prompt or None).
    """
    req = tl.request
    span = max(vocab_size - FIRST_TOKEN_ID, 1)

    def made_up(n: int, seed: int) -> list[int]:
        return [FIRST_TOKEN_ID + (seed + 11 * i) % span for i in range(n)]

    seed = tl.line * 7919 + round_ * 104729
    if isinstance(req.prompt, list):
        given = list(req.prompt)
        ids = given[:len(given) + extra] if extra < 0 else given + made_up(extra, seed)
        return [list(ids) for _ in range(req.count)], None
    if req.prefix is None:
        return [made_up(req.prompt + extra, seed + 37 * c) for c in range(req.count)], None
    head = made_up(req.prefix.tokens, zlib.crc32(req.prefix.group.encode()))
    tail = req.prompt + extra - req.prefix.tokens
    prompts = [head + made_up(tail, seed + 37 * c) for c in range(req.count)]
    return prompts, head + made_up(1, seed + 1)


def new_size_delta(tl: TrafficLine, limits: TrafficLimits, max_tokens: int) -> int:
    """Tokens to add to each of the line's prompts so that its steps have a
    token count its own runs did not (the new-size control): +1 where the
    prompt and ``max_tokens`` still fit ``max_model_len``, else -1 where a
    token can go (a prefix line keeps its prefix and one token after it),
    else 0 (no control for this line)."""
    req = tl.request
    if limits.max_model_len is None or req.prompt_len + 1 + max_tokens <= limits.max_model_len:
        return 1
    keep = req.prefix.tokens + 1 if req.prefix is not None else 1
    return -1 if req.prompt_len - 1 >= keep else 0


def prefix_notes(traffic: Traffic, enable_caching: bool, alignment: int) -> list[str]:
    """Lines whose ``prefix`` the engine will not hit, one note each (the
    line still runs: it just measures no prefix hit): prefix caching is off,
    or the prefix is shorter than ``alignment``, the tokens a hit is counted
    in (:func:`stepwarm.blocks.prefix_cache_alignment`: the block size, the
    LCM of a hybrid's block sizes)."""
    notes = []
    for tl in traffic.lines:
        prefix = tl.request.prefix
        if prefix is None:
            continue
        where = f"{traffic.source}:{tl.line}: prefix"
        if not enable_caching:
            notes.append(f"{where}: the engine runs without prefix caching: no prefix hit "
                         "(vLLM: --enable-prefix-caching)")
        elif prefix.tokens < alignment:
            notes.append(f"{where}: {prefix.tokens} tokens is less than one prefix-cache "
                         f"block of this engine ({alignment} tokens): no prefix hit")
    return notes
