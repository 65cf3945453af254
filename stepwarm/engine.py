"""Bring up an in-process vLLM engine and reach its worker.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``distributed_executor_backend="uni"``) so that stepwarm can call the worker's
``execute_model`` / ``sample_tokens`` directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwarm.zoo import write_model

#: Engine arguments stepwarm passes unless the caller overrides them.
DEFAULT_ENGINE_ARGS: dict[str, Any] = {
    "load_format": "dummy",
    "skip_tokenizer_init": True,
    "max_model_len": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 512,
    "gpu_memory_utilization": 0.3,
    "enforce_eager": True,
    "distributed_executor_backend": "uni",
}


@dataclass
class Engine:
    """An in-process ``vllm.LLM`` and the worker that runs its steps."""

    llm: Any
    worker: Any

    def shutdown(self) -> None:
        """Shut the engine down (frees the KV cache and worker state)."""
        engine_core = self.llm.llm_engine.engine_core
        shutdown = getattr(engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()


def start_engine(model: str | Path | None = None, **engine_args: Any) -> Engine:
    """Start ``vllm.LLM`` in this process and return it with its worker.

    Args:
        model: a local model directory (``config.json``, weights optional);
            ``None`` writes and uses the embedded tiny Llama.
        **engine_args: ``vllm.LLM`` keyword arguments overriding
            :data:`DEFAULT_ENGINE_ARGS`.

    Returns:
        An :class:`Engine`; ``engine.worker`` is the driver worker
        (``llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker``).

    Raises:
        FileNotFoundError: ``model`` is not a directory with a ``config.json``.
        Whatever ``vllm.LLM`` raises for a config it rejects.
    """
    if model is None:
        model = write_model()
    model = Path(model)
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"{model}: not a model directory (no config.json)")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    args = {**DEFAULT_ENGINE_ARGS, **engine_args}
    if args.get("max_num_batched_tokens", 0) < args.get("max_model_len", 0):
        args.setdefault("enable_chunked_prefill", True)
    llm = LLM(model=str(model), **args)
    core = llm.llm_engine.engine_core.engine_core
    worker = core.model_executor.driver_worker.worker
    return Engine(llm=llm, worker=worker)
