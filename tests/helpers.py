"""Shared test helpers (no vLLM import)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from stepwarm.profile import CacheSpec, RunnerProfile

#: One full-attention KV cache group of 16-token blocks.
FULL16 = CacheSpec(kind="full_attention", block_size=16)


def make_profile(**overrides: Any) -> RunnerProfile:
    """A RunnerProfile for tests without an engine: a V1 runner with one
    full-attention group of 16-token blocks, 1000 blocks, ``max_model_len`` 256,
    4 sequences, a 128-token step budget and a vocabulary of 100; any field
    given replaces its default."""
    fields: dict[str, Any] = dict(
        runner="v1", kv_cache_groups=(FULL16,), num_blocks=1000, max_model_len=256,
        max_num_seqs=4, max_num_batched_tokens=128, vocab_size=100)
    return RunnerProfile(**{**fields, **overrides})


def in_a_terminal(args: list[str], columns: int, timeout: int = 600,
                   env: dict[str, str] | None = None,
                   stderr: Path | None = None) -> tuple[int, str]:
    """``python -m stepwarm ARGS`` with stdout and stderr on a pseudo-terminal
    ``columns`` wide (stderr to the file ``stderr`` instead, where given):
    (exit status, what the terminal showed, escapes removed)."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios

    pid, fd = pty.fork()
    if pid == 0:  # the child: the terminal's size is set before it starts
        if stderr is not None:
            err = os.open(str(stderr), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(err, 2)
        os.execve(sys.executable, [sys.executable, "-m", "stepwarm", *args],
                  {**os.environ, **(env or {})})
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    _, status = os.waitpid(pid, 0)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", out.decode(errors="replace"))
    return os.waitstatus_to_exitcode(status), text


def unwrapped(text: str) -> str:
    """stepwarm's own lines as they were before wrapping at 80 columns (or
    ``COLUMNS``): each continuation line (indented) joined to the line
    before it with one space."""
    out: list[str] = []
    for line in text.splitlines():
        if out and line[:1] == " ":
            out[-1] += " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def without_unchecked_note(text: str) -> str:
    """``text`` without the last line naming the steps left unchecked after
    a failed ``[requests]`` entry (``FILE: the steps were checked only as far
    as ...``, :meth:`~stepwarm.scenario.expand._Expander.declare_and_expand_steps`),
    for tests of the errors before it."""
    lines = text.split("\n")
    while lines and ": the steps were checked only as far as" in lines[-1]:
        lines.pop()
    return "\n".join(lines)
