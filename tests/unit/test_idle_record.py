"""stepwarm.idle_record: the record of scenarios that compiled nothing, and
the compile counter it is built from (no engine)."""

from __future__ import annotations

import json

import pytest

from stepwarm.idle_record import (
    FORMAT,
    IdleRecord,
    busy_segments,
    compile_activity,
    configuration_key,
)
from stepwarm.settings import HookSettings, SettingsError
from stepwarm.worker_view import WorkerView


def test_record_round_trip_is_per_key_and_rank(tmp_path):
    key = configuration_key(["0.1.0", "0.32.0", "cfg", "env", "profile", "default\nsig"])
    assert len(key) == 64 and key != configuration_key(["0.1.0", "0.32.0", "cfg", "env",
                                                        "profile", "default\nsig2"])
    rec = IdleRecord.load(key, "rank0", tmp_path)
    assert rec.scenarios == {} and rec.gemms is None
    assert rec.busy("default", 2) is None
    assert rec.path == tmp_path / f"idle-{key[:24]}-rank0.json"
    rec.note("default", 2, [])
    rec.note("sampler-matrix", 12, {3, 11, 4})
    assert rec.save()
    assert json.loads(rec.path.read_text()) == {
        "format": FORMAT, "key": key,
        "scenarios": {"default": {"segments": 2, "busy": []},
                      "sampler-matrix": {"segments": 12, "busy": [3, 4, 11]}}}
    again = IdleRecord.load(key, "rank0", tmp_path)
    assert (again.busy("default", 2), again.busy("sampler-matrix", 12)) == (
        frozenset(), frozenset({3, 4, 11}))
    # Another segment count (another plan) or scenario: not known, all of it runs.
    assert again.busy("sampler-matrix", 13) is None and again.busy("prefix-hit", 3) is None
    # Another rank has its own file; no leftover temporary files.
    assert IdleRecord.load(key, "rank1", tmp_path).scenarios == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == [rec.path.name]


def test_record_of_another_key_or_format_or_broken_file_is_ignored(tmp_path):
    key = configuration_key(["a"])
    rec = IdleRecord.load(key, "rank0", tmp_path)
    entry = {"default": {"segments": 2, "busy": []}}
    rec.path.write_text(json.dumps({"format": FORMAT, "key": "other", "scenarios": entry}))
    assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {}
    rec.path.write_text(json.dumps({"format": FORMAT + 1, "key": key, "scenarios": entry}))
    assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {}
    # format 1 (idle per scenario, no segments): read as nothing known
    rec.path.write_text(json.dumps({"format": 1, "key": key, "idle": {"default": True}}))
    assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {}
    rec.path.write_text("{not json")
    assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {}
    # an entry that cannot be read, or names a segment the plan does not have,
    # is left out; the others are kept
    rec.path.write_text(json.dumps({"format": FORMAT, "key": key, "scenarios": {
        **entry, "a": {"segments": 2, "busy": [2]}, "b": {"busy": []}, "c": [],
        "d": {"segments": 3.9, "busy": []}, "e": {"segments": True, "busy": []},
        "f": {"segments": 4, "busy": "12"}, "g": {"segments": -1, "busy": []},
        "h": {"segments": 4, "busy": [1.0]}, "i": {"segments": 2, "busy": [-1]}}}))
    assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {"default": (2, frozenset())}
    # numbers Python's json reads but int() cannot take, and JSON too deep to
    # read: nothing known, no error (a start-up never stops on its record)
    for text in ('{"format": %d, "key": "%s", "scenarios": {"a": {"segments": Infinity, '
                 '"busy": []}, "b": {"segments": 1e400, "busy": []}, "c": {"segments": 2, '
                 '"busy": [1e400]}, "d": {"segments": NaN, "busy": []}}}' % (FORMAT, key),
                 "[" * 100_000 + "]" * 100_000):
        rec.path.write_text(text)
        assert IdleRecord.load(key, "rank0", tmp_path).scenarios == {}


