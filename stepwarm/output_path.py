"""Whether an output file (``--json``, ``--output``, ``--timeline``) can be
written, found before any work: a report that cannot be saved must not cost
an engine start and a run; and writing it whole or not at all
(:func:`write_atomic`)."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


class TypedPath(type(Path())):  # type: ignore[misc]
    """A path that keeps the text the user typed (``typed``): :class:`Path`
    reads ``''`` as ``.`` and drops a trailing ``/``, and an output option
    must refuse both, naming them as typed."""

    typed: str


def typed_path(text: str) -> Path:
    """The parser of an output option (``typer.Option(parser=...)``)."""
    path = TypedPath(text)
    path.typed = text
    return path


def _typed(path: Path) -> str:
    """The text the user typed for ``path`` (:func:`typed_path`), else its
    own spelling."""
    return getattr(path, "typed", str(path))


def shown(path: Path) -> str:
    """``path`` as the user typed it, ``''`` for an empty one."""
    return _typed(path) or "''"


def names_a_file(path: Path) -> bool:
    """Whether ``path`` as typed names a file (not empty, no trailing ``/``,
    not a directory): only then is its suffix worth checking."""
    typed = _typed(path)
    return bool(typed) and not typed.endswith(os.sep) and not path.is_dir()


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
    typed = getattr(path, "typed", None)
    if typed == "":
        return "is empty; allowed: a file path"
    if typed == "-":
        return ("would be a file named '-' (a report is not written to standard output "
                "this way); allowed: a file path, or /dev/stdout")
    if str(path) == ".":
        return "is the current directory; allowed: a file path"
    if typed is not None and typed.endswith(os.sep) and not path.is_dir():
        return f"ends in {os.sep!r}, naming a directory; allowed: a file path"
    parent = path.parent
    if not parent.is_dir():
        for above in (parent, *parent.parents):
            if above.exists() and not above.is_dir():
                return f"{above} is a file, not a directory"
        return f"directory {parent} does not exist"
    if path.is_dir():
        return "is a directory; allowed: a file path"
    if path.is_symlink() and not path.exists():  # written through: its target's directory
        real = Path(os.path.realpath(path))
        if not real.parent.is_dir():
            return (f"is a symbolic link to {real}, whose directory does not exist (or a loop); "
                    "allowed: a file path, or a link to one in an existing directory")
    # a stream or a device is written where it points, nothing made beside it
    # (the third trial: a probe file made and removed in /dev for /dev/stdout)
    if not (_stream(path) or (path.exists() and not path.is_file())):
        try:
            fd, probe = tempfile.mkstemp(prefix=".stepwarm-write-test-", dir=parent)
            os.close(fd)
            os.unlink(probe)
        except OSError as e:
            return f"cannot be written: no file can be made in {parent} ({e.strerror or e})"
    if path.exists():
        device = _device(path) or _named_pipe(path)
        if device:
            return device
        try:
            with open(path, "ab"):  # opened to append, nothing written
                pass
        except OSError as e:
            return f"cannot be written: it does not open to append ({e.strerror or e})"
    return None


def _device(path: Path) -> str | None:
    """A character device other than ``/dev/null`` or a terminal (``/dev/full``
    takes the open and refuses the write, after the run): named as one. Pipes
    (``/dev/stdout`` into ``| jq``) and terminals are written as files."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if not stat.S_ISCHR(mode) or os.path.realpath(path) == os.devnull:
        return None
    try:
        with open(path, "ab") as f:
            if f.isatty():
                return None
    except OSError:
        pass
    return f"is a device ({os.path.realpath(path)}), not a file; allowed: a file path"


def _named_pipe(path: Path) -> str | None:
    """A named pipe (FIFO) on a file system: opening it to write waits for a
    reader, so it is refused (the pipe of ``/dev/stdout | jq`` has no name
    there and is written as a file)."""
    real = os.path.realpath(path)
    try:
        return (f"is a named pipe (FIFO {real}), not a file; allowed: a regular file's path"
                if stat.S_ISFIFO(os.lstat(real).st_mode) else None)
    except OSError:
        return None


