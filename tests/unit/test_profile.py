"""RunnerProfile files: JSON and TOML round trips and clear errors."""

from __future__ import annotations

import json

import pytest

from stepwarm.profile import CacheSpec, ProfileError, RunnerProfile, tiny_profile
from tests.helpers import make_profile

PROFILE = make_profile(
    runner="v2", kv_cache_groups=(
        CacheSpec(kind="full_attention", block_size=16),
        CacheSpec(kind="mamba", block_size=64, mamba_cache_mode="align", num_speculative_blocks=2),
    ),
    num_blocks=1234, max_model_len=4096, max_num_seqs=64, max_num_batched_tokens=8192,
    num_lookahead_tokens=2, num_speculative_steps=2, decode_query_len=3, vocab_size=32000,
)


@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_save_and_load_round_trip(tmp_path, suffix):
    path = tmp_path / f"p{suffix}"
    PROFILE.save(path)
    assert path.read_text().lstrip().startswith("{" if suffix == ".json" else "runner = ")
    assert RunnerProfile.load(path) == PROFILE
    # vLLM 0.26's one decode step per warmup pass, as read off that release.
    one = PROFILE.model_copy(update={"warmup_decodes": {"spec4": ("all:S",), "plain1": ("all:N",)}})
    one.save(path)
    assert RunnerProfile.load(path).warmup_decodes == {"spec4": ("all:S",), "plain1": ("all:N",)}
    assert RunnerProfile.load(path).warmup_decode_steps(8) == ("all:S",)


