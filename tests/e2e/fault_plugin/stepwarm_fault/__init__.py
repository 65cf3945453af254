"""Test-only vLLM general plugin: makes one rank fail one stepwarm step.

``STEPWARM_TEST_FAULT=RANK:STEP:WHERE`` (unset: does nothing). WHERE is
``before`` (the step raises before ``execute_model``, so the other ranks run
the step alone and block in its collectives) or ``after`` (it raises after
``sample_tokens``, when every rank has run the step).
"""

import os


def register() -> None:
    spec = os.environ.get("STEPWARM_TEST_FAULT")
    if not spec:
        return
    rank, step, where = spec.split(":")
    import stepwarm.driver as driver

    def this_rank() -> bool:
        import torch.distributed as dist

        return dist.is_initialized() and dist.get_rank() == int(rank)

    if where == "before":
        original = driver.to_scheduler_output

        def to_scheduler_output(st, *args, **kwargs):
            if st.index == int(step) and this_rank():
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
