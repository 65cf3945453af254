"""STEPWARM_RECORD on vLLM's real ``Scheduler`` (built on CPU, no engine, as
benchmarks/plan_speed.py does): the lines each step writes, drafts sent and
accepted, the size cap and a failed write (one log line each; scheduling goes
on), and the settings."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from stepwarm import record
from stepwarm.settings import RecordSettings, SettingsError

pytest.importorskip("vllm")

BLOCK = 16
GREEDY = {"kind": "greedy", "penalties": False, "seeded": False, "logprobs": None,
          "prompt_logprobs": None, "structured": False}


def scheduler(*, spec: int = 0, caching: bool = True) -> Any:
    """vLLM's ``Scheduler`` over the tiny Llama's config: 8 seqs, 64 tokens a
    step, 100 blocks of 16 tokens, prefix caching on (or ``spec`` ngram drafts)."""
    import torch
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig,
                             SpeculativeConfig, VllmConfig)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from stepwarm.zoo import write_model

    mc = ModelConfig(model=str(write_model("tiny-llama")), skip_tokenizer_init=True,
                     max_model_len=512)
    sc = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=512,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK, enable_prefix_caching=caching)
    cc.num_gpu_blocks = 100
    sp = SpeculativeConfig(method="ngram", num_speculative_tokens=spec, prompt_lookup_max=2,
                           prompt_lookup_min=2) if spec else None
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"), speculative_config=sp)
    kvc = KVCacheConfig(num_blocks=100, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["l0"], FullAttentionSpec(block_size=BLOCK, num_kv_heads=1,
                                                   head_size=8, dtype=torch.float16))])
    return Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BLOCK)


def add(s: Any, rid: str, prompt: int, **sampling: Any) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.request import Request

    if getattr(ku, "NONE_HASH", None) is None:
        ku.init_none_hash(sha256)
    s.add_request(Request(rid, list(range(3, 3 + prompt)),
                          SamplingParams(max_tokens=3, ignore_eos=True, **sampling), None,
                          block_hasher=ku.get_request_block_hasher(BLOCK, sha256)))


def step(s: Any, sampled: dict[str, list[int]] | None = None) -> Any:
    """One ``schedule()`` and its ``update_from_output`` (token 7 sampled,
    unless ``sampled`` gives a request's tokens)."""
    from stepwarm.vllm_facts import model_runner_output

    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    s.update_from_output(out, model_runner_output(
        ids, [(sampled or {}).get(r, [7]) for r in ids]))
    return out


@pytest.fixture
def wrapped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The scheduler class wrapped for this test only; STEPWARM_RECORD set."""
    from vllm.v1.core.sched.scheduler import Scheduler

    monkeypatch.setattr(Scheduler, "schedule", Scheduler.__dict__["schedule"])
    monkeypatch.setattr(Scheduler, "update_from_output",
                        Scheduler.__dict__["update_from_output"])
    path = tmp_path / "rec.jsonl"
    monkeypatch.setenv("STEPWARM_RECORD", str(path))
    assert record.install() is True
    assert getattr(Scheduler.schedule, "_stepwarm_record", False)
    return path


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_session_s_lines(wrapped: Path) -> None:
    import vllm
    from packaging.version import Version

    import stepwarm
    from stepwarm.zoo import write_model

    s = scheduler()
    add(s, "a", 40, temperature=0.0)
    add(s, "b", 40, top_k=5, logprobs=3, seed=1)
    for _ in range(3):
        step(s)
    head, *steps = lines(wrapped)
    config = json.loads((write_model("tiny-llama") / "config.json").read_text())
    assert head == {
        "stepwarm_record": 1, "stepwarm": stepwarm.__version__, "vllm": vllm.__version__,
        "model": record.model_identity(config), "block_size": 16, "max_num_seqs": 8,
        "max_num_batched_tokens": 64, "num_spec_tokens": 0,
        # on CPU the V1 runner; 0.34 has no V1 GPU runner: its config says v2
        "runner": "v1" if Version(vllm.__version__) < Version("0.34") else "v2",
        "cudagraph_sizes": [], "max_logprobs": 20, "moe": None}
    assert head["model"]["architecture"] == "LlamaForCausalLM"
    # b's first two blocks hit a's, cached in the same step: 40 + 8 tokens.
    assert steps == [
        {"step": 0, "batch": 2, "tokens": 48, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 40, "computed": 0, "prompt": 40, "new": True,
             "hit_blocks": 0, "sampler": GREEDY},
            {"r": 1, "scheduled": 8, "computed": 32, "prompt": 40, "new": True,
             "hit_blocks": 2, "sampler": {**GREEDY, "kind": "top_k", "seeded": True,
                                          "logprobs": 3}}]},
        {"step": 1, "batch": 2, "tokens": 2, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 1, "computed": 40, "prompt": 40},
            {"r": 1, "scheduled": 1, "computed": 40, "prompt": 40}]},
        {"step": 2, "batch": 2, "tokens": 2, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 1, "computed": 41, "prompt": 40},
            {"r": 1, "scheduled": 1, "computed": 41, "prompt": 40}]}]
    # Nothing of the prompt or the request ids is written.
    assert '"a"' not in wrapped.read_text() and "[3,4," not in wrapped.read_text()


def test_a_finish_sent_in_an_empty_step_is_counted_in_the_next_line(wrapped: Path) -> None:
    """vLLM sends a request's finish with the step after its last; where
    nothing else runs that step schedules no token and is not recorded: its
    finish goes with the next recorded step (the trial: one request at a time
    recorded 5 finishes of 16)."""
    s = scheduler(caching=False)
    add(s, "a", 5, temperature=0.0)
    for _ in range(3):  # prefill + 2 decodes: max_tokens 3, finished
        step(s)
    empty = step(s)
    assert (empty.total_num_scheduled_tokens, set(empty.finished_req_ids)) == (0, {"a"})
    add(s, "b", 6, temperature=0.0)
    step(s)
    step(s)
    assert [(x["step"], x["batch"], x["finished"]) for x in lines(wrapped)[1:]] == [
        (0, 1, 0), (1, 1, 0), (2, 1, 0), (3, 1, 1), (4, 1, 0)]


def test_sampler_classes() -> None:
    from vllm.sampling_params import SamplingParams

    def kind(**kw: Any) -> dict:
        return record.sampler_class(SamplingParams(**kw))

    assert kind(temperature=0.0, top_k=5)["kind"] == "greedy"
    assert kind(top_k=5, top_p=0.5)["kind"] == "top_k_top_p"
    assert kind(top_p=0.5)["kind"] == "top_p"
    assert kind()["kind"] == "random"
    assert kind(repetition_penalty=1.2)["penalties"] is True
    assert kind(prompt_logprobs=4)["prompt_logprobs"] == 4
    assert record.sampler_class(None)["kind"] == "pool"


def test_drafts_sent_and_accepted(wrapped: Path) -> None:
    from vllm.v1.outputs import DraftTokenIds

    s = scheduler(spec=2, caching=False)
    add(s, "a", 5, temperature=0.0)
    add(s, "b", 6, temperature=0.0)
    step(s)
    s.update_draft_token_ids(DraftTokenIds(["a", "b"], [[9, 9], [9, 9]]))
    step(s, {"a": [9, 5], "b": [4]})  # a: one draft accepted, b: none
    *_, last = lines(wrapped)
    assert last == {"step": 1, "batch": 2, "tokens": 6, "finished": 0, "preempted": 0, "reqs": [
        {"r": 0, "scheduled": 3, "computed": 5, "prompt": 5, "drafts": 2, "accepted": 1},
        {"r": 1, "scheduled": 3, "computed": 6, "prompt": 6, "drafts": 2, "accepted": 0}]}
    assert lines(wrapped)[0]["num_spec_tokens"] == 2


def test_drafts_past_a_stop_are_not_recorded_as_accepted(wrapped: Path) -> None:
    """a (max_tokens 3, one token out) samples 3 tokens in step 1, both drafts
    accepted: the output keeps 2, so the line says 1 accepted (the plan then
    caches no block the dropped draft would fill); b samples 2, accepts 1 and
    keeps both."""
    from vllm.v1.outputs import DraftTokenIds

    s = scheduler(spec=2, caching=False)
    add(s, "a", 5, temperature=0.0)
    add(s, "b", 6, temperature=0.0)
    step(s)
    s.update_draft_token_ids(DraftTokenIds(["a", "b"], [[9, 9], [9, 9]]))
    step(s, {"a": [9, 9, 5], "b": [9, 4]})
    *_, last = lines(wrapped)
    assert [(r["r"], r["drafts"], r["accepted"]) for r in last["reqs"]] == [(0, 2, 1), (1, 2, 1)]
    assert not s.requests  # both stopped at max_tokens


def test_the_cap_stops_with_one_line(wrapped: Path, monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    s = scheduler()
    add(s, "a", 20, temperature=0.0)
    step(s)
    from stepwarm.record import CAP_MARK_BYTES

    whole = wrapped.stat().st_size  # the header and step 0
    cap = whole + CAP_MARK_BYTES + 10  # step 1's line does not fit, the cap's line does
    s._stepwarm_recorder.max_bytes = cap
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        outs = [step(s) for _ in range(2)]
    assert [o.total_num_scheduled_tokens for o in outs] == [1, 1]  # scheduling went on
    said = [r.getMessage() for r in caplog.records if "STEPWARM_RECORD" in r.getMessage()]
    assert said == [f"stepwarm: STEPWARM_RECORD {wrapped}: reached its cap of {cap} "
                    "bytes (STEPWARM_RECORD_MAX_MB) at step 1; recording stopped, serving "
                    "goes on"]
    # the last line says where it stopped (from-record says so), within the cap
    assert wrapped.stat().st_size == whole + len('{"capped":1}\n') <= cap
    assert [x.get("step", x) for x in lines(wrapped)[1:]] == [0, {"capped": 1}]


def test_a_failed_write_never_fails_serving(monkeypatch: pytest.MonkeyPatch, wrapped: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    # a full disk: the path opens, its writes fail (a directory, refused at
    # start-up, is a settings error now: test_bad_settings)
    wrapped.symlink_to("/dev/full")
    s = scheduler()
    add(s, "a", 20, temperature=0.0)
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        outs = [step(s) for _ in range(3)]
    assert [o.total_num_scheduled_tokens for o in outs] == [20, 1, 1]
    said = [r.getMessage() for r in caplog.records if "STEPWARM_RECORD" in r.getMessage()]
    assert said == [f"stepwarm: STEPWARM_RECORD {wrapped}: cannot write (OSError: "
                    "[Errno 28] No space left on device); recording stopped, serving "
                    "goes on"]


def test_off_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STEPWARM_RECORD", raising=False)
    assert record.install() is False
    s = scheduler()
    add(s, "a", 4)
    step(s)
    assert record.recorder_of(s) is None


@pytest.mark.parametrize(("env", "error"), [
    ({"STEPWARM_RECORD": " "}, "STEPWARM_RECORD=' ': blank; allowed: a file path"),
    ({"STEPWARM_RECORD": "r.jsonl", "STEPWARM_RECORD_MAX_MB": "0"},
     "STEPWARM_RECORD_MAX_MB='0': allowed: a whole number of MiB from 1 to 1048576; unset: 256"),
    ({"STEPWARM_RECORD": "r.jsonl", "STEPWARM_RECORD_MAX_MB": "1.5"},
     "STEPWARM_RECORD_MAX_MB='1.5': allowed"),
    # a path the recording cannot be appended to fails start-up, not the
    # first step (issue 42, fifth trial)
    ({"STEPWARM_RECORD": "/proc/x.jsonl"},
     "STEPWARM_RECORD='/proc/x.jsonl': cannot be written: no file can be made in /proc "
     "(No such file or directory); allowed: a file path this process can append to"),
    ({"STEPWARM_RECORD": "/nonexistent-dir/r.jsonl", "STEPWARM_RECORD_MAX_MB": "0"},
     "STEPWARM_RECORD='/nonexistent-dir/r.jsonl': directory /nonexistent-dir does not exist; "
     "allowed: a file path this process can append to\nSTEPWARM_RECORD_MAX_MB='0': allowed"),
    ({"STEPWARM_RECORD": "/"}, "STEPWARM_RECORD='/': is a directory; allowed: a file path"),
    # blank, as every other STEPWARM_* variable (a docs review: it was taken as unset)
    ({"STEPWARM_RECORD": "r.jsonl", "STEPWARM_RECORD_MAX_MB": "  "},
     "STEPWARM_RECORD_MAX_MB='  ': blank; allowed: a whole number of MiB from 1 to 1048576; "
     "unset or empty: 256"),
])
def test_bad_settings(env: dict[str, str], error: str) -> None:
    with pytest.raises(SettingsError) as e:
        RecordSettings.from_env(env)
    assert str(e.value).startswith(error)


def test_settings() -> None:
    assert RecordSettings.from_env({}) == RecordSettings(None, 256 << 20)
    assert RecordSettings.from_env({"STEPWARM_RECORD": "r", "STEPWARM_RECORD_MAX_MB": "3"}) == \
        RecordSettings("r", 3 << 20)


def test_register_refuses_a_bad_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from stepwarm.hook import register
    from stepwarm.settings import SettingsExit

    monkeypatch.delenv("STEPWARM_SCENARIOS", raising=False)
    monkeypatch.setenv("STEPWARM_RECORD", "r.jsonl")
    monkeypatch.setenv("STEPWARM_RECORD_MAX_MB", "lots")
    with pytest.raises(SettingsExit) as e:
        register()
    assert e.value.code == ("stepwarm: STEPWARM_RECORD_MAX_MB='lots': allowed: a whole number "
                            "of MiB from 1 to 1048576; unset: 256")


def test_a_restart_on_a_file_at_its_cap_adds_no_cap_line(tmp_path: Path) -> None:
    """A reviewer's find: each restart on a recording already at its cap
    appended a header-less {"capped": 0} past the cap, which from-record then
    blamed on the earlier session. A cap line is written only after this
    session's own header, and only under the cap."""
    path = tmp_path / "rec.jsonl"
    head = {"stepwarm_record": 1, "vllm": "x"}
    earlier = json.dumps(head) + "\n" + json.dumps({"step": 0}) + "\n"
    path.write_text(earlier)
    for _ in range(3):
        rec = record.Recorder(str(path), len(earlier), head, 16)
        rec.write({"step": 0, "batch": 1})
    assert path.read_text() == earlier
    # room for the header and the cap line, not for a step: both written
    path.write_text("")
    header = len(json.dumps(head, separators=(",", ":"))) + 1
    rec = record.Recorder(str(path), header + record.CAP_MARK_BYTES, head, 16)
    rec.write({"step": 7, "batch": 1, "reqs": [{"r": 0, "scheduled": 99}]})
    assert [json.loads(x) for x in path.read_text().splitlines()] == [head, {"capped": 7}]


def test_opening_the_file_says_where_and_whether_it_appends(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The first step opens the file with one line: a new recording, a
    session appended to one of the same configuration, or a warning naming
    each header field that differs from the file's first session (the
    trial of 2026-12-07: a restart at another max_num_seqs said nothing)."""
    path = tmp_path / "rec.jsonl"
    head = {"stepwarm_record": 1, "stepwarm": "0.1.0", "vllm": "x", "max_num_seqs": 8}
    said = []
    for h in (head, {**head, "stepwarm": "0.2.0"}, {**head, "max_num_seqs": 4, "vllm": "y"}):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vllm.stepwarm"):
            before = path.stat().st_size if path.exists() else 0
            record.Recorder(str(path), 1 << 20, h, 16).write({"step": 0, "batch": 1})
        said.append([(r.levelname, r.getMessage()) for r in caplog.records])
        assert path.stat().st_size > before  # recorded all the same
    where = f"stepwarm: STEPWARM_RECORD: recording the scheduler's steps to {path}"
    first = len(json.dumps(head, separators=(",", ":"))) + len('{"step":0,"batch":1}') + 2
    assert said == [
        [("INFO", f"{where} (a new recording; cap 1 MiB, STEPWARM_RECORD_MAX_MB)")],
        [("INFO", f"{where} (a new session appended to its {first} bytes; cap 1 MiB, "
                  "STEPWARM_RECORD_MAX_MB)")],
        [("WARNING", f"{where}: this engine's header differs from the file's first session "
                     '(max_num_seqs 8, then 4; vllm "x", then "y"): scenario from-record '
                     "refuses this session; record into a new file for this configuration")]]