def test_record_keeps_the_gemm_calls_that_loaded_a_kernel_for_one_ladder(tmp_path):
    key = configuration_key(["gemms"])
    rec = IdleRecord.load(key, "rank0", tmp_path)
    assert rec.gemm_loads("H200\n(4096, 4096)") is None
    rec.note_gemms("H200\n(4096, 4096)", [(1, 40), (0, 16384), (1, 40)])
    rec.note("default", 2, [])
    assert rec.save()
    data = json.loads(rec.path.read_text())
    assert data["gemms"]["loads"] == [[0, 16384], [1, 40]] and len(data["gemms"]["ladder"]) == 64
    again = IdleRecord.load(key, "rank0", tmp_path)
    assert again.gemm_loads("H200\n(4096, 4096)") == {(0, 16384), (1, 40)}
    # another ladder (device, shapes, counts): not known, the whole ladder runs
    assert again.gemm_loads("H100\n(4096, 4096)") is None
    assert again.busy("default", 2) == frozenset()
    # a gemms entry that cannot be read: not known; the scenarios' entries stand
    for bad in ({"ladder": 3, "loads": []}, {"ladder": "x", "loads": [[1, -2]]},
                {"ladder": "x", "loads": [[1, 2, 3]]}, {"ladder": "x", "loads": [[1.0, 2]]},
                {"ladder": "x"}, [], "x"):
        again.path.write_text(json.dumps({**data, "gemms": bad}))
        broken = IdleRecord.load(key, "rank0", tmp_path)
        assert broken.gemms is None and broken.busy("default", 2) == frozenset()


def test_a_scenario_forgotten_runs_whole():
    from pathlib import Path

    rec = IdleRecord(key="k", path=Path("/nonexistent/x.json"))
    rec.note("default", 2, [1])
    rec.forget("default")
    rec.forget("never-there")
    assert rec.busy("default", 2) is None and rec.scenarios == {}


def test_busy_segments_are_those_holding_a_step_that_compiled():
    from stepwarm.plan import PlanBuilder, PlannedRequest
    from tests.helpers import make_profile

    b = PlanBuilder(make_profile(max_num_seqs=4))
    for rid in ("_stepwarm_a_", "_stepwarm_b_", "_stepwarm_c_"):
        b.add_request(PlannedRequest(rid, 8))
        b.step("prefill", rid, prefill={rid: 8})
        b.step("finish", rid, finish=(rid,))
    plan = b.build()
    assert plan.segments() == (range(2), range(2, 4), range(4, 6))
    assert busy_segments(plan, {1, 4}) == {0, 2}
    assert busy_segments(plan, set()) == set()
    # a plan of some segments: its steps keep their indices
    assert busy_segments(plan.only([2]), {4}) == {0}


def test_a_process_writes_a_records_once_readable_by_its_user_alone(tmp_path):
    """A second warmup in one process finds everything loaded; its idle
    segments are not the start-up's, so it does not overwrite the record."""
    rec = IdleRecord.load(configuration_key(["once"]), "rank0", tmp_path)
    rec.note("default", 2, [0])
    assert rec.save()
    assert rec.path.stat().st_mode & 0o777 == 0o600  # another user's record is not trusted
    later = IdleRecord.load(rec.key, "rank0", tmp_path)
    assert later.busy("default", 2) == {0}
    later.note("default", 2, [])
    assert later.save()
    assert IdleRecord.load(rec.key, "rank0", tmp_path).busy("default", 2) == {0}


def test_a_record_path_taken_by_a_directory_leaves_no_temporary_file(tmp_path):
    rec = IdleRecord.load(configuration_key(["dir"]), "rank0", tmp_path)
    rec.path.mkdir()
    rec.note("default", 1, [])
    assert rec.save() is False and rec.save() is False
    assert sorted(p.name for p in tmp_path.iterdir()) == [rec.path.name]


def test_unwritable_directory_is_not_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rec = IdleRecord.load(configuration_key(["a"]), "rank0", blocker / "sub")
    rec.note("default", 1, [])
    assert rec.save() is False


def test_record_dir_follows_stepwarm_cache_dir_then_vllm_cache_root(tmp_path, monkeypatch):
    from stepwarm.idle_record import record_dir

    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path / "sw"))
    assert record_dir() == tmp_path / "sw"
    monkeypatch.delenv("STEPWARM_CACHE_DIR")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))
    assert record_dir() == tmp_path / "vllm" / "stepwarm"


