"""Uneven drafts within one step (``mixed_decode`` with ``partial``, the
``spec-uneven`` built-in) and the profile's drafter record."""

from __future__ import annotations

import tomllib

import pytest

from stepwarm.drafter import Drafter
from stepwarm.profile import RunnerProfile
from stepwarm.scenario import ScenarioError, expand, load, loads
from tests.unit.test_scenario import profile


def _profile(spec: int = 2, **kw) -> RunnerProfile:
    return profile(**{"num_speculative_steps": spec, "num_lookahead_tokens": spec, **kw})


def _drafts(step) -> list[int]:
    return [len(r.spec_token_ids) for r in step.scheduled]


def test_spec_uneven_sends_full_partial_and_no_drafts_in_one_step():
    plan = expand(load("spec-uneven"), _profile(spec=2))
    assert not plan.skipped
    by_label = [(s.kind, _drafts(s)) for s in plan.steps if s.kind in ("spec_decode", "mixed_decode")]
    # 4 requests (max_num_seqs), sent in the running queue's order (r[0],
    # r[1], r[2], ...), as vLLM's scheduler sends them: the second uneven
    # step, roles rotated, has its full drafts last.
    assert by_label == [
        ("spec_decode", [2, 2, 2, 2]),
        ("mixed_decode", [2, 1, 0]),
        ("mixed_decode", [1, 0, 2]),
        ("mixed_decode", [2, 2, 1, 1]),
        ("mixed_decode", [2, 1, 1, 1]),
        ("spec_decode", [1, 1, 1, 1]),
        ("spec_decode", [2, 2, 2, 2]),
    ]
    uneven = next(s for s in plan.steps if s.kind == "mixed_decode")
    assert [r.num_scheduled_tokens for r in uneven.scheduled] == [3, 2, 1]
    assert uneven.num_spec_tokens_to_schedule == 2


def test_spec_uneven_skips_without_a_speculator_and_needs_three_requests():
    assert expand(load("spec-uneven"), _profile(spec=0, decode_query_len=1)).skipped
    few = expand(load("spec-uneven"), _profile(spec=2, max_num_seqs=2))
    assert few.skipped and "requires" in few.skipped


SC = """
needs = ["speculator"]
[requests.r]
prompt = 4
count = 3
[[steps]]
kind = "prefill"
requests = ["r"]
[[steps]]
kind = "mixed_decode"
spec = ["r[0]"]
{rest}
"""


def test_mixed_decode_needs_non_spec_or_partial():
    with pytest.raises(ScenarioError, match=r"t.toml:9: step 1 \(mixed_decode\), field 'non_spec': "
                       r"a mixed_decode step needs non_spec or partial requests"):
        expand(loads(SC.format(rest=""), "t.toml", "t"), _profile())


def test_a_request_both_spec_and_partial_is_an_error():
    with pytest.raises(ScenarioError, match=r"field 'partial': request\(s\) r\[0\] are "
                       r"selected twice"):
        expand(loads(SC.format(rest='partial = ["r[0:2]"]'), "t.toml", "t"), _profile())


def test_partial_tokens_above_num_spec_steps_is_an_error():
    with pytest.raises(ScenarioError, match=r"3 draft tokens exceed num_speculative_steps 2"):
        expand(loads(SC.format(rest='partial = ["r[1]"]\npartial_tokens = 3'), "t.toml", "t"),
               _profile())


def test_the_drafter_round_trips_through_toml_and_json():
    d = Drafter(method="eagle", num_speculative_tokens=2, model="/m/drafter",
                layers=("model.layers.2.self_attn.attn",), kv_cache_groups=(0,),
                num_lookahead_tokens=2)
    p = _profile(drafter=d)
    assert RunnerProfile.model_validate(tomllib.loads(p.to_toml())) == p
    assert RunnerProfile.model_validate_json(p.to_json()) == p
    assert "[drafter]" in p.to_toml()
    # A profile saved before drafters were recorded still loads.
    assert RunnerProfile.model_validate(tomllib.loads(_profile().to_toml())).drafter is None


def test_a_label_without_non_spec_requests_has_no_empty_slot():
    """A first-contact trial: `r[0],r[1] +2 drafts /  / r[2]..r[7] (6) +1 draft`."""
    plan = expand(loads(SC.format(rest='partial = ["r[1:3]"]\npartial_tokens = 1'), "t.toml", "t"),
                  _profile())
    step = next(s for s in plan.steps if s.kind == "mixed_decode")
    assert step.label == "mixed decode r[0] +2 drafts / r[1],r[2] +1 draft"
    plan = expand(loads(SC.format(rest='non_spec = ["r[1]"]\npartial = ["r[2]"]\n'
                                       'partial_tokens = 1'), "t.toml", "t"), _profile())
    step = next(s for s in plan.steps if s.kind == "mixed_decode")
    assert step.label == "mixed decode r[0] +2 drafts / r[1] / r[2] +1 draft"
