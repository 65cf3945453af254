"""The scenarios under benchmarks/scenarios/ expand on a runner that meets
exactly their ``requires`` lines: every step within its limits."""

from __future__ import annotations

from pathlib import Path

from stepwarm.profile import CacheSpec
from stepwarm.scenario import expand, load
from tests.helpers import make_profile

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "scenarios"


def test_decode_sweep_on_its_smallest_runner():
    # requires: max_num_batched_tokens >= 16384, max_num_seqs >= 64, max_model_len >= 1040
    p = make_profile(runner="v2", kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),),
                     num_blocks=100_000, max_model_len=1040, max_num_seqs=64,
                     max_num_batched_tokens=16384, vocab_size=1000)
    plan = expand(load(str(HERE / "decode-sweep.toml")), p)
    assert not plan.skipped
    shapes = [(st.kind, len(st.scheduled), st.total_num_scheduled_tokens) for st in plan.steps]
    assert shapes == [
        ("prefill", 64, 64 * 128),
        ("decode", 1, 1), ("decode", 4, 4), ("decode", 16, 16), ("decode", 64, 64),
        ("finish", 0, 0),
        ("prefill", 16, 16 * 1024), ("prefill", 16, 16 * 1024),
        ("prefill", 16, 16 * 1024), ("prefill", 16, 16 * 1024),
        ("decode", 1, 1), ("decode", 4, 4), ("decode", 16, 16), ("decode", 64, 64),
        ("cleanup", 0, 0),
    ]
    # the decodes sample greedily: the sweep times the model, not the sampler
    assert {r.sampling for r in plan.requests} == {"greedy"}
