"""Sweeps: one size key standing for many values.

A size (a request's ``prompt``, a step's ``tokens`` or ``batch``, an integer
sampling field such as ``logprobs``) is an integer, an expression, or one of
three sweep forms:

- ``{ buckets = "LIMIT", min = ... }``: Triton's specialization classes
  (``1``, a multiple of 16, neither) within ``min..LIMIT``
  (:func:`stepwarm.expressions.buckets`);
- ``{ range = [START, STOP], step = S }``: ``START, START + S, ...`` up to
  ``STOP`` (both ends included when on the stride; ``step`` default 1);
- ``{ values = [V, ...] }``: the values listed, in order, duplicates dropped;
- ``{ pow2_classes = [LO, HI], offset = N }``: one value per power-of-two
  class of ``v + N`` for ``v`` in ``LO..HI`` (the largest of each class, so
  HI is always one): a kernel whose ``tl.constexpr`` block is
  ``next_power_of_2(v + N)`` compiles once per class
  (:func:`pow2_class_values`; vLLM's ``_topk_log_softmax_kernel`` takes
  ``TOPK_BLOCK_SIZE = next_power_of_2(k + 1)`` for ``logprobs`` /
  ``prompt_logprobs`` = k, hence ``offset = 1`` there).

Every bound is an expression over runner facts. A sweep stands for at most
:data:`MAX_SWEEP` values (a request each, or a step each).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Annotated, Any, Union

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool,
                      ValidationError, ValidationInfo)

from stepwarm.scenario.errors import got
from stepwarm.expressions import ExpressionError, buckets, check_names

#: Most values one sweep may stand for (requests or steps).
MAX_SWEEP = 4096

EXPR_HELP = ('an integer, or an expression string over runner facts such as '
             '"max_num_batched_tokens // 2" or "block_size(0) * 2"')
SIZE_HELP = (EXPR_HELP + ', or a sweep: { buckets = "<limit>" } (Triton classes 1, a multiple of 16, '
             'neither), { range = [<start>, <stop>], step = <n> }, { values = [...] } or '
             '{ pow2_classes = [<lo>, <hi>], offset = <n> } (one value per class of '
             'next_power_of_2(value + offset))')


#: Whether :func:`check_expr` checks an expression's names and form
#: (:func:`~stepwarm.expressions.check_names`); off while a file the format
#: refused is read again for the entries the runner can still check (the
#: expander then says the same errors, beside the runner's).
_NAMES_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("names_checked", default=True)


@contextlib.contextmanager
def names_unchecked() -> Iterator[None]:
    """Validate without :func:`~stepwarm.expressions.check_names` (see
    :data:`_NAMES_CHECKED`)."""
    token = _NAMES_CHECKED.set(False)
    try:
        yield
    finally:
        _NAMES_CHECKED.reset(token)


def check_expr(v: Any) -> Any:
    """An integer or an expression string, else ValueError saying what is
    allowed; an expression's names and form are checked here, before any
    runner is known (its values by the expander)."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"{got(v)}; allowed: {EXPR_HELP}")
    if isinstance(v, str) and _NAMES_CHECKED.get():
        check_names(v)
    return v


Expr = Annotated[Union[int, str], BeforeValidator(check_expr)]


def within(low: int, high: int) -> AfterValidator:
    """For :data:`Expr` fields whose integer literals are checked against
    ``low..high`` with the file's format (limits that no runner changes:
    ``repeat``, ``count``); an expression's value is still checked by the
    expander, in the same words."""
    def check(v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, int) and not low <= v <= high:
            raise ValueError(f"{info.field_name} {v} is out of range; allowed: {low}..{high}")
        return v

    return AfterValidator(check)


class Buckets(BaseModel):
    """A size swept over Triton's specialization classes: 1, a multiple of 16
    and neither, within ``min..buckets`` (see ``stepwarm.expressions.buckets``)."""

    model_config = ConfigDict(extra="forbid")
    buckets: Expr = Field(description="Upper limit (expression), e.g. \"max_num_batched_tokens\".")
    min: Expr = Field(default=1, description="Lower limit (expression).")


class Range(BaseModel):
    """``{ range = [start, stop], step = n }``: start, start + n, ... up to stop (inclusive)."""

    model_config = ConfigDict(extra="forbid")
    range: list[Expr] = Field(min_length=2, max_length=2, description=(
        "[start, stop], expressions; both ends included when stop is on the stride."))
    step: Expr = Field(default=1, description="Stride (expression, >= 1).")


