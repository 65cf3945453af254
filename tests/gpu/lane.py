"""Helpers of the GPU lane (``tests/gpu``): what the tests start and how.

Every engine runs in a subprocess the way users run it: ``vllm serve`` (the
OpenAI server) or an unmodified ``vllm.LLM`` in vLLM's default
multiprocessing mode (``tests/engine_probe.py``), with the stepwarm plugin
found through its ``vllm.general_plugins`` entry point and configured by the
``STEPWARM_*`` variables only.

``STEPWARM_LANE_RECORD=FILE`` appends one JSON line per engine start (test,
start-up seconds, stepwarm's log lines) for the closing note.
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
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

PROBE = Path(__file__).parent.parent / "engine_probe.py"
FAULT_PLUGIN = Path(__file__).parent.parent / "e2e" / "fault_plugin"


def gpu_count() -> int:
    """CUDA devices this process sees (0 without a CUDA build of torch)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        return 0


def needs_gpus(n: int):
    """Skip unless ``n`` CUDA devices are present (``STEPWARM_LANE_DRY_RUN=1``
    runs the lane's harness on the CPU build instead, to check the harness)."""
    if os.environ.get("STEPWARM_LANE_DRY_RUN") == "1":
        return pytest.mark.gpu
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} CUDA GPU(s) and vLLM's CUDA build")


def lane_env(**extra: str) -> dict[str, str]:
    """This environment without ``STEPWARM_*``, plus ``extra``, with fresh
    Triton / vLLM / Inductor cache directories: every engine start compiles
    from cold, so start-up times with and without stepwarm compare."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWARM_")}
    for var in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        env[var] = tempfile.mkdtemp(prefix=var.lower() + "-")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    if os.environ.get("STEPWARM_LANE_DRY_RUN") == "1":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    env.update(extra)
    return env


def stepwarm_lines(log: str) -> list[str]:
    """The log lines stepwarm wrote (its logger is ``vllm.stepwarm``)."""
    return [ln for ln in log.splitlines() if "stepwarm: " in ln or "stepwarm [" in ln]


def default_steps() -> int:
    """Steps of the ``default`` scenario for the lane's tiny Llama (8
    sequences, no speculator) on the installed vLLM: the packaged profile
    brought to this release (:func:`stepwarm.probe.installed_facts`: the
    decode steps its ``warmup_kernels`` sends), planned. 8 on vLLM 0.27 -
    0.33, 6 on 0.26."""
    from stepwarm.probe import installed_facts
    from stepwarm.profile import tiny_profile
    from stepwarm.sequences import default_plan

    profile = tiny_profile()
    profile = profile.model_copy(update=installed_facts(
        "v2", profile.kv_cache_groups, profile.enable_prefix_caching))
    return len(default_plan(profile).steps)


def scenario_ms(lines: list[str]) -> float:
    """Milliseconds stepwarm's scenarios took, from its ``N steps in M ms`` lines
    (summed over scenarios, the largest over ranks)."""
    import re

    per_rank: dict[str, float] = {}
    for ln in lines:
        m = re.search(r"stepwarm(?: \[(rank \d+)[^\]]*\])?: .*: \d+ steps in (\d+) ms", ln)
        if m:
            per_rank[m.group(1) or "rank 0"] = per_rank.get(m.group(1) or "rank 0", 0) + float(m.group(2))
    return max(per_rank.values(), default=0.0)


def record(test: str, **fields) -> None:
    """Append one JSON line to ``$STEPWARM_LANE_RECORD`` (if set)."""
    path = os.environ.get("STEPWARM_LANE_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": test, **fields}) + "\n")


def probe(spec: dict, env: dict[str, str], timeout: int = 540) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run ``tests/engine_probe.py`` with ``spec``; its process and RESULT."""
    proc = subprocess.run([sys.executable, str(PROBE), json.dumps(spec)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return proc, json.loads(lines[-1][7:]) if lines else None


@dataclass
class Server:
    """A running ``vllm serve``."""

    url: str
    proc: subprocess.Popen
    log_path: Path
    start_s: float

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def post(self, path: str, body: dict, timeout: float = 120) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command(model: Path) -> list[str]:
    """``vllm serve MODEL``. vllm-cpu 0.32's ``vllm`` command looks up the
    version of a distribution named ``vllm`` and fails (PackageNotFoundError);
    there (lane dry runs) the same server starts from its module."""
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model)]


@contextmanager
def vllm_serve(model: Path, args: list[str], env: dict[str, str], log_path: Path,
               timeout_s: float = 420) -> Iterator[Server]:
    """``vllm serve MODEL ARGS`` until ``/health`` answers 200; stopped on exit.

    Raises:
        RuntimeError: the server exited or did not become healthy in
            ``timeout_s`` (the message holds the end of its log).
    """
    port = _free_port()
    cmd = [*_serve_command(model), "--host", "127.0.0.1", "--port", str(port), *args]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        # cwd away from the checkout: the plugin comes from the installed package.
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=log_path.parent, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n"
                                   + log_path.read_text(errors="replace")[-6000:])
            if time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"vllm serve not healthy after {timeout_s:.0f} s:\n"
                                   + log_path.read_text(errors="replace")[-6000:])
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        yield Server(url=url, proc=proc, log_path=log_path, start_s=time.monotonic() - t0)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