def _stream(path: Path) -> bool:
    """Whether ``path`` is one of this process's streams or a device
    (``/dev/stdout``, ``/proc/self/fd/1``, ``/dev/null``): written where it
    points, never replaced (replacing ``/dev/stdout`` would replace the
    machine's link, and a file it was redirected to would lose what this
    process had printed)."""
    text = os.path.abspath(path)
    return text in ("/dev/stdout", "/dev/stderr") or text.startswith(
        ("/dev/fd/", "/proc/self/fd/", "/proc/thread-self/fd/")) or bool(
        re.match(r"/proc/\d+/fd/", text))


def is_stdout(path: Path) -> bool:
    """Whether ``path`` is this process's standard output (``/dev/stdout``,
    ``/proc/self/fd/1``, or the file or pipe it was redirected to): a
    command writes such a report after everything else it prints, so the
    two do not interleave."""
    try:
        a, b = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file
    beside it, then renamed over it (a full disk leaves the old file, or
    none, never a cut one). A symbolic link is written through: its target
    is replaced, the link kept. A pipe, a terminal, ``/dev/null`` or a
    stream such as ``/dev/stdout`` (redirected to a file or not) is written
    as it is, appended to (nothing can be renamed over it).

    Raises:
        OSError: it could not be written (the temporary file is removed).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = None
    if _stream(path) or (mode is not None and not stat.S_ISREG(mode)):
        for out in (sys.stdout, sys.stderr):  # what was printed goes first
            with contextlib.suppress(Exception):
                out.flush()
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)
        return
    path = Path(os.path.realpath(path))  # a link's target is written, the link kept
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (mode & 0o777) if mode is not None else 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def clashes(outputs: Sequence[tuple[str, Path | None]],
            inputs: Sequence[tuple[str, str | Path]] = (), *,
            written: str = "the report",
            inside: Sequence[tuple[str, Path]] = ()) -> list[str]:
    """Two outputs that are one file (the second write would replace the
    first's), and an output that is an input the command reads (a scenario
    file, the traffic file: the report would overwrite it), one line each.

    Args:
        outputs: ``(option, path)``, e.g. ``("--json", Path("r.json"))``; None
            for an option not given.
        inputs: ``(what, path)``, e.g. ``("scenario", "my.toml")``; a name
            that is no file (a built-in scenario) is passed over.
        written: what the outputs are, in the message (``the scenario``).
        inside: ``(what, directory)`` whose files the command writes (a zoo
            model's, before the engine loads it): an output in it, existing
            or not, would be replaced or would replace one of them.
    """
    def key(path: str | Path) -> str:
        return os.path.normcase(os.path.realpath(path))

    errors, seen = [], {}
    for option, path in outputs:
        if path is None or str(path) == ".":
            continue
        if Path(path).exists() and not Path(path).is_file():
            continue  # /dev/null, /dev/stdout: written by each, nothing replaced
        k = key(path)
        if k in seen:
            errors.append(f"{option} {path}: the same file as {seen[k]}; the second would "
                          "replace the first: allowed: another file")
        else:
            seen[k] = f"{option} {path}"
    for what, path in inputs:
        if not Path(path).is_file():
            continue
        k = key(path)
        if k in seen:
            errors.append(f"{seen[k]}: it is the {what} {path}, which {written} would "
                          "replace; allowed: another file")
    for what, directory in inside:
        root = key(directory)
        for k, option in seen.items():
            if os.path.commonpath([root, k]) == root:
                errors.append(f"{option}: it is in the {what} {directory}, whose files "
                              f"stepwarm writes for vLLM to load; {written} would replace "
                              "one, or be replaced; allowed: a file elsewhere")
    return errors


def model_files(model: str | None) -> list[tuple[str, Path]]:
    """The files of a ``--model`` directory (and of its subdirectories one
    level down: a drafter's), as :func:`clashes` inputs: a report written
    over the model's ``config.json`` or weights would leave a model vLLM
    cannot load (the tenth trial). A zoo name or a hub id: none here."""
    if not model or not Path(model).is_dir():
        return []
    root = Path(model)
    files = [p for p in root.iterdir() if p.is_file()]
    files += [q for p in root.iterdir() if p.is_dir() for q in p.iterdir() if q.is_file()]
    return [("model's file", f) for f in sorted(files)]
