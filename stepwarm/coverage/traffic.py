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
* ``prefix``: ``{"group": NAME, "tokens": N}``: the prompt's first ``N``
  tokens are the group's shared prefix, cached by a priming request before
  each replay, so the measured request is a prefix hit.
* ``name``: how the report calls the request (default ``line N``).

Every line is checked before the engine starts (:func:`load_traffic`), and
against the engine's limits once it is up (:func:`check_limits`); an error
names the file, the line and the field.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError

#: Name of the traffic file shipped with stepwarm (``stepwarm coverage`` with no TRAFFIC).
BUILTIN = "builtin"
#: ``SamplingParams`` values stepwarm sets unless a line gives them: short,
#: fixed-length outputs and no detokenization (a ``--model`` directory may
#: have no tokenizer).
SAMPLING_DEFAULTS: dict[str, Any] = {"max_tokens": 4, "ignore_eos": True, "detokenize": False}
#: Fields that may be ``"max"`` (the engine's ``max_logprobs``).
MAX_FIELDS = ("logprobs", "prompt_logprobs")
#: The first token id made-up prompts use (0-2 are often pad/bos/eos).
FIRST_TOKEN_ID = 3


class TrafficError(ValueError):
    """A traffic file stepwarm will not replay; the message names the file,
    the line and the field (``FILE:LINE: FIELD: what is wrong``)."""


class Prefix(BaseModel):
    """A shared prompt prefix: ``tokens`` leading tokens common to every line of ``group``."""

    model_config = ConfigDict(extra="forbid")
    group: str = Field(min_length=1)
    tokens: PositiveInt


class TrafficRequest(BaseModel):
    """One line of a traffic file (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    prompt: Union[PositiveInt, list[NonNegativeInt]]
    count: PositiveInt = 1
    sampling: dict[str, Any] = Field(default_factory=dict)
    prefix: Prefix | None = None

    @property
    def prompt_len(self) -> int:
        """Prompt length in tokens."""
        return self.prompt if isinstance(self.prompt, int) else len(self.prompt)

    def sampling_kwargs(self, max_logprobs: int) -> dict[str, Any]:
        """``SamplingParams`` keyword arguments: :data:`SAMPLING_DEFAULTS`,
        then the line's table, ``"max"`` replaced by ``max_logprobs``."""
        kwargs = {**SAMPLING_DEFAULTS, **self.sampling}
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
    """What the engine accepts: read off it once it is up."""

    max_model_len: int
    vocab_size: int
    max_logprobs: int


def _error(file: str, line: int, field: str | None, message: str) -> TrafficError:
    return TrafficError(f"{file}:{line}: " + (f"{field}: " if field else "") + message)


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc)


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
    defaults, ``"max"`` as 1) and turn its refusal into a located error."""
    kwargs = {**SAMPLING_DEFAULTS, **{k: (1 if k in MAX_FIELDS and v == "max" else v)
                                      for k, v in table.items()}}
    try:
        make_sampling_params(kwargs)
    except KeyError as e:
        raise _error(file, line, f"sampling.{e.args[0]}", "not a SamplingParams field") from None
    except Exception as e:  # noqa: BLE001 - msgspec and vLLM raise several types
        text = re.sub(r" \(parameter=.*\)$", "", str(e))
        path = _MSGSPEC_PATH.search(text)
        param = getattr(e, "parameter", None) or (path.group(1) if path else None)
        field = param if param in table else next(
            (k for k in sorted(table, key=len, reverse=True) if k in text), None)
        raise _error(file, line, f"sampling.{field}" if field else "sampling",
                     f"vLLM's SamplingParams refused it: {text}") from None


def parse_line(text: str, file: str, line: int) -> TrafficRequest:
    """One JSON line -> :class:`TrafficRequest`, checked by pydantic and by
    vLLM's ``SamplingParams``.

    Raises:
        TrafficError: ``FILE:LINE: FIELD: message`` (``FILE:LINE:COLUMN`` for
            invalid JSON).
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TrafficError(f"{file}:{line}:{e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise _error(file, line, None, f"expected a JSON object (one request a line), "
                                       f"got {type(data).__name__}")
    try:
        request = TrafficRequest.model_validate(data)
    except ValidationError as e:
        err = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")[0]
        loc = _loc(err["loc"]) or "line"
        msg = err["msg"]
        if err["loc"][0] == "prompt" and err["type"] != "missing":
            index = next((p for p in err["loc"][1:] if isinstance(p, int)), None)
            loc = "prompt" if index is None else f"prompt[{index}]"
            msg = (f"{data.get('prompt')!r}: allowed: a length (an integer > 0) or a list of "
                   "token ids (integers >= 0)")
        elif err["type"] == "extra_forbidden":
            allowed = ", ".join(TrafficRequest.model_fields if len(err["loc"]) == 1
                                else Prefix.model_fields)
            msg = f"unknown field; allowed: {allowed}"
        raise _error(file, line, loc, msg) from None
    if request.prefix is not None and request.prefix.tokens >= request.prompt_len:
        raise _error(file, line, "prefix.tokens",
                     f"{request.prefix.tokens} must be less than the prompt's "
                     f"{request.prompt_len} tokens (the request adds tokens of its own)")
    for key in MAX_FIELDS:
        value = request.sampling.get(key)
        if isinstance(value, str) and value != "max":
            raise _error(file, line, f"sampling.{key}", f"{value!r}: allowed: a number or \"max\"")
    _check_sampling(request.sampling, file, line)
    return request