def test_corrupt_json_names_file_and_line(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{\n  "runner": "v1",\n  oops\n}')
    with pytest.raises(ProfileError, match=rf"^{path}:3: not JSON: Expecting property name"):
        RunnerProfile.load(path)


def test_wrong_field_names_it(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(PROFILE.to_toml().replace("max_num_seqs = 64", "max_num_seqs = 0"))
    with pytest.raises(ProfileError, match=rf"^{path}: field 'max_num_seqs': Input should be greater than 0"):
        RunnerProfile.load(path)


def test_a_profile_without_kv_cache_groups_is_a_field_error_not_a_traceback(tmp_path):
    """A new user's `stepwarm profile` output with "kv_cache_groups": [] made
    `check` raise IndexError in the block ledger; now exit 2, the field named."""
    import json

    from typer.testing import CliRunner

    from stepwarm.cli import app

    path = tmp_path / "p.json"
    data = json.loads(PROFILE.model_dump_json())
    data["kv_cache_groups"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=rf"^{path}: field 'kv_cache_groups': Tuple should "
                       "have at least 1 item after validation, not 0"):
        RunnerProfile.load(path)
    for command in (["check", "default"], ["show", "default", "--tables"]):
        r = CliRunner().invoke(app, [*command, "--profile", str(path)], env={"COLUMNS": "200"})
        assert r.exit_code == 2 and r.stdout == "", r.output
        assert " ".join(r.stderr.split()).startswith(
            f"error: {path}: field 'kv_cache_groups': Tuple should have at least 1 item")
    # a group refused: its field said, not also "at least 1 item" (the second fresh trial)
    data["kv_cache_groups"] = [dict(json.loads(PROFILE.model_dump_json())["kv_cache_groups"][0],
                                    block_size=0)]
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as e:
        RunnerProfile.load(path)
    assert str(e.value) == (f"{path}: field 'kv_cache_groups.0.block_size': Input should be "
                            "greater than 0; allowed: a runner profile as `stepwarm profile -o "
                            "FILE` writes it")


def test_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile: No such file or directory"):
        RunnerProfile.load(tmp_path / "nope.json")


def test_decode_query_len_is_derived_when_left_out(tmp_path):
    from stepwarm.profile import tiny_profile

    text = tiny_profile().to_toml().replace("decode_query_len = 1\n", "").replace(
        "num_speculative_steps = 0", "num_speculative_steps = 3")
    (tmp_path / "p.toml").write_text(text)
    assert "decode_query_len" not in text
    p = RunnerProfile.load(tmp_path / "p.toml")
    assert (p.num_speculative_steps, p.decode_query_len) == (3, 4)
    # Given explicitly, it is kept (the V2 runner may say otherwise).
    (tmp_path / "q.toml").write_text("decode_query_len = 2\n" + text)
    assert RunnerProfile.load(tmp_path / "q.toml").decode_query_len == 2


def test_every_toml_in_the_scenario_folder_is_a_scenario():
    from pathlib import Path

    from stepwarm.profile import tiny_profile
    from stepwarm.scenario import ScenarioError, check

    files = sorted(str(p) for p in (Path(__file__).parents[2] / "scenarios").glob("*.toml"))
    assert len(files) == 16
    results = check(files, tiny_profile())
    assert not [r for _, r in results if isinstance(r, ScenarioError)]


def test_a_profile_that_is_not_utf8_is_a_profile_error(tmp_path):
    p = tmp_path / "p.json"
    p.write_bytes(b'{"runner": "v1", "model": "caf\xe9"}')
    with pytest.raises(ProfileError, match=r"p.json: cannot read profile: not UTF-8 \(byte 0xe9 at offset 30\)"):
        RunnerProfile.load(p)


def test_an_endless_profile_file_is_read_no_further_than_its_cap():
    # a device reports size 0 to stat(); /dev/zero never ends
    with pytest.raises(ProfileError, match=r"^/dev/zero: cannot read profile: more than 1048576 "
                                           r"bytes \(a saved profile is a few kB\)$"):
        RunnerProfile.load("/dev/zero")


def test_a_bench_or_coverage_report_given_as_profile_is_named_so(tmp_path):
    """A first-contact trial: a bench report given to --profile got pydantic's
    field list (`field 'mode': unknown key (did you mean 'model'?)`...)."""
    allowed = "allowed: a runner profile as `stepwarm profile -o FILE` writes it"
    bench = tmp_path / "bench.json"
    bench.write_text('{"configurations": {"A": {"steps": []}}, "ratios": []}')
    cov = tmp_path / "cov.json"
    cov.write_text('{"mode": "stepwarm", "requests": [], "startup_compiles": [], "notes": []}')
    compared = tmp_path / "compared.json"
    compared.write_text('{"baseline": {"requests": []}, "stepwarm": {"requests": []}}')
    for path, what in ((bench, "bench"), (cov, "coverage"), (compared, "coverage")):
        with pytest.raises(ProfileError) as e:
            RunnerProfile.load(path)
        assert str(e.value) == (f"{path}: a `stepwarm {what} --json` report, not a runner "
                                "profile (it holds no profile: save one with `stepwarm profile "
                                f"-o FILE`); {allowed}")


def test_a_scenario_file_given_as_profile_is_named_so(tmp_path):
    """``check FILE --profile SCENARIO.toml`` (the arguments swapped) says so, and
    every profile error says what is allowed."""
    path = tmp_path / "mine.toml"
    path.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    with pytest.raises(ProfileError) as e:
        RunnerProfile.load(path)
    assert str(e.value) == (f"{path}: a scenario file, not a runner profile (check it with "
                            f"`stepwarm check {path}`); allowed: a runner profile as "
                            "`stepwarm profile -o FILE` writes it")
    other = tmp_path / "p.json"
    other.write_text('{"max_num_seqs": 4}')
    with pytest.raises(ProfileError) as e:
        RunnerProfile.load(other)
    lines = str(e.value).splitlines()
    assert lines[0] == f"{other}: field 'runner': Field required"
    # one error a field (the CLI's error: prefix), what is allowed said after the last
    assert len(lines) > 3 and all(ln.startswith(f"error: {other}: field '") for ln in lines[1:])
    assert lines[-1].endswith("; allowed: a runner profile as `stepwarm profile -o FILE` "
                              "writes it")
    # every field at once, a misspelt key first with what it was meant to be (whose
    # "missing" goes unsaid)
    good = tiny_profile().model_dump(mode="json")
    good["max_num_sqs"] = good.pop("max_num_seqs")
    good["max_model_len"] = "x"
    other.write_text(json.dumps(good))
    with pytest.raises(ProfileError) as e:
        RunnerProfile.load(other)
    assert str(e.value).splitlines() == [
        f"{other}: field 'max_num_sqs': unknown key (did you mean 'max_num_seqs'?)",
        f"error: {other}: field 'max_model_len': Input should be a valid integer, unable to "
        "parse string as an integer; allowed: a runner profile as `stepwarm profile -o FILE` "
        "writes it"]


def test_a_run_report_given_as_profile_gives_its_runner_profile(tmp_path):
    """A fresh user gave `run --json`'s report to --profile and got three
    'Field required' errors; the report holds the profile, which is read."""
    prof = tiny_profile()
    report = tmp_path / "run.json"
    report.write_text(json.dumps({"profile": prof.model_dump(mode="json"), "startup_s": 3.2,
                                  "scenarios": []}))
    assert RunnerProfile.load(report) == prof
    report.write_text(json.dumps({"profile": None, "startup_s": None, "scenarios": []}))
    with pytest.raises(ProfileError, match=r"run.json: a `stepwarm run --json` report whose "
                       r"engine did not start \(its profile is null\); allowed: a runner "
                       "profile as"):
        RunnerProfile.load(report)


@pytest.mark.parametrize("kind, need", [("sliding_window", "sliding_window"),
                                        ("chunked_local_attention", "attention_chunk_size")])
def test_a_windowed_group_without_its_window_is_refused_when_loaded(tmp_path, kind, need):
    """A new user's profile written by hand: accepted, then planning raised
    TypeError ('int' - 'NoneType') in the block rules."""
    data = tiny_profile().model_dump(mode="json")
    data["kv_cache_groups"].append({"kind": kind, "block_size": 128})
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as e:
        RunnerProfile.load(path)
    assert str(e.value) == (f"{path}: field 'kv_cache_groups.1': a {kind} group needs {need} "
                            "(tokens, > 0); allowed: a runner profile as `stepwarm profile -o "
                            "FILE` writes it")
    with pytest.raises(ValueError, match=f"needs {need}"):
        CacheSpec(kind=kind, block_size=16)