def test_compile_activity_counts_triton_hook_calls_and_chains_the_previous_hook():
    knobs = pytest.importorskip("triton").knobs
    calls = []
    before = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda *a, **k: calls.append(k.get("key"))
    try:
        with compile_activity() as seen:
            knobs.runtime.jit_post_compile_hook(key="k1")
            knobs.runtime.jit_post_compile_hook(key="k2")
        assert seen.triton == 2 and seen.so_far() == 2 and calls == ["k1", "k2"]
        knobs.runtime.jit_post_compile_hook(key="k3")  # restored: not counted
        assert seen.so_far() == 2 and calls == ["k1", "k2", "k3"]
    finally:
        knobs.runtime.jit_post_compile_hook = before


def test_compile_activity_leaves_out_compiles_in_stepwarm_threads():
    """A sampler variant compiled in a deferred-compile thread may end while a
    later scenario runs: it is its own scenario's (its report lists it), not
    the running one's."""
    import threading

    knobs = pytest.importorskip("triton").knobs
    before = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = None
    try:
        with compile_activity() as seen:
            t = threading.Thread(target=lambda: knobs.runtime.jit_post_compile_hook(key="t"),
                                 name="stepwarm-compile_0")
            t.start()
            t.join()
            assert seen.triton == 0
            other = threading.Thread(target=lambda: knobs.runtime.jit_post_compile_hook(key="o"))
            other.start()
            other.join()
        assert seen.triton == 1
    finally:
        knobs.runtime.jit_post_compile_hook = before


def test_compile_activity_counts_dynamo_frames_and_inductor_graphs():
    from torch._dynamo.utils import counters

    with compile_activity() as idle:
        assert idle.so_far() == 0
    with compile_activity() as seen:
        counters["frames"]["ok"] += 1
        counters["inductor"]["fxgraph_cache_hit"] += 1
        assert seen.so_far() == 2 and seen.triton == 0


def test_skip_idle_setting():
    on = {"STEPWARM_SCENARIOS": "default"}
    assert HookSettings.from_env(on).skip_idle is False
    assert HookSettings.from_env({**on, "STEPWARM_SKIP_IDLE": "1"}).skip_idle is True
    assert HookSettings.from_env({**on, "STEPWARM_SKIP_IDLE": "0"}).skip_idle is False
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({**on, "STEPWARM_SKIP_IDLE": "yes"})
    assert str(e.value) == "STEPWARM_SKIP_IDLE='yes': allowed: 0 | 1"


def _planted(kind: str, path, tmp_path):
    """Put what a hostile or careless writer could at a record's path."""
    import os

    if kind == "fifo":
        os.mkfifo(path)
        return "not a regular file (a FIFO)"
    if kind == "link to /dev/zero":
        os.symlink("/dev/zero", path)
        return "a symbolic link"
    if kind == "400 MB sparse file":
        with open(path, "wb") as f:
            f.truncate(400 * 1000 * 1000)
        return f"400000000 bytes, more than {1 << 20}"
    if kind == "another user's file":
        if os.geteuid() != 0:
            pytest.skip("chown to another uid needs root")
        path.write_text(json.dumps({"format": FORMAT, "key": "k", "scenarios": {}}))
        os.chown(path, 4321, 4321)
        return f"owned by uid 4321, not this user (uid {os.geteuid()})"
    if kind == "directory":
        os.mkdir(path)
        return "not a regular file (a directory)"
    if kind == "link to my own record":
        mine = tmp_path / "mine.json"
        mine.write_text("{}")
        os.symlink(mine, path)
        return "a symbolic link"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero", "400 MB sparse file",
                                  "another user's file", "link to my own record", "directory"])
