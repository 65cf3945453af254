"""A ``requires`` entry's names and operators are the format's to check,
whatever ``needs`` says: a scenario its runner would skip for its needs
still has its bad ``requires`` reported (``check``, ``run -s``), with no
engine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepwarm.scenario import ScenarioError, load

BODY = '[requests.a]\nprompt = 4\n\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
FACTS = ("decode_query_len, draft_slots, encoder_budget, lcm_block_size, max_decode_seqs, "
         "max_encoder_len, max_image_prompt_tokens, max_image_tokens, max_images_per_prompt, "
         "max_logprobs, max_model_len, max_num_batched_tokens, max_num_seqs, num_blocks, "
         "num_image_classes, num_kv_groups, num_spec_steps, prefill_chunk_align, "
         "request_budget")


def write(tmp_path: Path, requires: str, needs: bool = True) -> Path:
    f = tmp_path / "needs_bad.toml"
    f.write_text('description = "x"\n' + ('needs = ["speculator"]\n' if needs else "")
                 + f"requires = [{requires}]\n\n" + BODY)
    return f


@pytest.mark.parametrize("needs", [True, False])
def test_unknown_fact_in_requires_is_a_format_error_whatever_needs_says(tmp_path, needs):
    f = write(tmp_path, '"max_num_seqs >= foo"', needs)
    with pytest.raises(ScenarioError) as e:
        load(str(f))
    line = 3 if needs else 2
    assert str(e.value) == (
        f"{f}:{line}: field 'requires': 'max_num_seqs >= foo': unknown fact 'foo'; allowed "
        f"facts: {FACTS}, block_size(i), kv_seqs(tokens), kv_tokens(requests)")
    assert (e.value.line, e.value.field) == (line, "requires")


def test_bad_operator_in_requires_is_a_format_error(tmp_path):
    f = write(tmp_path, '"max_num_seqs is 2"')
    with pytest.raises(ScenarioError) as e:
        load(str(f))
    assert str(e.value) == (
        f"{f}:3: field 'requires': 'max_num_seqs is 2': operator Is is not allowed; allowed: "
        "< <= > >= == !=")


def test_requires_values_stay_the_runners_to_judge(tmp_path):
    """A division by zero is a value: no runner is known at load time."""
    f = write(tmp_path, '"max_num_seqs // (num_spec_steps - 1) >= 1"')
    assert load(str(f)).model.requires == ["max_num_seqs // (num_spec_steps - 1) >= 1"]


def test_run_refuses_a_skipped_scenarios_bad_requires_with_exit_2(tmp_path):
    f = write(tmp_path, '"max_num_seqs"')
    env = {**os.environ, "COLUMNS": "1000"}
    r = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", str(f)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r
    assert r.stdout == ""
    assert r.stderr == (
        f"error: {f}:3: field 'requires': 'max_num_seqs' is not a comparison; allowed: EXPR "
        "OP EXPR with OP one of < <= > >= == != (e.g. \"max_num_seqs >= 2\"), EXPR made of "
        f"integers, the facts {FACTS}, block_size(i), kv_seqs(tokens), kv_tokens(requests), "
        "min(...), max(...), + - * // % and parentheses\n")
