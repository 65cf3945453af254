"""``-q``: errors only, from every library: Python warnings and other
libraries' warning-level loggers are silenced, errors still show, and the
processes vLLM starts inherit the same (torch's C++ warnings too)."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import logging, os, warnings
from stepwarm.cli import _setup
_setup(False, {quiet})
warnings.warn("torch.distributed.reduce_op is deprecated", FutureWarning)
logging.getLogger("torch.distributed").warning("NUMA binding: a warning")
logging.getLogger("torch").error("an error")
from tqdm import tqdm  # vLLM's weight-loading bar ("Loading safetensors checkpoint shards")
for _ in tqdm(range(2), desc="Loading shards"):
    pass
print(os.environ.get("PYTHONWARNINGS"), os.environ.get("TORCH_CPP_LOG_LEVEL"),
      os.environ.get("TRANSFORMERS_VERBOSITY"))
"""


def setup_in_a_fresh_process(quiet: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONWARNINGS", "TORCH_CPP_LOG_LEVEL", "TRANSFORMERS_VERBOSITY",
                        "TQDM_DISABLE")}
    return subprocess.run([sys.executable, "-c", SCRIPT.format(quiet=quiet)],
                          capture_output=True, text=True, env=env, timeout=60)


def test_quiet_silences_warnings_and_keeps_errors():
    r = setup_in_a_fresh_process(True)
    assert (r.returncode, r.stdout) == (0, "ignore ERROR error\n")
    assert r.stderr == "an error\n"


def test_without_quiet_the_warnings_show():
    r = setup_in_a_fresh_process(False)
    assert (r.returncode, r.stdout) == (0, "None None None\n")
    assert r.stderr.startswith("<string>:5: FutureWarning: torch.distributed.reduce_op is "
                               "deprecated\nNUMA binding: a warning\nan error\n")
    assert "Loading shards: 100%" in r.stderr
