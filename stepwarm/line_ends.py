"""No line of stepwarm's output ends with a space where it is piped.

rich pads some lines to the console's width (``--help``'s usage and blank
lines, a table title, a line it wraps itself); a log or a diff of piped output
then shows spaces no one typed. :func:`strip_trailing_spaces` wraps a piped
``sys.stdout`` / ``sys.stderr`` so that the spaces before each newline are
dropped as they are written; a terminal's streams are left alone (rich's live
tables redraw there).
"""

from __future__ import annotations

import re
import sys
from typing import Any, TextIO

_BEFORE_NEWLINE = re.compile(r" +\n")


class NoTrailingSpaces:
    """A text stream that writes what it is given less the spaces at the end
    of each line. Spaces at the end of a write are held until the next write
    shows whether a newline follows them (then they are dropped) or text
    (then they are written first)."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self._held = ""

    def write(self, text: str) -> int:
        joined = _BEFORE_NEWLINE.sub("\n", self._held + text)
        body = joined.rstrip(" ")
        self._held = joined[len(body):]
        self._stream.write(body)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, buffer...
        return getattr(self._stream, name)


def strip_trailing_spaces() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` in :class:`NoTrailingSpaces`
    where they are not a terminal (once; rich's consoles write to whatever
    ``sys.stdout`` / ``sys.stderr`` is when they print)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is None or isinstance(stream, NoTrailingSpaces) or stream.isatty():
            continue
        setattr(sys, name, NoTrailingSpaces(stream))
