"""Test-only vLLM general plugin: makes one rank fail one stepwarm step.

``STEPWARM_TEST_FAULT=RANK:STEP:WHERE`` (unset: does nothing). WHERE is
``before`` (the step raises before ``execute_model``, so the other ranks run
the step alone and block in its collectives) or ``after`` (it raises after
``sample_tokens``, when every rank has run the step), ``oom`` (the step
raises ``torch.OutOfMemoryError`` before ``execute_model``) or ``vllm``
(vLLM's own ``Sampler.forward`` raises, given no sampling metadata, in the
step's ``sample_tokens``).

``STEPWARM_TEST_HANG=WHERE:STEP:SECONDS`` (unset: does nothing): stepwarm's
step STEP (0-based) hangs for SECONDS on every rank, in vLLM's
``Sampler.forward`` (WHERE ``sampler``) or in the model runner's
``execute_model`` (WHERE ``execute_model``); the hang sleeps in short slices,
like a Python-level busy wait.

``STEPWARM_TEST_SLOW=RANK:SECONDS`` (unset: does nothing): on world rank RANK,
stepwarm's hook sleeps SECONDS before it reads the runner's profile (before
any agreement point), so that rank reaches ``STEPWARM_TIME_LIMIT_S`` first, or,
slept past ``STEPWARM_RANK_TIMEOUT_S``, stops answering its peers.

``STEPWARM_TEST_LATE=RANK:SECONDS`` (unset: does nothing): on world rank RANK,
stepwarm's hook sleeps SECONDS after the ranks agreed on the plans, before
the first scenario's time-limit check, so that this rank alone is past
``STEPWARM_TIME_LIMIT_S`` there.

``STEPWARM_TEST_PROFILE=RANK`` (unset: does nothing): on world rank RANK the
profile stepwarm reads has half the runner's ``max_num_seqs``, so its plans
differ from the other ranks'.
"""

import os
import time


def register() -> None:
    hang = os.environ.get("STEPWARM_TEST_HANG")
    if hang:
        _hang(*hang.split(":"))
    if os.environ.get("STEPWARM_TEST_SLOW") or os.environ.get("STEPWARM_TEST_PROFILE"):
        _profile_faults()
    late = os.environ.get("STEPWARM_TEST_LATE")
    if late:
        _late(int(late.split(":")[0]), float(late.split(":")[1]))
    spec = os.environ.get("STEPWARM_TEST_FAULT")
    if not spec:
        return
    rank, step, where = spec.split(":")
    import stepwarm.driver as driver

    def this_rank() -> bool:
        import torch.distributed as dist

        return dist.is_initialized() and dist.get_rank() == int(rank)

    if where == "vllm":
        def install():
            from vllm.v1.sample.sampler import Sampler

            forward = Sampler.forward

            def broken_forward(self, logits, sampling_metadata, *args, **kwargs):
                if current["index"] == int(step) and not current.get("fired") and this_rank():
                    current["fired"] = True
                    return forward(self, logits, None, *args, **kwargs)
                return forward(self, logits, sampling_metadata, *args, **kwargs)

            Sampler.forward = broken_forward

        current = _track_step(install)
    elif where in ("before", "oom"):
        original = driver.to_scheduler_output

        def to_scheduler_output(st, *args, **kwargs):
            if st.index == int(step) and this_rank():
                if where == "oom":
                    import torch

                    raise torch.OutOfMemoryError(
                        f"injected: CUDA out of memory at step {step} on rank {rank}")
                raise RuntimeError(f"injected fault before step {step} on rank {rank}")
            return original(st, *args, **kwargs)

        driver.to_scheduler_output = to_scheduler_output
    else:
        original_resolved = driver._resolved
        count = {"n": 0}

        def _resolved(output):
            count["n"] += 1
            if count["n"] == int(step) + 1 and this_rank():
                raise RuntimeError(f"injected fault after step {step} on rank {rank}")
            return original_resolved(output)

        driver._resolved = _resolved


def _track_step(install) -> dict:
    """{"index": the stepwarm step being compiled now} (None outside
    stepwarm); ``install()`` runs before stepwarm's first step, in the
    worker's process (where vLLM's worker modules are imported already)."""
    import stepwarm.driver as driver

    current = {"index": None, "installed": False}
    original = driver.to_scheduler_output

    def to_scheduler_output(st, *args, **kwargs):
        if not current["installed"]:
            current["installed"] = True
            install()
        current["index"] = st.index
        return original(st, *args, **kwargs)

    driver.to_scheduler_output = to_scheduler_output
    return current


def _hang(where: str, step: str, seconds: str) -> None:
    def maybe_hang() -> None:
        if current["index"] == int(step) and not current.get("fired"):
            current["fired"] = True  # once
            end = time.monotonic() + float(seconds)
            while time.monotonic() < end:
                time.sleep(0.05)

    def install():
        if where == "sampler":
            from vllm.v1.sample.sampler import Sampler

            cls, name = Sampler, "forward"
        else:
            from vllm.v1.worker.gpu_model_runner import GPUModelRunner

            cls, name = GPUModelRunner, "execute_model"
        original = getattr(cls, name)

        def hanging(self, *args, **kwargs):
            maybe_hang()
            return original(self, *args, **kwargs)

        setattr(cls, name, hanging)

    current = _track_step(install)


def _world_rank() -> int | None:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else None


def _profile_faults() -> None:
    import stepwarm.hook as hook

    slow = os.environ.get("STEPWARM_TEST_SLOW")
    slow_rank, seconds = (int(slow.split(":")[0]), float(slow.split(":")[1])) if slow else (None, 0)
    odd = os.environ.get("STEPWARM_TEST_PROFILE")
    odd_rank = int(odd) if odd else None
    original = hook.read_profile

    def read_profile(worker):
        rank = _world_rank()
        if rank is not None and rank == slow_rank:
            time.sleep(seconds)
        profile = original(worker)
        if rank is not None and rank == odd_rank:
            profile = profile.model_copy(update={"max_num_seqs": profile.max_num_seqs // 2})
        return profile

    hook.read_profile = read_profile


def _late(rank: int, seconds: float) -> None:
    import contextlib

    import stepwarm.hook as hook

    original = hook.random_state_kept  # entered right after the plan agreement

    @contextlib.contextmanager
    def random_state_kept():
        if _world_rank() == rank:
            time.sleep(seconds)
        with original():
            yield

    hook.random_state_kept = random_state_kept
