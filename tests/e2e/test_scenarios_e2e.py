"""Every built-in scenario whose needs the tiny Llama meets, through the CPU worker."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwarm.blocks import ReservationContext, reserved_blocks_per_group
from stepwarm.driver import drive
from stepwarm.plan import REQ_ID_PREFIX, Plan
from stepwarm.scenario import builtin_names, expand, load, plans_for

pytestmark = pytest.mark.e2e


def _expected_held(plan: Plan, profile) -> list[dict[str, tuple[int, ...]]]:
    """Blocks each scheduled request holds after each step, by stepwarm.blocks
    math from the tokens computed so far (never shrinking)."""
    ctx = ReservationContext.of(profile)
    computed: dict[str, int] = {}
    held: dict[str, tuple[int, ...]] = {}
    out = []
    for st in plan.steps:
        for rid in st.finished_req_ids | st.preempted_req_ids:
            held.pop(rid, None)
            computed.pop(rid, None)
        row = {}
        for r in st.scheduled:
            if r.resumed:
                held.pop(r.req_id, None)
            computed[r.req_id] = r.num_computed_tokens + r.num_scheduled_tokens
            need = reserved_blocks_per_group(computed[r.req_id], profile.kv_cache_groups, ctx)
            old = held.get(r.req_id, (0,) * len(need))
            held[r.req_id] = tuple(max(a, b) for a, b in zip(need, old))
            row[r.req_id] = held[r.req_id]
        out.append(row)
    return out


def _runnable(profile) -> list[str]:
    return [n for n in builtin_names() if not expand(load(n), profile).skipped]


def test_tiny_llama_runs_the_expected_builtins(profile):
    assert set(_runnable(profile)) >= {
        "default", "mixed-prefill-decode", "triton-buckets", "chunked-prefill",
        "prefix-hit", "preempt-resume", "structured-output",
    }


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_scenario_runs(engine, profile, name):
    plan = plans_for([name], profile)[0]
    if plan.skipped:
        pytest.skip(plan.skipped)
    report = drive(engine.view, plan, profile)
    assert report.ok and len(report.steps) == len(plan.steps)
    expected = _expected_held(plan, profile)
    for st, res, exp in zip(plan.steps, report.steps, expected):
        if st.sample:
            assert res.sampled is not None, st.label
            sampling = {r.req_id for r in st.scheduled if r.samples}
            got = {rid for rid, n in res.sampled.items() if n > 0}
            assert got == sampling, (st.index, st.label)
            assert all(res.sampled[r] >= 1 for r in sampling)
        assert {k: tuple(v) for k, v in res.held_blocks.items()} == exp, (st.index, st.label)
    assert not {r for r in engine.view.live_request_ids() if r.startswith(REQ_ID_PREFIX)}


def test_user_file_runs(engine, profile, tmp_path: Path):
    f = tmp_path / "mine.toml"
    f.write_text(
        '[requests.a]\nprompt = "block_size(0) + 1"\n'
        '[[steps]]\nkind = "chunked_prefill"\nrequests = ["a"]\ntokens = 16\n'
        '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
        '[[steps]]\nkind = "decode"\nrequests = ["a"]\nrepeat = 2\n'
    )
    plan = plans_for([str(f)], profile)[0]
    report = drive(engine.view, plan, profile)
    assert [s.kind for s in report.steps] == ["chunked_prefill", "prefill", "decode", "decode",
                                              "cleanup"]
    assert not {r for r in engine.view.live_request_ids() if r.startswith(REQ_ID_PREFIX)}


def test_packaged_tiny_profile_matches_the_engine(profile):
    from stepwarm.scenario import tiny_profile

    tiny = tiny_profile()
    keep = {"model", "num_blocks", "vllm_version"}
    assert tiny.model_dump(exclude=keep) == profile.model_dump(exclude=keep)
