"""``vllm serve`` with the plugin installed as a package: it starts, logs the
scenarios, and answers a completion over HTTP; without STEPWARM_SCENARIOS
the plugin is inert (the baseline start-up time)."""

from __future__ import annotations

import pytest

from stepwarm.zoo import write_model
from tests.gpu.lane import (
    default_steps,
    lane_env,
    needs_gpus,
    record,
    scenario_ms,
    stepwarm_lines,
    vllm_serve,
)

pytestmark = [pytest.mark.gpu]

SERVE_ARGS = ["--load-format", "dummy", "--max-model-len", "512", "--max-num-seqs", "8",
              "--gpu-memory-utilization", "0.3"]


#: layout -> (extra `vllm serve` arguments, GPUs, rank labels in the log).
LAYOUTS = {
    "tp1": ([], 1, [""]),
    "tp2": (["--tensor-parallel-size", "2"], 2,
            [" [rank 0 (tp 0/2, pp 0/1)]", " [rank 1 (tp 1/2, pp 0/1)]"]),
    "pp2": (["--pipeline-parallel-size", "2"], 2,
            [" [rank 0 (tp 0/1, pp 0/2)]", " [rank 1 (tp 0/1, pp 1/2)]"]),
}


@pytest.mark.parametrize("scenarios", ["default,triton-buckets", ""], ids=["stepwarm", "baseline"])
@pytest.mark.parametrize("layout", [pytest.param(k, marks=needs_gpus(v[1])) for k, v in LAYOUTS.items()])
def test_vllm_serve_starts_logs_the_scenarios_and_answers(tmp_path, layout, scenarios):
    args, _, ranks = LAYOUTS[layout]
    model = write_model(tokenizer=True)
    env = lane_env(**({"STEPWARM_SCENARIOS": scenarios} if scenarios else {}))
    with vllm_serve(model, SERVE_ARGS + args, env, tmp_path / "serve.log") as server:
        out = server.post("/v1/completions", {"model": str(model), "prompt": "t5 t6 t7",
                                               "max_tokens": 4, "ignore_eos": True})
        start_s, log = server.start_s, server.log
    assert len(out["choices"]) == 1 and out["usage"]["completion_tokens"] == 4
    lines = stepwarm_lines(log)
    record(f"serve-{layout}[{scenarios or 'baseline'}]", start_s=round(start_s, 1),
           stepwarm_ms=scenario_ms(lines), stepwarm=lines)
    if not scenarios:
        assert lines == []
        return
    steps = default_steps()
    for rank in ranks:  # every rank ran both scenarios
        assert any(f"stepwarm{rank}: default: {steps} steps in" in ln for ln in lines), log[-6000:]
        assert any(f"stepwarm{rank}: triton-buckets: " in ln and " steps in " in ln for ln in lines)
    # The lines come before the server says it is ready.
    assert log.index("stepwarm") < log.index("Application startup complete")
