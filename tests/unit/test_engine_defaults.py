"""The engine arguments `stepwarm run` passes beyond vLLM's defaults, and that
`run --help` lists them."""

from __future__ import annotations

from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.engine import default_engine_args


def test_tiny_model_on_cpu():
    assert default_engine_args(None, cpu=True) == {
        "load_format": "dummy", "distributed_executor_backend": "uni",
        "enforce_eager": True, "gpu_memory_utilization": 0.3,
        "max_model_len": 512, "max_num_seqs": 8, "max_num_batched_tokens": 512}


def test_a_model_dir_on_gpu_gets_vllms_defaults(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    # No enforce_eager: CUDA graphs and vLLM's JIT warmup stay as `vllm serve` has them.
    assert default_engine_args(tmp_path, cpu=False) == {
        "load_format": "dummy", "distributed_executor_backend": "uni"}


def test_a_model_dir_without_tokenizer_skips_tokenizer_init(tmp_path):
    args = default_engine_args(tmp_path, cpu=True)
    assert args["skip_tokenizer_init"] is True and "max_num_seqs" not in args


def test_run_help_lists_every_default():
    r = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    text = " ".join(r.stdout.split())
    for arg in ("load_format=dummy", "distributed_executor_backend=uni", "enforce_eager=true",
                "gpu_memory_utilization=0.3", "max_model_len=512", "max_num_seqs=8",
                "max_num_batched_tokens=512", "skip_tokenizer_init=true"):
        assert arg in text, arg


def test_the_amx_state_is_granted_exactly_where_the_cpu_has_amx():
    import torch

    from stepwarm.engine import ask_amx_state

    assert ask_amx_state() is torch.cpu._is_amx_tile_supported()
    assert ask_amx_state() is torch.cpu._is_amx_tile_supported()  # asking again is no error