def test_a_record_that_is_not_this_users_small_regular_file_is_ignored_with_one_line(
        kind, tmp_path, caplog):
    """Every scenario runs (nothing is known), the load returns at once (a
    FIFO never blocks, /dev/zero is never read), one warning names the path
    and why; the next save replaces what was there, never writing through a
    link."""
    import os
    import stat
    import time

    key = configuration_key(["hostile"])
    path = tmp_path / f"idle-{key[:24]}-rank0.json"
    why = _planted(kind, path, tmp_path)
    t0 = time.monotonic()
    with caplog.at_level("INFO", logger="vllm.stepwarm"):
        rec = IdleRecord.load(key, "rank0", tmp_path)
    assert time.monotonic() - t0 < 5
    assert rec.scenarios == {} and rec.gemms is None and rec.busy("default", 2) is None
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"stepwarm: idle record {path} ignored: {why}; every scenario runs")]
    if kind == "directory":  # (the third trial: start-up ended in IsADirectoryError)
        return
    rec.note("default", 2, [1])
    assert rec.save()  # (a directory without the sticky bit: its writers may replace it)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    assert IdleRecord.load(key, "rank0", tmp_path).busy("default", 2) == {1}
    if kind == "link to my own record":  # the link was replaced, its target left alone
        assert (tmp_path / "mine.json").read_text() == "{}"
    from stepwarm.idle_record import _SAVED

    _SAVED.discard(path)


def test_kernel_environment_is_torch_triton_flashinfer_cuda_and_the_gpu(monkeypatch):
    """Versions read off the installed distributions (FlashInfer is never
    imported), CUDA off torch, the GPU's name where CUDA is available."""
    import sys
    from importlib import metadata

    import torch
    import triton

    from stepwarm.idle_record import kernel_environment

    flashinfer_was_imported = "flashinfer" in sys.modules
    assert kernel_environment() == [
        f"torch {torch.__version__}", f"triton {triton.__version__}", "flashinfer none",
        f"cuda {torch.version.cuda or 'none'}", "gpu cpu"]
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: "0.6.1" if d == "flashinfer-python"
                        else "2.14.0" if d == "torch" else real(d))
    monkeypatch.setattr(torch.version, "cuda", "12.9")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    assert kernel_environment() == [
        "torch 2.14.0", f"triton {triton.__version__}", "flashinfer 0.6.1", "cuda 12.9",
        "gpu NVIDIA H200"]
    assert ("flashinfer" in sys.modules) == flashinfer_was_imported


def test_sampler_settings_are_those_vllms_config_hash_leaves_out():
    """Read off vLLM's sources: every model setting listed is in
    ModelConfig's hash's ignored_factors, and every speculative one is a
    SpeculativeConfig field its hash does not read (0.32, but dspark's
    adaptive verification) or lists in its ignored_factors (0.34)."""
    import inspect

    from vllm.config import ModelConfig, SpeculativeConfig

    from stepwarm.vllm_facts import SAMPLER_SETTINGS

    # 0.34 renamed compute_hash compile_factors (the same ignored_factors)
    def hash_source(cls):
        return inspect.getsource(getattr(cls, "compute_hash", None) or cls.compile_factors)

    model_hash = hash_source(ModelConfig)
    spec_hash = hash_source(SpeculativeConfig)
    for section, name in SAMPLER_SETTINGS:
        if section == "model_config":
            assert name in ModelConfig.__dataclass_fields__ and f'"{name}",' in model_hash, name
        else:
            assert name in SpeculativeConfig.__dataclass_fields__, name
            if hasattr(SpeculativeConfig, "compute_hash"):  # to 0.33: fields it reads
                assert name not in spec_hash or name == "enable_adaptive_verification", name
            else:  # 0.34: compile_factors's ignored_factors
                assert f'"{name}",' in spec_hash, name


def _fake_worker(logprobs_mode: str = "raw_logprobs"):
    from types import SimpleNamespace

    return SimpleNamespace(vllm_config=SimpleNamespace(
        compute_hash=lambda: "cfg-hash", speculative_config=None,
        model_config=SimpleNamespace(logprobs_mode=logprobs_mode, use_fp64_gumbel=False)))


