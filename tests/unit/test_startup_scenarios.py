"""The scenarios of one start-up (``STEPWARM_SCENARIOS``, ``-s``): a file
named under two spellings is planned once, and the steps of all of them
are bounded (issue 42 item 21). No engine."""

from __future__ import annotations

import os

import pytest

from stepwarm import hook
from stepwarm.ranks import RankGroup
from stepwarm.scenario import (
    MAX_STARTUP_STEPS,
    MAX_STEPS,
    ScenarioError,
    builtin_dir,
    check,
    resolve_names,
    same_files,
    tiny_profile,
)

ONE = """description = "one prefill"
[requests.a]
prompt = 4
[[steps]]
kind = "prefill"
requests = ["a"]
"""


def test_one_file_under_five_spellings_is_planned_once(tmp_path, monkeypatch, caplog):
    (tmp_path / "sub").mkdir()
    f = tmp_path / "one.toml"
    f.write_text(ONE)
    os.symlink(f, tmp_path / "link.toml")
    monkeypatch.chdir(tmp_path)
    builtin = os.path.realpath(str(builtin_dir() / "default.toml"))
    names = ["one.toml", str(f), "./one.toml", "link.toml", "sub/../one.toml",
             "default", builtin, "prefix-hit"]
    assert resolve_names(names) == ["one.toml", "default", "prefix-hit"]
    assert same_files(names) == [
        ("/".join([str(tmp_path), "one.toml"]), "one.toml", str(f)),
        ("./one.toml", "one.toml", str(f)), ("link.toml", "one.toml", str(f)),
        ("sub/../one.toml", "one.toml", str(f)), (builtin, "default", builtin)]
    # the plugin's planning: one plan each, one line per name left out
    with caplog.at_level("INFO", logger="vllm.stepwarm"):
        plans = hook._plans(names, tiny_profile(), RankGroup())
    assert [p.name for p in plans] == ["one", "default", "prefix-hit"]
    assert caplog.messages == [
        f"stepwarm: scenario {f} is one.toml's file ({f}): planned once",
        f"stepwarm: scenario ./one.toml is one.toml's file ({f}): planned once",
        f"stepwarm: scenario link.toml is one.toml's file ({f}): planned once",
        f"stepwarm: scenario sub/../one.toml is one.toml's file ({f}): planned once",
        f"stepwarm: scenario {builtin} is default's file ({builtin}): planned once"]
    # two files of one content are two scenarios
    (tmp_path / "two.toml").write_text(ONE)
    assert resolve_names(["one.toml", "two.toml"]) == ["one.toml", "two.toml"]


def test_the_steps_of_a_start_up_are_bounded_before_anything_runs(tmp_path, monkeypatch):
    """Past the bound, the scenario that crosses it is named with the bound,
    and the scenarios after it are neither expanded nor held (a bad file
    after it is not reported)."""
    import importlib

    expand = importlib.import_module("stepwarm.scenario.expand")
    assert MAX_STARTUP_STEPS == 2 * MAX_STEPS == 8192
    monkeypatch.setattr(expand, "MAX_STARTUP_STEPS", 25)
    bad = tmp_path / "bad.toml"
    bad.write_text("not toml [")
    names = ["default", "prefix-hit", "triton-buckets", str(bad)]
    results = check(names, tiny_profile())
    assert [(n, type(r).__name__) for n, r in results] == [
        ("default", "Plan"), ("prefix-hit", "Plan"), ("triton-buckets", "ScenarioError")]
    err = results[-1][1]
    assert isinstance(err, ScenarioError) and (err.file, err.field) == ("triton-buckets", "steps")
    default_steps, hit_steps = (len(r.steps) for _, r in results[:2])
    assert default_steps + hit_steps <= 25
    total = default_steps + hit_steps + 14
    assert str(err) == (
        f"triton-buckets: the scenarios named plan {total} steps with this one (14 steps), "
        "more than the 25 one start-up may plan (MAX_STARTUP_STEPS); allowed: fewer or smaller "
        "scenarios; nothing ran, and the scenarios named after it were not checked")
    # the plugin: refused before any step, on every rank (raise) or logged (warn)
    with pytest.raises(hook.WarmupError) as e:
        hook._plans(names, tiny_profile(), RankGroup())
    assert str(e.value) == str(err)


def test_check_names_the_scenario_past_the_bound_on_stderr_and_exits_2(tmp_path, monkeypatch):
    import importlib

    from typer.testing import CliRunner

    from stepwarm.cli import app

    monkeypatch.setattr(importlib.import_module("stepwarm.scenario.expand"),
                        "MAX_STARTUP_STEPS", 25)
    f = tmp_path / "one.toml"
    f.write_text(ONE)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["check", "one.toml", "./one.toml", str(f), "default",
                                 "prefix-hit", "triton-buckets"], env={"COLUMNS": "400"})
    assert r.exit_code == 2
    assert r.stdout.count("ok one") == 1 and "ok one.toml: 2 steps" in r.stdout
    assert "ok default: 8 steps" in r.stdout and "ok prefix-hit: 10 steps" in r.stdout
    assert "error: triton-buckets: the scenarios named plan " in r.stderr
    assert "more than the 25 one start-up may plan (MAX_STARTUP_STEPS)" in r.stderr
    assert "Traceback" not in r.output
