"""``run --weights dummy|seeded[:N]``: parsing and refusals (no engine)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.zoo import parse_weights, resolve

runner = CliRunner()


def test_parse_weights():
    assert parse_weights("dummy") is None
    assert parse_weights("seeded") == 0
    assert parse_weights("seeded:7") == 7
    assert parse_weights(f"seeded:{2**64 - 1}") == 2**64 - 1
    for bad in ("seeded:", "seeded:-1", "seeded:x", "random", "dummy:1", f"seeded:{2**64}",
                "seeded:\u0663"):
        with pytest.raises(ValueError, match=f"--weights {bad}: allowed: dummy"):
            parse_weights(bad)


def test_resolve_a_zoo_model_with_seeded_weights(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWARM_CACHE", str(tmp_path))
    path, args = resolve("tiny-llama", weights_seed=3)
    assert path == tmp_path / "tiny-llama-seed3"
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert args == {"max_model_len": 512, "max_num_seqs": 8, "max_num_batched_tokens": 512,
                    "load_format": "auto"}
    assert resolve("tiny-llama")[1] == {"max_model_len": 512, "max_num_seqs": 8,
                                        "max_num_batched_tokens": 512}


def test_run_bad_weights_value_exit_2():
    r = runner.invoke(app, ["run", "-s", "default", "--weights", "random"],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 2
    assert r.stderr == ("error: --weights random: allowed: dummy (vLLM's load_format=dummy), "
                        "seeded, or seeded:N (zoo models get random weights under "
                        "torch.manual_seed(N), N an integer from 0 to 18446744073709551615; default 0)\n")


def test_run_seeded_weights_refused_for_a_directory(tmp_path):
    r = runner.invoke(app, ["run", "-s", "default", "--weights", "seeded", "--model",
                            str(tmp_path)], env={"COLUMNS": "400"})
    assert r.exit_code == 2
    assert r.stderr == (f"error: --weights seeded: only for zoo models (stepwarm list --models), "
                        f"not --model {tmp_path}; a model directory's own weights load with "
                        "-e load_format=auto\n")
