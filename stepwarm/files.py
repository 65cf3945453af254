"""Reading a user's input file (scenario, traffic file) with a cap on its
size that holds for every kind of file: a device or a pipe reports size 0
to ``stat``, so the cap is on the bytes read, never more than ``cap + 1``.
A named pipe (FIFO) nobody writes to is refused at once rather than waited
on, a socket or a directory refused by its type."""

from __future__ import annotations

import codecs
import errno
import fcntl
import os
import re
import stat
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
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb", buffering=0) as f:
        data = _read(fd, f, cap + 1)
    if len(data) > cap:
        raise FileTooLarge(cap)
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = e.start + bom
        raise NotUtf8(data[at], at, data[:at].count(b"\n") + 1) from None


def file_type(mode: int) -> str:
    """What a file that is not a regular one is, for messages: ``a FIFO``."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return f"mode {mode:#o}"


def _read(fd: int, f, n: int) -> bytes:
    """At most ``n`` bytes of the file open on ``fd`` (opened non-blocking):
    a regular file or a character device (``/dev/stdin``, ``/dev/null``) is
    read as it is; a pipe with a writer is read to its end; a FIFO with none
    (its first read finds the end at once) is refused, as is any other type."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode):
        try:
            first = os.read(fd, n)
        except BlockingIOError:  # a writer, nothing written yet
            first = None
        if first == b"":
            raise OSError(errno.EINVAL, "a FIFO that nobody writes to; allowed: a file, or a "
                                        "pipe being written")
        return _read_blocking(fd, f, n, first or b"")
    if not (stat.S_ISREG(mode) or stat.S_ISCHR(mode)):
        raise OSError(errno.EINVAL, f"not a regular file ({file_type(mode)})")
    return _read_blocking(fd, f, n, b"")


def _read_blocking(fd: int, f, n: int, data: bytes) -> bytes:
    """``data`` and what follows it, up to ``n`` bytes, ``fd`` now blocking."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            break
        data += more
    return data


#: What :func:`json_nested_deeper` reads: JSON strings (skipped whole) and brackets.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_nested_deeper(text: str, limit: int) -> bool:
    """Whether JSON ``text`` nests arrays and objects deeper than ``limit``
    levels, counted before ``json.loads`` (which recurses per level and
    raises ``RecursionError`` near a thousand)."""
    depth = 0
    for m in _JSON_TOKEN.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
            if depth > limit:
                return True
        elif tok in "]}":
            depth -= 1
    return False
