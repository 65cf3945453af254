"""One real in-process vLLM engine (CPU, embedded tiny Llama) per test session."""

from __future__ import annotations

import pytest

from stepwarm.engine import Engine, start_engine
from stepwarm.profile import RunnerProfile, read_profile


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The engine; tests must leave its runner with no stepwarm request."""
    eng = start_engine()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def profile(engine: Engine) -> RunnerProfile:
    """The engine worker's runner profile."""
    return read_profile(engine.worker)
