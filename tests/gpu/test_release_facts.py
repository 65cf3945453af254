"""The version facts stepwarm reads off vLLM (``stepwarm.vllm_facts``), checked on a
real engine with a drafter: the KV blocks its plans may address under vLLM 0.34's
extensible KV cache, resumed requests sent as new, the warmup's draft slots. On the
CPU the same facts are pinned against each release's Python core (tests/compat)."""

from __future__ import annotations

import re

import pytest

from tests.gpu.lane import lane_env, needs_gpus, probe, record, stepwarm_lines

pytestmark = [pytest.mark.gpu, needs_gpus(1)]

SCENARIOS = "default,preempt-resume,spec-decode,spec-uneven,mixed-prefill-decode,prefix-hit"


def test_a_drafter_engine_runs_the_lifecycle_scenarios_on_the_facts_read_off_its_release():
    spec = {"model": "tiny-llama-eagle", "facts": True, "zoo_args": True,
            "engine": {"gpu_memory_utilization": 0.3}}
    proc, result = probe(spec, lane_env(STEPWARM_SCENARIOS=SCENARIOS))
    log = proc.stdout + proc.stderr
    assert result is not None and result["started"], log[-6000:]
    facts = result["facts"][0]
    record("release-facts[eagle]", facts=facts, stepwarm=stepwarm_lines(log))
    reports = result["reports"][0]
    assert [r["plan"] for r in reports] == SCENARIOS.split(",")
    assert all(r["ok"] and not r["skipped"] and r["steps"] for r in reports), reports
    # nothing of stepwarm's in the runner after start-up; after traffic only
    # served requests (LLM.generate's ids): vLLM 0.34 frees a request that
    # finished in the last step at the next one (run s25: 2 of 3 still there)
    assert result["tokens"] == [4, 4, 4] and result["live_after_start"] == [[]]
    assert all(re.fullmatch(r"\d+(-[0-9a-f]+)?", rid) for rid in result["live"][0]), result["live"]
    assert facts["num_speculative_steps"] == 2 and facts["warmup_draft_slots"] >= 0
    assert 0 < facts["usable_kv_blocks"] <= facts["num_blocks"]
    major_minor = tuple(int(x) for x in facts["vllm"].split(".")[:2])
    if major_minor >= (0, 34):
        assert facts["resumed_sent_as_new"] and facts["extensible"]
        # after start-up the cache is committed at its measured size: plans may
        # address all of it (during vLLM's warmup, fewer: usable_kv_blocks)
        assert facts["usable_kv_blocks"] == facts["num_blocks"]
