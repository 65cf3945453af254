"""The process's random state, kept across stepwarm's scenarios.

vLLM ends ``compile_or_warm_up_model`` with ``set_random_seed(model_config.seed,
data_parallel_index)`` (``vllm/v1/worker/cpu_worker.py``, ``gpu_worker.py``)
"so that the random state is not affected by the model initialization and
profiling". stepwarm's scenarios run after that and draw from the same
generators (unseeded sampled requests, the V2 runner's per-request seeds from
``np.random``), so the state is captured before them and put back after: an
unseeded request sampled after start-up gets the tokens it gets without
stepwarm. The generators are per process, hence per rank.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any


def _capture() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    # Only when CUDA is up already: reading the state would initialize it.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _restore(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def random_state_kept() -> Iterator[None]:
    """Put back, on exit (also on error), the state of Python's ``random``,
    NumPy's global generator, torch's CPU generator and (when CUDA is
    initialized) every CUDA device's default generator as it was on entry."""
    state = _capture()
    try:
        yield
    finally:
        _restore(state)
