"""Data parallel engines the way vLLM's offline data parallel example starts
them: one ``tests/engine_probe.py`` process per DP rank, each an unmodified
``vllm.LLM`` told its rank by ``VLLM_DP_RANK`` / ``VLLM_DP_SIZE`` /
``VLLM_DP_MASTER_IP`` / ``VLLM_DP_MASTER_PORT`` (``LLM(data_parallel_size=2)``
itself is refused by vLLM 0.32: "is not supported for single-process usage
and may hang").

Used by ``tests/e2e/test_data_parallel.py`` (CPU) and
``tests/gpu/test_data_parallel.py`` (the GPU lane).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PROBE = Path(__file__).parent / "engine_probe.py"


@dataclass
class RankRun:
    """One DP rank's engine process."""

    dp_rank: int
    returncode: int | None
    stdout: str
    stderr: str
    result: dict | None

    @property
    def log(self) -> str:
        return self.stdout + self.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_dp(spec: dict, env: dict[str, str], dp: int = 2,
           timeout_s: float = 600) -> tuple[list[RankRun], float]:
    """Start ``dp`` DP ranks of ``spec`` (engine_probe.py's spec) at once;
    wait for all (killed after ``timeout_s``: returncode None). Returns the
    runs by DP rank and the wall seconds until the last one ended."""
    port = str(_free_port())
    procs, files = [], []
    with tempfile.TemporaryDirectory() as results:  # each rank's result file
        t0 = time.monotonic()
        for rank in range(dp):
            rank_env = {**env, "VLLM_DP_RANK": str(rank), "VLLM_DP_RANK_LOCAL": str(rank),
                        "VLLM_DP_SIZE": str(dp), "VLLM_DP_MASTER_IP": "127.0.0.1",
                        "VLLM_DP_MASTER_PORT": port,
                        "STEPWARM_PROBE_RESULT": os.path.join(results, f"{rank}.json")}
            # Files, not pipes: a rank blocked on a full pipe would hold its peer
            # in a collective.
            out_f, err_f = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out_f, err_f))
            procs.append(subprocess.Popen([sys.executable, str(PROBE), json.dumps(spec)],
                                          stdout=out_f, stderr=err_f, text=True, env=rank_env,
                                          start_new_session=True))
        runs = []
        for rank, (proc, (out_f, err_f)) in enumerate(zip(procs, files)):
            try:
                proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
                code: int | None = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            out_f.seek(0)
            err_f.seek(0)
            out, err = out_f.read(), err_f.read()
            out_f.close()
            err_f.close()
            # The result file, not the RESULT line: the engine's processes share
            # the probe's stdout, and one of their log lines can split that line.
            path = Path(results, f"{rank}.json")
            runs.append(RankRun(rank, code, out, err,
                                json.loads(path.read_text()) if path.exists() else None))
    return runs, time.monotonic() - t0


if __name__ == "__main__":  # python tests/dp_probe.py SPEC_JSON [DP]
    found, wall = run_dp(json.loads(sys.argv[1]), dict(os.environ),
                         int(sys.argv[2]) if len(sys.argv) > 2 else 2)
    for r in found:
        print(f"dp {r.dp_rank}: rc={r.returncode} RESULT {json.dumps(r.result)}")
    print(f"wall {wall:.1f} s")