def loads_traffic(text: str, file: str) -> Traffic:
    """Parse a whole traffic file (blank lines are skipped).

    Raises:
        TrafficError: at the first bad line, or when no line holds a request.
    """
    lines = tuple(TrafficLine(i, parse_line(raw, file, i))
                  for i, raw in enumerate(text.splitlines(), 1) if raw.strip())
    if not lines:
        raise TrafficError(f"{file}: no request (one JSON object a line)")
    return Traffic(source=file, lines=lines)


def builtin_path() -> Path:
    """The built-in traffic file (``stepwarm/coverage/builtin.jsonl``)."""
    return Path(str(resources.files("stepwarm.coverage").joinpath("builtin.jsonl")))


def load_traffic(path: str | Path | None) -> Traffic:
    """Read and check a traffic file; ``None`` or ``"builtin"`` is the built-in one.

    Raises:
        TrafficError: unreadable file, not UTF-8, or a bad line (file, line, field).
    """
    p = builtin_path() if path is None or str(path) == BUILTIN else Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TrafficError(f"{p}: not UTF-8 (byte {e.start})") from None
    except OSError as e:
        raise TrafficError(f"{p}: cannot read: {e.strerror or e}") from None
    return loads_traffic(text, str(p))


def check_limits(traffic: Traffic, limits: TrafficLimits) -> None:
    """Check every line against the engine: prompt + ``max_tokens`` within
    ``max_model_len``, token ids below ``vocab_size``, logprob counts within
    ``max_logprobs``.

    Raises:
        TrafficError: the first line that the engine would refuse (file, line, field).
    """
    for tl in traffic.lines:
        req, where = tl.request, (traffic.source, tl.line)
        kwargs = req.sampling_kwargs(limits.max_logprobs)
        total = req.prompt_len + int(kwargs.get("max_tokens") or 0)
        if total > limits.max_model_len:
            raise _error(*where, "prompt", f"{req.prompt_len} tokens + max_tokens "
                         f"{kwargs.get('max_tokens')} = {total} > the engine's max_model_len "
                         f"{limits.max_model_len}")
        if isinstance(req.prompt, list) and max(req.prompt) >= limits.vocab_size:
            raise _error(*where, "prompt", f"token id {max(req.prompt)} >= the model's "
                         f"vocab_size {limits.vocab_size}")
        for key in MAX_FIELDS:
            value = kwargs.get(key)
            if isinstance(value, int) and value > limits.max_logprobs:
                raise _error(*where, f"sampling.{key}", f"{value} > the engine's max_logprobs "
                             f"{limits.max_logprobs} (use \"max\", or -e max_logprobs=N)")


def prompts_for(tl: TrafficLine, round_: int, vocab_size: int) -> tuple[list[list[int]], list[int] | None]:
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

    Returns:
        (one token id list per request, the priming prompt or None).
    """
    req = tl.request
    span = max(vocab_size - FIRST_TOKEN_ID, 1)

    def made_up(n: int, seed: int) -> list[int]:
        return [FIRST_TOKEN_ID + (seed + 11 * i) % span for i in range(n)]

    if isinstance(req.prompt, list):
        return [list(req.prompt) for _ in range(req.count)], None
    seed = tl.line * 7919 + round_ * 104729
    if req.prefix is None:
        return [made_up(req.prompt, seed + 37 * c) for c in range(req.count)], None
    head = made_up(req.prefix.tokens, zlib.crc32(req.prefix.group.encode()))
    tail = req.prompt - req.prefix.tokens
    prompts = [head + made_up(tail, seed + 37 * c) for c in range(req.count)]
    return prompts, head + made_up(1, seed + 1)
