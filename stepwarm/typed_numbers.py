"""Numeric command-line options parsed without failing.

click stops at the first option it cannot convert (``--gate abc``), before
the command checks anything else; stepwarm says every bad input at once. An
option given one of these parsers (``typer.Option(parser=...)``) keeps the
text typed as :class:`Unparsed`, and the command's own checks name it beside
the other errors.
"""

from __future__ import annotations

import math


class Unparsed(str):
    """What was typed for a numeric option that is no number: kept, so that
    the command says it beside every other error instead of click's one."""


def whole_number(text: str) -> int | Unparsed:
    """The parser of a whole-number option (``typer.Option(parser=...)``)."""
    try:
        return int(text)
    except ValueError:
        return Unparsed(text)


def number(text: str) -> float | Unparsed:
    """The parser of a numeric option; ``nan`` / ``inf`` are kept as typed."""
    try:
        value = float(text)
    except ValueError:
        return Unparsed(text)
    return value if math.isfinite(value) else Unparsed(text)
