"""Whether an output file (``--json``, ``--output``, ``--timeline``) can be
written, found before any work: a report that cannot be saved must not cost
an engine start and a run."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written, or None when it can.

    Checks, in order: its directory exists (else the nearest part of the
    path that is a file, not a directory, is named, or the missing
    directory); ``path`` is not a directory; a file can be made in its
    directory (a temporary one, made and removed at once: a read-only file
    system or ``/proc`` refuse it); where ``path`` exists, it opens to
    append (nothing is written to it).

    Args:
        path: the output file as the user gave it.

    Returns:
        One clause (``directory /x does not exist``, ``/etc/passwd is a
        file, not a directory``, ...) or None.
    """
    parent = path.parent
    if not parent.is_dir():
        for above in (parent, *parent.parents):
            if above.exists() and not above.is_dir():
                return f"{above} is a file, not a directory"
        return f"directory {parent} does not exist"
    if path.is_dir():
        return "is a directory; allowed: a file path"
    try:
        fd, probe = tempfile.mkstemp(prefix=".stepwarm-write-test-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"cannot be written: no file can be made in {parent} ({e.strerror or e})"
    if path.exists():
        try:
            with open(path, "ab"):  # opened to append, nothing written
                pass
        except OSError as e:
            return f"cannot be written: it does not open to append ({e.strerror or e})"
    return None