class Values(BaseModel):
    """``{ values = [...] }``: exactly these values, in order."""

    model_config = ConfigDict(extra="forbid")
    values: list[Expr] = Field(min_length=1, description="The values (expressions).")


class Pow2Classes(BaseModel):
    """``{ pow2_classes = [lo, hi], offset = n }``: one value per power-of-two
    class of ``value + offset`` within ``lo..hi``, the largest of each."""

    model_config = ConfigDict(extra="forbid")
    pow2_classes: list[Expr] = Field(min_length=2, max_length=2, description=(
        "[lo, hi], expressions: the values swept, both included; one per class of "
        "next_power_of_2(value + offset), the largest of each (hi is always one)."))
    offset: Expr = Field(default=0, description=(
        "Added before the class is taken (expression, >= 0): 1 for logprobs and "
        "prompt_logprobs, whose kernel block is next_power_of_2(k + 1)."))
    triton_int: StrictBool = Field(default=False, description=(
        "value + offset is also an integer argument of the kernel, which Triton "
        "compiles apart when it is 1 or divisible by 16: within each class, the "
        "largest value of each of those kinds too (true for logprobs and "
        "prompt_logprobs: the kernel's topk is k + 1)."))


Sweep = Union[Buckets, Range, Values, Pow2Classes]
_FORMS = {"buckets": Buckets, "range": Range, "values": Values, "pow2_classes": Pow2Classes}
_FORMS_HELP = ('{ buckets = "<limit>" } with an optional min = <expression>, '
               '{ range = [<start>, <stop>] } with an optional step = <expression>, '
               '{ values = [<expression>, ...] }, '
               'or { pow2_classes = [<lo>, <hi>] } with an optional offset = <expression>')


def check_size(v: Any) -> Any:
    """A size: an expression, or a table that is one of the sweep forms."""
    if isinstance(v, dict):
        forms = [k for k in _FORMS if k in v]
        if len(forms) != 1:
            raise ValueError(f"got table with keys {sorted(v)}; allowed: {_FORMS_HELP}")
        model = _FORMS[forms[0]]
        extra = sorted(set(v) - set(model.model_fields))
        if extra:
            raise ValueError(f"unknown key {extra[0]!r} in a {forms[0]} sweep; allowed keys: "
                             + ", ".join(model.model_fields))
        try:
            return model.model_validate(v)
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            if err["type"] == "value_error":   # check_expr's own "got ...; allowed: ..."
                raise ValueError(f"{forms[0]} sweep, {where}: {err['ctx']['error']}") from None
            if err["type"] == "bool_type":
                raise ValueError(f"{forms[0]} sweep, {where}: got {err['input']!r}; "
                                 "allowed: true or false") from None
            raise ValueError(f"{forms[0]} sweep, {where}: {err['msg']} (got {err['input']!r}); "
                             f"allowed: {_FORMS_HELP}") from None
    return check_expr(v)


Size = Annotated[Union[int, str, Buckets, Range, Values, Pow2Classes],
                 BeforeValidator(check_size)]


