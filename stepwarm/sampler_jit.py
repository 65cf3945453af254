"""The sampler's Triton kernels vLLM's JIT warmup leaves out, compiled by its own rules.

vLLM 0.34 compiles its kernels' variants at start-up from a registry
(``kernel_warmup`` → ``JitWarmupRegistry.warmup``): each kernel says which
inputs it can see (``warmup_inputs``), and vLLM compiles one variant per
Triton JIT key. Its V2 runner registers the sampler's top-k / top-p kernels
only with a speculator, counting on FlashInfer's sampler otherwise; but that
sampler takes only top-k / top-p batches with no greedy row, no explicit seed
and no processed logprobs, and where it is off (``VLLM_USE_FLASHINFER_SAMPLER=0``,
FlashInfer absent, 16 SMs or fewer) it takes none, so the first other top-k or
top-p requests compile them: the split
top-p pipeline alone has a variant per split count ``S`` (1 - 32, chosen by
batch, vocabulary and SMs), per top-k presence and per round class.

Before its scenarios, stepwarm registers those kernels the way vLLM would
with a speculator and compiles them with vLLM's own warmup
(:func:`stepwarm.vllm_facts.compile_registered`): every class vLLM's rules
name, none twice, but only the logits row-stride class the sampler sees (vLLM
warms both), in stepwarm's compile threads (``STEPWARM_COMPILE_THREADS``); the scenarios' sampler steps
then find them compiled. Nothing runs on the device: vLLM's warmup compiles
without launching. On a restart with ``STEPWARM_SKIP_IDLE=1`` the record
says whether this compiled anything at the last start with the same
configuration; if not, it is skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from stepwarm import vllm_facts

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

logger = logging.getLogger("vllm.stepwarm")


@dataclass
class SamplerJit:
    """What :func:`warm_sampler_kernels` did: ``skipped`` says why nothing
    was compiled (None: it compiled); ``wall_s`` its time."""

    skipped: str | None = None
    wall_s: float = 0.0
    #: Compile keys (Triton variants) vLLM's rules named, after the stride filter.
    keys: int = 0
    #: ``time.time()`` when it began and ended (coverage attributes the
    #: compiles seen between them to stepwarm).
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def window(self) -> tuple[str, float, float] | None:
        """``(label, began, ended)`` for :func:`stepwarm.coverage.startup.attribute`,
        None when nothing was compiled."""
        return None if self.skipped or not self.ended_at else \
            (LABEL, self.started_at, self.ended_at)


#: How reports name this part of stepwarm's start-up.
LABEL = "sampler Triton kernels (vLLM's JIT warmup rules)"


def warm_sampler_kernels(worker: WorkerView, threads: int = 0) -> SamplerJit:
    """Compile the sampler's Triton variants vLLM registered no warmup for
    (:func:`stepwarm.vllm_facts.sampler_jit_registration`), ``threads`` at a
    time (``STEPWARM_COMPILE_THREADS``); never raises (a failure is logged and
    reported as ``skipped``)."""
    try:
        register, why = vllm_facts.sampler_jit_registration(worker.runner)
        if register is None:
            return SamplerJit(skipped=why)
        began, t0 = time.time(), time.monotonic()
        keys = vllm_facts.compile_registered(worker.vllm_config, register, threads)
        if not keys:
            return SamplerJit(skipped="vLLM's rules name no sampler kernel variant on this "
                                      "platform")
        return SamplerJit(wall_s=time.monotonic() - t0, keys=keys, started_at=began,
                          ended_at=time.time())
    except Exception as e:  # noqa: BLE001 - never fails start-up; the scenarios still warm
        logger.warning("sampler Triton kernels not compiled ahead: %s: %s", type(e).__name__, e)
        return SamplerJit(skipped=f"{type(e).__name__}: {e}")
