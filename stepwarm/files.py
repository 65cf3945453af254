"""Reading a user's input file (scenario, traffic file) with a cap on its
size that holds for every kind of file: a device or a pipe reports size 0
to ``stat``, so the cap is on the bytes read, never more than ``cap + 1``."""

from __future__ import annotations

import codecs
import sys
from pathlib import Path

#: The most digits Python reads into one integer (``int_max_str_digits``): a
#: longer integer literal makes ``tomllib`` and ``json`` raise ``ValueError``.
MAX_INT_DIGITS = sys.get_int_max_str_digits() or 4300


class FileTooLarge(ValueError):
    """More than ``cap`` bytes were there to read."""

    def __init__(self, cap: int):
        super().__init__(f"more than {cap} bytes")
        self.cap = cap


class NotUtf8(ValueError):
    """A byte that is not UTF-8, where it is (offsets count a leading BOM)."""

    def __init__(self, byte: int, offset: int, line: int):
        super().__init__(f"not UTF-8 (byte {byte:#04x} at offset {offset}, line {line})")
        self.byte, self.offset, self.line = byte, offset, line


def read_text_capped(path: Path, cap: int) -> str:
    """The file's text, UTF-8 (a leading byte-order mark dropped).

    Raises:
        FileTooLarge: the file has more than ``cap`` bytes (at most
            ``cap + 1`` were read).
        NotUtf8: it is not UTF-8.
        OSError: it cannot be read.
    """
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    if len(data) > cap:
        raise FileTooLarge(cap)
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start + bom
        raise NotUtf8(data[at], at, data[:at].count(b"\n") + 1) from None
