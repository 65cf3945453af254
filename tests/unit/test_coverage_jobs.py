"""``benchmarks/coverage_jobs.py``: job files read, commands built, every
job run to an outcome (a fast fake command stands in for ``stepwarm
coverage``: the script's own bookkeeping is what is tested here)."""

from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
from pathlib import Path

import pytest

_PATH = Path(__file__).parents[2] / "benchmarks" / "coverage_jobs.py"
_spec = importlib.util.spec_from_file_location("coverage_jobs", _PATH)
assert _spec and _spec.loader
jobs_mod = importlib.util.module_from_spec(_spec)
sys.modules["coverage_jobs"] = jobs_mod
_spec.loader.exec_module(jobs_mod)


def test_a_job_line_becomes_the_coverage_command(tmp_path):
    f = tmp_path / "jobs.jsonl"
    f.write_text('# a comment\n\n{"name": "eagle-v1", "model": "tiny-llama-eagle", '
                 '"env": {"VLLM_USE_V2_MODEL_RUNNER": "0"}, "engine_args": {"max_num_seqs": 32, '
                 '"speculative_config": {"method": "eagle"}}, "scenarios": ["all"], '
                 '"traffic": "traffic/speculators.jsonl", "args": ["--threshold", "1.2"]}\n')
    (job,) = jobs_mod.read_jobs(f)
    assert job.env == {"VLLM_USE_V2_MODEL_RUNNER": "0"} and job.timeout_s == 900.0
    ((_, *cmd),) = job.commands(Path("/r"))
    assert cmd == [
        "-m", "stepwarm", "coverage", "--model", "tiny-llama-eagle", "--compare",
        "--json", "/r/eagle-v1.json", "-e", "max_num_seqs=32",
        "-e", 'speculative_config={"method": "eagle"}', "-s", "all",
        "--threshold", "1.2", "traffic/speculators.jsonl"]


def test_without_the_baseline_a_job_is_a_fresh_run_then_its_restart_on_the_same_caches(
        tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    job = jobs_mod.Job(name="8b", model="llama-3.1-8b-l2", baseline=False,
                       engine_args={"max_num_seqs": 8}, args=["--trace"])
    (_, *fresh), (_, *restart) = job.commands(tmp_path)
    cache = fresh[fresh.index("--cache-dir") + 1]
    assert not Path(cache).exists() and Path(cache).parent.is_dir()  # new, so it starts empty
    assert fresh == ["-m", "stepwarm", "coverage", "--model", "llama-3.1-8b-l2",
                     "--cache-dir", cache, "--json", str(tmp_path / "8b.stepwarm.json"),
                     "-e", "max_num_seqs=8", "--trace"]
    assert restart == ["-m", "stepwarm", "coverage", "--model", "llama-3.1-8b-l2",
                       "--cache-dir", cache, "--json", str(tmp_path / "8b.stepwarm_restart.json"),
                       "--warm-cache", "-e", "max_num_seqs=8", "--trace"]


def test_every_bad_job_line_is_named_at_once(tmp_path):
    f = tmp_path / "jobs.jsonl"
    f.write_text('{"name": "a", "model": "m"}\n[1]\n{"name": "a", "model": "m"}\n'
                 '{"name": "b", "modle": "m"}\n{oops\n')
    with pytest.raises(SystemExit) as e:
        jobs_mod.read_jobs(f)
    assert str(e.value).splitlines() == [
        f"{f}:2: a job is a JSON object",
        f"{f}:3: name 'a' used twice",
        f"{f}:4: unknown field 'modle'; missing 'model'",
        f"{f}:5: not JSON: Expecting property name enclosed in double quotes",
    ]


def test_jobs_run_a_few_at_a_time_and_a_slow_one_is_stopped(tmp_path, monkeypatch):
    def commands(self, results):
        return [[sys.executable, "-c", self.model]]

    monkeypatch.setattr(jobs_mod.Job, "commands", commands)
    jobs = [jobs_mod.Job(name="ok", model="print('done')"),
            jobs_mod.Job(name="fails", model="raise SystemExit(3)"),
            jobs_mod.Job(name="slow", model="import time; time.sleep(60)", timeout_s=1)]
    state = jobs_mod.run(jobs, tmp_path, parallel=2)
    assert {n: s["rc"] for n, s in state.items()} == {"ok": 0, "fails": 3, "slow": "timeout"}
    assert json.loads((tmp_path / "progress.json").read_text()) == state
    assert (tmp_path / "ok.log").read_text() == "done\n"
    assert all(s["state"] == "done" and s["json"] is False for s in state.values())


def test_a_job_without_the_baseline_runs_its_restart_after_a_flagged_fresh_run(
        tmp_path, monkeypatch):
    """Exit 1 (a request flagged) still leads to the restart; both reports end in
    NAME.json, the job's status is the fresh run's; a run that breaks (2) ends
    the job there."""
    def commands(self, results):
        write = "import json, sys; json.dump({{'mode': '{run}'}}, open(sys.argv[1], 'w')); "
        return [[sys.executable, "-c", write.format(run=run) + code,
                 str(self._part(results, run))]
                for run, code in zip(("stepwarm", "stepwarm_restart"), self.model.split("|"))]

    monkeypatch.setattr(jobs_mod.Job, "commands", commands)
    jobs = [jobs_mod.Job(name="flagged", model="raise SystemExit(1)|print('restarted')",
                         baseline=False),
            jobs_mod.Job(name="broken", model="raise SystemExit(2)|print('not run')",
                         baseline=False)]
    state = jobs_mod.run(jobs, tmp_path, parallel=2)
    assert {n: (s["rc"], s["json"]) for n, s in state.items()} == {
        "flagged": (1, True), "broken": (2, True)}
    assert json.loads((tmp_path / "flagged.json").read_text()) == {
        "stepwarm": {"mode": "stepwarm"}, "stepwarm_restart": {"mode": "stepwarm_restart"}}
    assert json.loads((tmp_path / "broken.json").read_text()) == {
        "stepwarm": {"mode": "stepwarm"}}
    assert (tmp_path / "flagged.log").read_text() == "restarted\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "broken.json", "broken.log", "flagged.json", "flagged.log", "progress.json"]
