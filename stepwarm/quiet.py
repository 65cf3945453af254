"""``-q``: errors only, from every library, not from vLLM's log alone."""

from __future__ import annotations

import logging
import os
import warnings

#: Variables read by libraries as they load (torch's C++ log, transformers'
#: log, Python's warnings in worker processes, tqdm's bars): set under ``-q`` unless the
#: user set them.
QUIET_ENV = {"PYTHONWARNINGS": "ignore", "TORCH_CPP_LOG_LEVEL": "ERROR",
             "TRANSFORMERS_VERBOSITY": "error",
             # tqdm's progress bars (vLLM's "Loading safetensors checkpoint shards"):
             # tqdm >= 4.66 reads any of its arguments from TQDM_* variables
             "TQDM_DISABLE": "1"}


def errors_only() -> None:
    """Silence Python warnings (``FutureWarning``, ``UserWarning`` ...) and
    every logger below ERROR that vLLM's log routing does not set itself
    (torch's, transformers' ...), here and in the processes started from
    here; errors still show. Runs before torch or vLLM is imported (torch
    reads ``TORCH_CPP_LOG_LEVEL`` once, e.g. its ``NUMA binding`` warning)."""
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.simplefilter("ignore")
    logging.getLogger().setLevel(logging.ERROR)
    for name in ("torch", "transformers", "huggingface_hub", "triton"):
        logging.getLogger(name).setLevel(logging.ERROR)