def describe(sweep: Sweep) -> str:
    """The sweep as written, for messages: ``range [16, 4096] step 1``."""
    if isinstance(sweep, Range):
        return f"range [{sweep.range[0]!r}, {sweep.range[1]!r}] step {sweep.step!r}"
    if isinstance(sweep, Values):
        return f"values {sweep.values!r}"
    if isinstance(sweep, Pow2Classes):
        return (f"pow2_classes [{sweep.pow2_classes[0]!r}, {sweep.pow2_classes[1]!r}] "
                f"offset {sweep.offset!r}" + (" triton_int" if sweep.triton_int else ""))
    return f"buckets {sweep.buckets!r} min {sweep.min!r}"


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2``: the least power of two >= ``n`` (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def pow2_class_values(lo: int, hi: int, offset: int = 0, *,
                      triton_int: bool = False) -> list[int]:
    """One value per class of ``next_power_of_2(v + offset)`` for ``v`` in
    ``lo..hi``: the largest ``v`` of each class, ascending (so ``hi`` is the
    last). ``pow2_class_values(1, 20, 1)`` is 1, 3, 7, 15, 20: blocks 2, 4, 8,
    16 and 32 of ``_topk_log_softmax_kernel`` for logprobs 1..20.

    With ``triton_int``, ``v + offset`` is also an integer argument, which
    Triton specializes on (``== 1``, ``% 16 == 0``, neither): within each
    class, the largest ``v`` of each of those kinds. ``pow2_class_values(1,
    20, 1, triton_int=True)`` is 1, 3, 7, 14, 15, 20: block 16 twice, topk 15
    and topk 16 (measured on the H200, vLLM 0.26: logprobs 9 compiled a
    ``TOPK_BLOCK_SIZE=16`` variant after logprobs 15 had warmed the other).

    Raises:
        ExpressionError: ``lo > hi``, ``offset < 0`` or ``lo + offset < 0``
            (the message names the bounds).
    """
    problems = []  # every one at once
    if lo > hi:
        problems.append(f"pow2_classes [{lo}, {hi}] is backwards (lo {lo} > hi {hi}); "
                        "allowed: lo <= hi")
    if offset < 0:
        problems.append(f"pow2_classes offset {offset} is negative; allowed: offset >= 0")
    elif lo + offset < 0:
        problems.append(f"pow2_classes [{lo}, {hi}] offset {offset}: lo + offset = "
                        f"{lo + offset} is negative; allowed: lo + offset >= 0")
    if problems:
        raise ExpressionError("; ".join(problems))
    out: list[int] = []
    v = lo
    while v <= hi:
        top = min(max(next_power_of_2(v + offset) - offset, v), hi)  # the class's largest value
        if triton_int:
            out.extend(_int_kinds(v, top, offset))
        else:
            out.append(top)
        v = top + 1
    return out


def _int_kinds(first: int, last: int, offset: int) -> list[int]:
    """The largest ``v`` in ``first..last`` of each kind of ``v + offset``
    Triton compiles apart (1, divisible by 16, neither), ascending."""
    def kind(v: int) -> str:
        n = v + offset
        return "one" if n == 1 else "div16" if n % 16 == 0 else "plain"

    picked: dict[str, int] = {}
    for v in range(last, max(first, last - 32) - 1, -1):  # every kind shows within 17 values
        picked.setdefault(kind(v), v)
    return sorted(picked.values())


def sweep_values(sweep: Sweep, value: Callable[[Any, str], int]) -> list[int]:
    """The values a sweep stands for, in order, without duplicates.

    Args:
        sweep: the form.
        value: evaluates one expression (``value(expr, what)``, ``what``
            naming it for messages, e.g. "range start") to an int.

    Raises:
        ExpressionError: a range with ``stop < start`` or ``step < 1``,
            bucket bounds out of order, or more than :data:`MAX_SWEEP`
            values (the message names the sweep and the count).
    """
    if isinstance(sweep, Buckets):
        lim, lo = value(sweep.buckets, "bucket limit"), value(sweep.min, "bucket min")
        if lo > lim:
            raise ExpressionError(f"{describe(sweep)}: min {lo} is above the limit {lim} "
                                  "(min defaults to 1); allowed: min <= buckets")
        return list(buckets(lim, lo))
    if isinstance(sweep, Pow2Classes):
        lo = value(sweep.pow2_classes[0], "pow2_classes lo")
        hi = value(sweep.pow2_classes[1], "pow2_classes hi")
        return pow2_class_values(lo, hi, value(sweep.offset, "pow2_classes offset"),
                                 triton_int=sweep.triton_int)
    if isinstance(sweep, Range):
        start, stop = value(sweep.range[0], "range start"), value(sweep.range[1], "range stop")
        step = value(sweep.step, "range step")
        if step < 1 or stop < start:
            raise ExpressionError(
                f"{describe(sweep)} is empty or backwards (start {start}, stop {stop}, "
                f"step {step}); allowed: start <= stop and step >= 1")
        count = (stop - start) // step + 1
        if count > MAX_SWEEP:
            raise ExpressionError(
                f"{describe(sweep)} makes {count} values (start {start}, stop {stop}); "
                f"allowed: at most {MAX_SWEEP} per sweep (a larger step, or a narrower range)")
        return list(range(start, stop + 1, step))
    out = list(dict.fromkeys(value(v, "value") for v in sweep.values))
    if len(out) > MAX_SWEEP:
        raise ExpressionError(f"values list of {len(out)} values; allowed: at most {MAX_SWEEP}")
    return out