def test_the_idle_key_is_made_of_what_decides_kernels_not_the_block_count(monkeypatch):
    import json as js

    import stepwarm
    import vllm
    from stepwarm import hook, idle_record, vllm_facts
    from stepwarm.plan import PlanBuilder, PlannedRequest
    from tests.helpers import make_profile

    profile = make_profile(num_blocks=14305)
    b = PlanBuilder(profile, name="one")
    b.add_request(PlannedRequest("_stepwarm_a_", 8, sampling="greedy"))
    b.step("prefill", "a", prefill={"_stepwarm_a_": 8})
    b.cleanup()
    plan = b.build()
    parts = hook.idle_key_parts(WorkerView(_fake_worker()), profile, [plan])
    envs = vllm_facts.compile_hashes(_fake_worker().vllm_config)[1]
    assert parts == [
        stepwarm.__version__, vllm.__version__, "cfg-hash", envs, *idle_record.kernel_environment(),
        '{"model_config.logprobs_mode": "\'raw_logprobs\'", '
        '"model_config.use_fp64_gumbel": "False"}',
        profile.model_dump_json(exclude={"num_blocks"}), hook._plan_text(plan)]
    assert "num_blocks" not in js.loads(parts[-2])

    def key(worker=None, p=profile):
        return configuration_key(hook.idle_key_parts(WorkerView(worker or _fake_worker()), p, [plan]))

    # 14,305 then 14,307 blocks (the KV cache sized from free memory): the same key
    assert key(p=profile.model_copy(update={"num_blocks": 14307})) == key()
    # the sampler's logprobs kernels: another key
    assert key(_fake_worker("processed_logprobs")) != key()
    # a torch upgrade: another key
    before = key()
    monkeypatch.setattr(idle_record, "kernel_environment",
                        lambda: ["torch 2.14.0", "triton 3.9.0", "flashinfer none", "cuda none",
                                 "gpu cpu"])
    assert key() != before


def test_writing_a_record_keeps_the_newest_of_its_rank(tmp_path, caplog):
    """KEEP_RECORDS per rank: older records of this user's for that rank are
    removed; other ranks', other users', links and other names are left."""
    import os

    from stepwarm.idle_record import _SAVED, KEEP_RECORDS

    old = []
    for i in range(KEEP_RECORDS + 3):
        p = tmp_path / f"idle-{i:024x}-rank0.json"
        p.write_text("{}")
        os.utime(p, (1_000_000 + i, 1_000_000 + i))
        old.append(p)
    others = [tmp_path / f"idle-{0:024x}-rank1.json", tmp_path / "notes.json"]
    for p in others:
        p.write_text("{}")
        os.utime(p, (1, 1))
    os.symlink(old[0], tmp_path / f"idle-{'f' * 24}-rank0.json")
    if os.geteuid() == 0:
        theirs = tmp_path / f"idle-{'e' * 24}-rank0.json"
        theirs.write_text("{}")
        os.utime(theirs, (1, 1))
        os.chown(theirs, 4321, 4321)
        others.append(theirs)
    rec = IdleRecord.load(configuration_key(["newest"]), "rank0", tmp_path)
    rec.note("default", 1, [])
    with caplog.at_level("INFO", logger="vllm.stepwarm"):
        assert rec.save()
    _SAVED.discard(rec.path)
    left = sorted(p.name for p in tmp_path.iterdir())
    # the one written and the 15 newest before it; the 4 oldest removed
    kept = {rec.path.name, *(p.name for p in old[4:])}
    assert len(kept) == KEEP_RECORDS
    assert left == sorted(kept | {p.name for p in others} | {f"idle-{'f' * 24}-rank0.json"})
    assert caplog.messages == [f"stepwarm: 4 stale idle record(s) removed beside {rec.path} "
                               f"(the newest {KEEP_RECORDS} of a rank are kept)"]


def test_the_config_hash_is_vllms_own_on_every_release():
    """The key's config part is the hash vLLM's compile cache uses: to 0.33
    ``compute_hash()``, from 0.34 ``hash_config(config)`` (0.34 has no
    compute_hash); never "" for a real config, and it changes with a field
    the hash reads. Shown on ``CompilationConfig`` (built without a device;
    ``VllmConfig`` reads the same method of each of its parts)."""
    from vllm.config import CompilationConfig

    from stepwarm import vllm_facts

    def config_hash(config):
        return vllm_facts.compile_hashes(config)[0]

    config = CompilationConfig()
    if hasattr(CompilationConfig, "compute_hash"):
        expected = config.compute_hash()
    else:
        from vllm.config.utils import hash_config

        expected = hash_config(config)
    assert config_hash(config) == expected != ""
    assert config_hash(CompilationConfig(cudagraph_capture_sizes=[1, 2])) != expected
