"""``--model ORG/NAME[@REVISION]``: a local Hugging Face cache, offline (no engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from stepwarm.model_dir import HubModel, ModelDirError, parse_hub_id, resolve_hub_model
from stepwarm.zoo import write_model
from tests.helpers import unwrapped
from tests.hub_cache import COMMIT, hub_env, write_hub_cache

REPO = "stepwarm-test/tiny-llama"


@pytest.fixture
def hf_home(tmp_path, monkeypatch) -> Path:
    """A Hugging Face home whose cache holds REPO (refs main and v1), offline."""
    home = tmp_path / "hf"
    write_hub_cache(home, REPO, write_model("tiny-llama", tmp_path / "src"), refs=("main", "v1"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


def _stepwarm(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepwarm", *args], capture_output=True,
                          text=True, timeout=300, env={**hub_env(home), "COLUMNS": "400"})


def test_parse_hub_id():
    assert parse_hub_id("Qwen/Qwen3-30B-A3B") == ("Qwen/Qwen3-30B-A3B", None)
    assert parse_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    assert parse_hub_id(f"org/name@{COMMIT}") == ("org/name", COMMIT)
    assert parse_hub_id("./name") is None and parse_hub_id("a/b/c") is None
    assert parse_hub_id("tiny-llama") is None


def test_resolve_from_the_cache_by_ref_and_commit(hf_home):
    snapshot = hf_home / "hub" / "models--stepwarm-test--tiny-llama" / "snapshots" / COMMIT
    assert resolve_hub_model(REPO) == HubModel(REPO, None, snapshot)
    v1 = resolve_hub_model(f"{REPO}@v1")
    assert v1 == HubModel(REPO, "v1", snapshot) and v1.engine_args == {"revision": "v1"}
    assert resolve_hub_model(f"{REPO}@{COMMIT}").snapshot == snapshot
    assert (snapshot / "config.json").is_symlink()  # laid out as the hub client does


def test_missing_id_offline_is_one_paragraph(hf_home):
    with pytest.raises(ModelDirError) as e:
        resolve_hub_model(f"{REPO}@v2")
    assert str(e.value) == (
        f"--model {REPO}@v2: no such directory, and {REPO} at revision 'v2' is not in the "
        f"Hugging Face cache {hf_home / 'hub'} (HF_HOME / HF_HUB_CACHE); HF_HUB_OFFLINE is "
        f"set, so the Hub is not asked; fetch its config and tokenizer first (hf download "
        f"{REPO} --revision v2 config.json tokenizer.json tokenizer_config.json), or unset "
        "HF_HUB_OFFLINE, or give a local model directory")


@pytest.mark.parametrize("command", [["check", "default"], ["show", "default"],
                                     ["run", "-s", "default"]])
def test_cli_missing_id_exit_2_before_any_engine(tmp_path, command):
    home = tmp_path / "hf"
    proc = _stepwarm(home, *command, "--model", "nobody/no-such-model")
    assert proc.returncode == 2, proc.stderr
    assert max(map(len, proc.stderr.splitlines())) <= 400  # wrapped at COLUMNS
    assert unwrapped(proc.stderr) == (
        "error: --model nobody/no-such-model: no such directory, and nobody/no-such-model is "
        f"not in the Hugging Face cache {home / 'hub'} (HF_HOME / HF_HUB_CACHE); "
        "HF_HUB_OFFLINE is set, so the Hub is not asked; fetch its config and tokenizer first "
        "(hf download nobody/no-such-model config.json tokenizer.json tokenizer_config.json), "
        "or unset HF_HUB_OFFLINE, or give a local model directory\n")
    assert "starting vLLM engine" not in proc.stdout


def test_cli_cached_config_gets_the_directory_checks(tmp_path):
    home, src = tmp_path / "hf", tmp_path / "bad"
    src.mkdir()
    (src / "config.json").write_text('{"architectures": ["LlamaForCausalLM"],\n  "x": }\n')
    snapshot = write_hub_cache(home, "org/broken", src)
    proc = _stepwarm(home, "check", "default", "--model", "org/broken")
    assert proc.returncode == 2
    assert proc.stderr == f"error: {snapshot / 'config.json'}:2:8: invalid JSON: Expecting value\n"


def test_a_config_without_architectures_or_model_type_is_refused_before_vllm(tmp_path):
    from stepwarm.model_dir import check_model_dir

    d = tmp_path / "mymodel"
    d.mkdir()
    (d / "config.json").write_text('{"hidden_size": 256}')
    with pytest.raises(ModelDirError) as e:
        check_model_dir(d)
    assert str(e.value) == (
        f"{d}/config.json: has neither 'architectures' nor 'model_type', and transformers "
        f"cannot tell the model from the directory's name (Unrecognized model in {d}. Should "
        "have a `model_type` key in its config.json.); allowed: a config.json with "
        "'model_type' (and 'architectures')")


def test_a_rejection_keeps_the_cause_after_a_line_ending_in_a_colon(tmp_path):
    """transformers' strict config check says the field on one line and the
    cause on the next: both are kept (a new user's `hidden_size: "big"`)."""
    import json

    from transformers import AutoConfig

    from stepwarm.model_dir import vllm_rejection

    config = json.loads((write_model("tiny-llama", tokenizer=False) / "config.json").read_text())
    config["hidden_size"] = "big"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(Exception) as caught:
        AutoConfig.from_pretrained(tmp_path)
    assert vllm_rejection(caught.value, tmp_path) == (
        f"StrictDataclassFieldValidationError (--model {tmp_path}): Validation error for field "
        "'hidden_size': TypeError: Field 'hidden_size' expected int, got str (value: 'big')")
    # a first line that ends otherwise stands alone
    assert vllm_rejection(ValueError("bad value\nTraceback follows:\n  x"), None) == (
        "ValueError: bad value")
