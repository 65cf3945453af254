"""Run many ``stepwarm coverage --compare`` jobs, a few at a time, and keep going.

    python benchmarks/coverage_jobs.py JOBS.jsonl --results DIR [--parallel N] [--only NAME ...]

Made for a lent GPU machine that is held for a fixed time: every job is its
own ``python -m stepwarm coverage --compare`` process (its own fresh compile
caches, its own ``--json`` and log under ``DIR``), bounded by the job's
``timeout_s``; a job that fails or times out is recorded and the next one
starts. ``DIR/progress.json`` says, at every change, which jobs are done,
running or waiting, with each one's exit status and seconds, so a caller can
collect what finished while the rest still run.

``JOBS.jsonl``, one job a line::

    {"name": "llama-eagle-v2", "model": "tiny-llama-eagle",
     "env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "engine_args": {"max_num_seqs": 16},
     "traffic": "benchmarks/traffic/speculators.jsonl", "scenarios": ["all"],
     "timeout_s": 900, "args": ["--threshold", "1.2"]}

Only ``name`` and ``model`` are required. Engine arguments are passed as
``-e KEY=JSON``; ``args`` are more ``stepwarm coverage`` options.
``"baseline": false`` leaves vLLM's own runs out: stepwarm with fresh caches,
then restarted on the caches it filled (two engine starts, not four), both in
``NAME.json`` under the keys ``--compare`` uses (``stepwarm``,
``stepwarm_restart``) so one reader takes either.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Fields a job line may carry.
FIELDS = {"name", "model", "env", "engine_args", "traffic", "scenarios", "timeout_s", "args",
          "baseline"}


@dataclass
class Job:
    name: str
    model: str
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    traffic: str = ""
    scenarios: list[str] = field(default_factory=list)
    timeout_s: float = 900.0
    args: list[str] = field(default_factory=list)
    baseline: bool = True

    def commands(self, results: Path) -> list[list[str]]:
        """The coverage runs of this job, one after another: one ``--compare``;
        or, without the baseline, a fresh run into a new cache directory and its
        restart (``--warm-cache``) on it."""
        if self.baseline:
            return [self._command(["--compare", "--json", str(results / f"{self.name}.json")])]
        cache = Path(tempfile.mkdtemp(prefix=f"stepwarm-job-{self.name}-")) / "cache"
        return [self._command(["--cache-dir", str(cache), "--json", str(self._part(results, run))]
                              + (["--warm-cache"] if run == "stepwarm_restart" else []))
                for run in ("stepwarm", "stepwarm_restart")]

    def _part(self, results: Path, run: str) -> Path:
        return results / f"{self.name}.{run}.json"

    def collect(self, results: Path) -> None:
        """Without the baseline: the runs' reports merged into ``NAME.json``."""
        if self.baseline:
            return
        parts = {run: self._part(results, run) for run in ("stepwarm", "stepwarm_restart")}
        merged = {run: json.loads(p.read_text()) for run, p in parts.items() if p.is_file()}
        if merged:
            (results / f"{self.name}.json").write_text(json.dumps(merged))
        for p in parts.values():
            p.unlink(missing_ok=True)

    def _command(self, run_args: list[str]) -> list[str]:
        cmd = [sys.executable, "-m", "stepwarm", "coverage", "--model", self.model, *run_args]
        for key, value in self.engine_args.items():
            cmd += ["-e", f"{key}={json.dumps(value)}"]
        for s in self.scenarios:
            cmd += ["-s", s]
        cmd += self.args
        if self.traffic:
            cmd.append(self.traffic)
        return cmd


def read_jobs(path: Path) -> list[Job]:
    """The jobs of ``path``; every bad line is named (file:line: what) at once."""
    jobs, errors, names = [], [], set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{path}:{n}: not JSON: {e.msg}")
            continue
        if not isinstance(raw, dict):
            errors.append(f"{path}:{n}: a job is a JSON object")
            continue
        unknown = sorted(set(raw) - FIELDS)
        missing = sorted({"name", "model"} - set(raw))
        if unknown or missing:
            errors.append(f"{path}:{n}: " + "; ".join(
                [f"unknown field {u!r}" for u in unknown] + [f"missing {m!r}" for m in missing]))
            continue
        if raw["name"] in names:
            errors.append(f"{path}:{n}: name {raw['name']!r} used twice")
            continue
        names.add(raw["name"])
        jobs.append(Job(**raw))
    if errors:
        raise SystemExit("\n".join(errors))
    return jobs


def run(jobs: list[Job], results: Path, parallel: int) -> dict[str, dict]:
    results.mkdir(parents=True, exist_ok=True)
    state = {j.name: {"state": "waiting", "model": j.model} for j in jobs}
    running: dict[str, tuple[subprocess.Popen, float, Job, Any, list[list[str]]]] = {}
    waiting = list(jobs)
    rcs: dict[str, Any] = {}

    def spawn(job: Job, cmd: list[str], log: Any) -> subprocess.Popen:
        env = {**os.environ, **job.env, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)

    def save() -> None:
        tmp = results / "progress.json.tmp"
        tmp.write_text(json.dumps(state, indent=1))
        tmp.replace(results / "progress.json")

    save()
    while waiting or running:
        while waiting and len(running) < parallel:
            job = waiting.pop(0)
            log = open(results / f"{job.name}.log", "w")  # noqa: SIM115 (closed below)
            first, *rest = job.commands(results)
            running[job.name] = (spawn(job, first, log), time.monotonic(), job, log, rest)
            state[job.name] = {"state": "running", "model": job.model,
                               "started": time.strftime("%H:%M:%S")}
            save()
        time.sleep(2)
        for name, (proc, t0, job, log, rest) in list(running.items()):
            took = time.monotonic() - t0
            rc = proc.poll()
            if rc is None and took > job.timeout_s:
                os.killpg(proc.pid, 9)
                proc.wait()
                rc = "timeout"
            if rc is None:
                continue
            rcs.setdefault(name, rc)  # the job's status: its first run's, as --compare's
            if rc in (0, 1) and rest:  # 1: the run flagged a request; its restart still runs
                running[name] = (spawn(job, rest[0], log), t0, job, log, rest[1:])
                continue
            rc = rcs[name] if rc in (0, 1) else rc
            log.close()
            del running[name]
            job.collect(results)
            state[name] = {"state": "done", "model": job.model, "rc": rc, "s": round(took, 1),
                           "json": (results / f"{name}.json").is_file()}
            save()
    return state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jobs", type=Path)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="run only these job names")
    a = ap.parse_args(argv)
    jobs = read_jobs(a.jobs)
    if a.only is not None:
        unknown = sorted(set(a.only) - {j.name for j in jobs})
        if unknown:
            raise SystemExit(f"{a.jobs}: no job named {', '.join(unknown)}")
        jobs = [j for j in jobs if j.name in a.only]
    state = run(jobs, a.results, max(1, a.parallel))
    print(json.dumps(state, indent=1))
    return 0 if all(s.get("rc") in (0, 1) for s in state.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
