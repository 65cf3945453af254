"""One real in-process vLLM engine (CPU, embedded tiny Llama) per test session.

The engine has a real KV connector (vLLM's ``ExampleConnector``) so that tests
can check stepwarm switches it off for a run and back on afterwards.
"""

from __future__ import annotations

import pytest

from stepwarm.engine import Engine, start_engine
from stepwarm.probe import read_profile
from stepwarm.profile import RunnerProfile


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
    return read_profile(engine.worker)
