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


class StreamLost(Exception):
    """Writing to standard output (or error) failed: a full disk
    (``> /dev/full``), an I/O error. :func:`stepwarm.cli.main` says it in
    one line rather than a traceback."""

    def __init__(self, name: str, error: OSError):
        super().__init__(f"cannot write to standard {'output' if name == 'stdout' else 'error'}: "
                         f"{error.strerror or error}")
        self.name, self.error = name, error


class NoTrailingSpaces:
    """A text stream that writes what it is given less the spaces at the end
    of each line. Spaces at the end of a write are held until the next write
    shows whether a newline follows them (then they are dropped) or text
    (then they are written first)."""

    def __init__(self, stream: TextIO, name: str = "stdout"):
        self._stream = stream
        self._held = ""
        self._name = name

    def write(self, text: str) -> int:
        joined = _BEFORE_NEWLINE.sub("\n", self._held + text)
        body = joined.rstrip(" ")
        self._held = joined[len(body):]
        try:
            self._stream.write(body)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StreamLost(self._name, e) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise StreamLost(self._name, e) from None

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
        setattr(sys, name, NoTrailingSpaces(stream, name))
