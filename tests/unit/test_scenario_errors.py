"""Every kind of bad scenario input: the message names the file, the line, the
step index and the field, and says what is allowed; nothing runs (no engine)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stepwarm.profile import RunnerProfile
from stepwarm.scenario import ScenarioError, plans_for
from tests.helpers import make_profile, without_unchecked_note


def profile(**kw) -> RunnerProfile:
    return make_profile(**kw)


def bad(tmp_path: Path, text: str, prof: RunnerProfile | None = None) -> ScenarioError:
    f = tmp_path / "bad.toml"
    f.write_text(textwrap.dedent(text).lstrip())
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], prof or profile())
    return e.value


def assert_parts(e: ScenarioError, line: int | None, step: int | None, field: str | None,
                 *words: str) -> None:
    msg = without_unchecked_note(str(e))
    assert "bad.toml" in msg and e.file.endswith("bad.toml")
    if line is not None:
        assert f"bad.toml:{line}:" in msg and e.line == line
    if step is not None:
        assert f"step {step}" in msg and e.step == step
    if field is not None:
        assert f"field {field!r}" in msg and e.field == field
    assert "allowed" in msg
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg


PREFILL_A = """
[requests.a]
prompt = 10

[[steps]]
kind = "prefill"
requests = ["a"]
"""


def test_malformed_toml(tmp_path):
    e = bad(tmp_path, PREFILL_A + 'tokens = = 3\n')
    assert_parts(e, 7, None, None, "malformed TOML", "column")


def test_unknown_key_suggests_closest(tmp_path):
    e = bad(tmp_path, PREFILL_A + "tokenz = 3\n")
    assert_parts(e, 7, 0, "tokenz", "unknown key 'tokenz'", "did you mean 'tokens'?")


def test_unknown_top_level_key(tmp_path):
    e = bad(tmp_path, "need = ['pooling']\n" + PREFILL_A)
    assert_parts(e, 1, None, "need", "did you mean 'needs'?")


def test_unknown_request_key(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = 10\nprompt_len = 3"))
    assert_parts(e, 3, None, "prompt_len", "request 'a'", "did you mean 'prompt'?")


def test_unknown_step_kind(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('"prefill"', '"prefil"'))
    assert_parts(e, 5, 0, "kind", "unknown step kind 'prefil'", "did you mean 'prefill'?",
                 "chunked_prefill")


def test_a_misspelt_kind_hides_no_other_error_of_its_step(tmp_path):
    """The step is read as the kind the did-you-mean names, so its other errors
    are told with the kind's (issue 42, fourth trial, G); a kind close to none
    gives the kind's error alone."""
    e = bad(tmp_path, PREFILL_A.replace('"prefill"', '"prefil"').replace('["a"]', '"a"'))
    kind, requests = e.errors
    assert_parts(kind, 5, 0, "kind", "unknown step kind 'prefil'", "did you mean 'prefill'?")
    assert str(requests).startswith(
        f"{tmp_path}/bad.toml:6: step 0 (read as prefill), field 'requests': wrong type or "
        "value 'a'; allowed: a list of strings")
    assert (requests.line, requests.step, requests.field) == (6, 0, "requests")
    e = bad(tmp_path, PREFILL_A.replace('"prefill"', '"zzz"').replace('["a"]', '"a"'))
    assert_parts(e, 5, 0, "kind", "unknown step kind 'zzz'")
    assert len(e.errors) == 1


def test_misspelt_word_of_a_closed_set_suggests_closest(tmp_path):
    """A sampling preset, request kind, need or sequence misspelt: did-you-mean, as
    for a step kind; a word far from every choice gets none."""
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\nsampling = "greddy"'))
    assert str(e).startswith(f"{e.file}:3: request 'a', field 'sampling': wrong type or value "
                             "'greddy' (did you mean 'greedy'?); allowed: 'warmup', 'greedy', "
                             "'random' or 'seeded' (A preset: ")
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\nkind = "sampel"'))
    assert_parts(e, 3, None, "kind", "wrong type or value 'sampel' (did you mean 'sample'?); "
                 "allowed: 'sample' or 'pool'")
    e = bad(tmp_path, 'needs = ["speculater"]\n' + PREFILL_A)
    assert_parts(e, 1, None, "needs", "'speculater' (did you mean 'speculator'?); allowed: ")
    e = bad(tmp_path, 'sequence = "vllm-defualt"\n')
    assert_parts(e, 1, None, "sequence", "'vllm-defualt' (did you mean 'vllm-default'?); ")
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\nsampling = "fast"'))
    assert "wrong type or value 'fast'; allowed: 'warmup'" in str(e) and "did you" not in str(e)


def test_wrong_type(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = true"))
    assert_parts(e, 2, None, "prompt", "request 'a'", "bool", "an integer, or an expression")


def test_wrong_type_in_step(tmp_path):
    e = bad(tmp_path, PREFILL_A + "each = 'yes'\n")
    assert_parts(e, 7, 0, "each", "'yes'", "allowed: true or false")


def test_zero_tokens(tmp_path):
    e = bad(tmp_path, PREFILL_A + "tokens = 0\n")
    assert_parts(e, 7, 0, "tokens", "tokens 0 is out of range", "allowed: >= 1")


def test_negative_tokens_from_expression(tmp_path):
    e = bad(tmp_path, PREFILL_A + 'tokens = "decode_query_len - 5"\n')
    assert_parts(e, 7, 0, "tokens", "'decode_query_len - 5' = -4")


def test_zero_prompt(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = 0"))
    assert_parts(e, 2, None, "prompt", "request 'a'", "out of range")


def test_prompt_plus_decode_beyond_max_model_len(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = "max_model_len - 1"')
            .replace("128", "128") + '\n[[steps]]\nkind = "decode"\nrequests = ["a"]\nrepeat = 3\n',
            profile(max_num_batched_tokens=256))
    assert_parts(e, 11, 1, "repeat", "beyond max_model_len 256", "max_model_len = 256 per request")


def test_prompt_beyond_max_model_len(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = "max_model_len + 1"'))
    assert_parts(e, 2, None, "prompt", "prompt of 257 tokens exceeds 255", "1..255")


def test_prompt_of_max_model_len_leaves_no_room_for_the_sampled_token(tmp_path):
    # vLLM's InputProcessor._validate_prompt_len refuses a generate prompt of
    # exactly max_model_len: stepwarm refuses it before the first step too.
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = "max_model_len"'))
    assert_parts(e, 2, None, "prompt", "prompt of 256 tokens exceeds 255",
                 "max_model_len 256 less the token sampled after it", "1..255")


def test_more_requests_than_max_num_seqs(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\ncount = "max_num_seqs + 1"'))
    assert_parts(e, 7, 0, "requests", "5 requests scheduled but max_num_seqs is 4",
                 "at most max_num_seqs = 4")


def test_more_tokens_than_max_num_batched_tokens(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = 100\ncount = 2"))
    assert_parts(e, 7, 0, "requests", "200 tokens scheduled but max_num_batched_tokens is 128",
                 "max_num_batched_tokens = 128 per step")


def test_more_tokens_than_budget_names_tokens_field(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = 200") + "tokens = 129\n")
    assert_parts(e, 7, 0, "tokens", "129 tokens scheduled")


def test_decode_never_prefilled(tmp_path):
    e = bad(tmp_path, PREFILL_A + '\n[[steps]]\nkind = "decode"\nrequests = ["b"]\n'
            .replace('["b"]', '["b"]') + "\n[requests.b]\nprompt = 4\n")
    assert_parts(e, 10, 1, "requests", "request 'b' cannot be decoded: it is never prefilled",
                 "decode a running request")


def test_decode_finished(tmp_path):
    e = bad(tmp_path, PREFILL_A + '\n[[steps]]\nkind = "finish"\n'
            '\n[[steps]]\nkind = "decode"\nrequests = ["a"]\n')
    assert_parts(e, 13, 2, "requests", "request 'a' cannot be decoded: it is finished already")


def test_prefill_of_live_request(tmp_path):
    e = bad(tmp_path, PREFILL_A + '\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    assert_parts(e, 10, 1, "requests", "already finished its prefill", "prefill a waiting request")


def test_spec_tokens_without_speculator(tmp_path):
    e = bad(tmp_path, PREFILL_A + '\n[[steps]]\nkind = "decode"\nrequests = ["a"]\nspec_tokens = 2\n')
    assert_parts(e, 11, 1, "spec_tokens", "no speculator", "0..num_spec_steps = 0")


def test_more_blocks_than_the_runner_has(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", "prompt = 40"), profile(num_blocks=3))
    assert_parts(e, 6, 0, "requests", "needs 3 more block(s)", "num_blocks 3",
                 "num_blocks - 1 = 2 blocks")


def test_expression_unknown_fact(tmp_path):
    e = bad(tmp_path, PREFILL_A + 'tokens = "max_num_batched_token // 2"\n')
    assert_parts(e, 7, 0, "tokens", "unknown fact 'max_num_batched_token'",
                 "did you mean 'max_num_batched_tokens'?")


def test_expression_division_by_zero(tmp_path):
    e = bad(tmp_path, PREFILL_A + 'tokens = "max_model_len // num_spec_steps"\n')
    assert_parts(e, 7, 0, "tokens", "division by zero")


def test_expression_error_in_request(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\ncount = "seqs"'))
    assert_parts(e, 3, None, "count", "request 'a'", "unknown fact 'seqs'")


def test_empty_scenario(tmp_path):
    e = bad(tmp_path, 'description = "nothing"\n')
    assert_parts(e, 1, None, "steps", "empty scenario")


def test_empty_file(tmp_path):
    e = bad(tmp_path, "")
    assert_parts(e, 1, None, "steps", "empty scenario")


def test_unknown_request_in_step(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('["a"]', '["aa"]'))
    assert_parts(e, 6, 0, "requests", "unknown request 'aa'", "did you mean 'a'?")


def test_bad_selector(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('["a"]', '["a[0"]'))
    assert_parts(e, 6, 0, "requests", "not a request selector")


def test_selector_index_out_of_range(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('["a"]', '["a[3]"]'))
    assert_parts(e, 6, 0, "requests", "index 3 out of range", "0..0")


def test_missing_required_key(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('"prefill"', '"chunked_prefill"'))
    assert_parts(e, 4, 0, "tokens", "missing required key 'tokens'")


def test_wrong_literal(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\nkind = "embed"'))
    assert_parts(e, 3, None, "kind", "'embed'", "'sample' or 'pool'")


def test_requests_not_a_list(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('["a"]', '"a"'))
    assert_parts(e, 6, 0, "requests", "a list of strings")


def test_unknown_need(tmp_path):
    e = bad(tmp_path, "needs = ['speculators']\n" + PREFILL_A)
    assert_parts(e, 1, None, "needs", "speculator")


def test_prefix_hit_not_block_aligned(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace('"prefill"', '"prefix_hit"').replace(
        "prompt = 10", "prompt = 40") + "cached = 10\n")
    assert_parts(e, 7, 0, "cached", "not a whole number of blocks", "lcm_block_size = 16")


def test_sequence_with_steps(tmp_path):
    e = bad(tmp_path, 'sequence = "vllm-default"\n' + PREFILL_A)
    assert_parts(e, 1, None, "sequence", "one or the other")


def test_pool_request_on_generative_runner(tmp_path):
    e = bad(tmp_path, PREFILL_A.replace("prompt = 10", 'prompt = 10\nkind = "pool"'))
    assert_parts(e, 3, None, "kind", "not a pooling model", 'needs = ["pooling"]')


def test_unknown_builtin_name():
    with pytest.raises(ScenarioError) as e:
        plans_for(["spec-decod"], profile())
    assert "did you mean 'spec-decode'?" in str(e.value) and "allowed" in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError) as e:
        plans_for([str(tmp_path / "nope.toml")], profile())
    assert "nope.toml" in str(e.value) and "cannot read" in str(e.value)


def test_all_scenarios_are_validated_before_any_runs(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(textwrap.dedent(PREFILL_A))
    with pytest.raises(ScenarioError):
        plans_for([str(good), "default", str(tmp_path / "missing.toml")], profile())


def test_bad_request_name_gives_line_and_name_only(tmp_path):
    e = bad(tmp_path, """
        description = "x"

        [requests."1bad name"]
        prompt = 4

        [[steps]]
        kind = "prefill"
        requests = ["a"]
    """)
    first, second = e.errors  # and the step's unknown request, beside it (issue 42 item 9)
    assert_parts(first, 3, None, None, "bad request name '1bad name'",
                 "allowed: a letter, then letters, digits, _ and -")
    assert "{" not in str(first) and "got" not in str(first)
    assert str(second).endswith("bad.toml:8: step 0 (prefill), field 'requests': unknown "
                                "request 'a'; allowed: names declared under [requests]: none")


def test_bad_inline_request_name_gives_line(tmp_path):
    e = bad(tmp_path, """
        [requests]
        ok = { prompt = 4 }
        "a b" = { prompt = 4 }

        [[steps]]
        kind = "prefill"
        requests = ["ok"]
    """)
    assert_parts(e, 3, None, None, "bad request name 'a b'")


SPEC_STEP = """
[requests.a]
prompt = 4
count = 2

[[steps]]
kind = "prefill"
requests = ["a"]

[[steps]]
kind = "{kind}"
{sel}
"""


@pytest.mark.parametrize("kind, sel, line", [
    ("spec_decode", 'requests = ["a"]', 10),
    ("mixed_decode", 'spec = ["a[0]"]\nnon_spec = ["a[1]"]', 10),
])
def test_spec_step_without_speculator_is_an_error(tmp_path, kind, sel, line):
    e = bad(tmp_path, SPEC_STEP.replace("{kind}", kind).replace("{sel}", sel))
    assert_parts(e, line, 1, "kind",
                 f"{kind} step but the runner has no speculator (num_speculative_steps 0)",
                 'add needs = ["speculator"] to skip on such runners', 'or use kind = "decode"')


def test_spec_step_with_needs_speculator_is_skipped(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text('needs = ["speculator"]\n' + SPEC_STEP.replace("{kind}", "spec_decode")
                 .replace("{sel}", 'requests = ["a"]'))
    (plan,) = plans_for([str(f)], profile())
    assert plan.skipped.startswith("needs speculator") and not plan.steps


def test_requires_false_skips_with_the_values(tmp_path):
    f = tmp_path / "ok.toml"
    f.write_text('requires = ["max_num_batched_tokens >= 16", "max_num_seqs >= 2 * 4"]\n'
                 + textwrap.dedent(PREFILL_A))
    (plan,) = plans_for([str(f)], profile())
    assert plan.skipped == "requires max_num_seqs >= 2 * 4: false on this runner (4 >= 8)"
    (plan,) = plans_for([str(f)], profile(max_num_seqs=8))
    assert not plan.skipped and plan.steps


def test_requires_bad_condition(tmp_path):
    e = bad(tmp_path, 'description = "x"\nrequires = ["max_num_seqs"]\n' + PREFILL_A)
    assert_parts(e, 2, None, "requires", "'max_num_seqs' is not a comparison",
                 "< <= > >= == !=")
    e = bad(tmp_path, 'requires = ["max_num_sqs >= 2"]\n' + PREFILL_A)
    assert_parts(e, 1, None, "requires", "unknown fact 'max_num_sqs'",
                 "did you mean 'max_num_seqs'?")


def test_requires_wrong_type(tmp_path):
    e = bad(tmp_path, 'requires = "max_num_seqs >= 2"\n' + PREFILL_A)
    assert_parts(e, 1, None, "requires", "a list of strings")


def test_directory_is_not_a_scenario(tmp_path):
    d = tmp_path / "adir"
    d.mkdir()
    with pytest.raises(ScenarioError) as e:
        plans_for([str(d)], profile())
    msg = str(e.value)
    assert f"{str(d)!r} is a directory, not a scenario file (*.toml)" in msg
    assert "unknown scenario" not in msg and "default" in msg


def test_directory_by_bare_name(tmp_path, monkeypatch):
    (tmp_path / "adir").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as e:
        plans_for(["adir"], profile())
    assert "'adir' is a directory, not a scenario file (*.toml)" in str(e.value)


@pytest.mark.parametrize("arg", ["nope.toml", "sub/nope", "sub/nope.toml"])
def test_missing_path_says_no_such_file(tmp_path, monkeypatch, arg):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as e:
        plans_for([arg], profile())
    msg = str(e.value)
    assert msg.startswith(f"{arg}: cannot read scenario file: no such file")
    assert "unknown scenario" not in msg and "allowed: a path to an existing .toml file" in msg


def test_unknown_bare_name_lists_builtins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as e:
        plans_for(["nope"], profile())
    msg = str(e.value)
    assert msg.startswith("unknown scenario 'nope'")
    assert "built-in name: chunked-prefill, cross-attention, default," in msg
    assert "no such file" not in msg


def test_steps_written_as_one_table(tmp_path):
    e = bad(tmp_path, '[requests.a]\nprompt = 4\n[steps]\nkind = "prefill"\nrequests = ["a"]\n')
    assert_parts(e, None, None, "steps",
                 "allowed: [[steps]] tables (an array of tables, each with a kind), not a [steps] table")


def test_a_request_that_is_not_a_table(tmp_path):
    e = bad(tmp_path, 'requests = { a = 5 }\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    assert_parts(e, None, None, None, "request 'a': wrong type or value 5",
                 "allowed: a [requests.NAME] table, e.g. prompt = 24")


def test_a_step_that_is_not_a_table(tmp_path):
    e = bad(tmp_path, "steps = [1, 2]\n")
    first, second = e.errors  # both steps are reported
    assert_parts(first, None, 0, None, "step 0: wrong type or value 1",
                 'allowed: a [[steps]] table with a kind, e.g. kind = "prefill"')
    assert_parts(second, None, 1, None, "step 1: wrong type or value 2")
    assert str(e) == f"{first}\n{second}" and "Input should be" not in str(e)


def test_a_misspelt_kind_key_is_named_with_a_did_you_mean(tmp_path):
    e = bad(tmp_path, """
        [requests.a]
        prompt = 8

        [[steps]]
        knd = "decode"
        requests = ["a"]
        """)
    assert (e.line, e.step, e.field) == (4, 0, "kind")  # the [[steps]] header
    assert "unknown key 'knd' (did you mean 'kind'?); a step without kind; allowed kinds: prefill," in str(e)


def test_a_steps_table_instead_of_an_array_of_tables_gives_its_line(tmp_path):
    e = bad(tmp_path, """
        description = "x"
        requests.a = { prompt = 4 }

        [steps]
        kind = "prefill"
        requests = ["a"]
        """)
    assert_parts(e, 4, None, "steps", "[[steps]] tables", "not a [steps] table")
    assert str(e).startswith(f"{e.file}:4: field 'steps': wrong type or value")


def test_every_step_field_that_selects_requests_is_checked_at_load():
    """The loader's list of selector fields is read off the step models: a
    field typed ``Selectors`` (or ``Selectors | None``) on any step kind."""
    from stepwarm.scenario.format import SELECTOR_FIELDS, STEP_MODELS

    assert SELECTOR_FIELDS == ("requests", "spec", "non_spec", "partial", "prefill", "decode")
    assert "requests" in STEP_MODELS["finish"].model_fields  # typed Selectors | None
    assert "kind" not in SELECTOR_FIELDS and "count" not in SELECTOR_FIELDS


def test_a_failed_request_entry_hides_no_step_that_does_not_select_it(tmp_path):
    """A request entry that cannot be declared (a's prompt past max_model_len)
    leaves the steps that never select its requests planned for real: step 1
    decodes c, never prefilled, and says so beside a's error and step 2's
    (issue 42, fifth trial)."""
    e = bad(tmp_path, """
        [requests.a]
        prompt = 600

        [requests.b]
        prompt = 10

        [requests.c]
        prompt = 5

        [[steps]]
        kind = "prefill"
        requests = ["b"]

        [[steps]]
        kind = "decode"
        requests = ["c"]

        [[steps]]
        kind = "prefix_hit"
        requests = ["c"]
        cached = 3
        """, profile(max_model_len=512))
    a, decode, hit, *note = e.errors
    assert (a.line, a.field) == (2, "prompt") and "prompt of 600 tokens exceeds 511" in str(a)
    assert (decode.line, decode.step, decode.field) == (16, 1, "requests")
    assert "request 'c' cannot be decoded: it is never prefilled" in str(decode)
    assert (hit.step, hit.field) == (2, "cached")


@pytest.mark.parametrize("order, line, field", [
    ('decode = ["a"]\nprefill = ["b"]', 6, "decode"),
    ('prefill = ["b"]\ndecode = ["a"]', 7, "decode"),
])
def test_a_mixed_step_blames_the_selector_that_holds_the_bad_request(tmp_path, order, line,
                                                                      field):
    """A fresh user's find: a mixed_prefill_decode whose decode request was never
    prefilled was blamed on 'prefill' (its line, not decode's)."""
    e = bad(tmp_path, """
        requests.a = { prompt = 8 }
        requests.b = { prompt = 8 }

        [[steps]]
        kind = "mixed_prefill_decode"
        """ + order + "\n")
    assert_parts(e, line, 0, field, "request 'a' cannot be decoded: it is never prefilled")


def test_mixed_decode_blames_non_spec_for_a_non_spec_request(tmp_path):
    e = bad(tmp_path, """
        requests.r = { prompt = 4, count = 2 }
        requests.x = { prompt = 4 }
        [[steps]]
        kind = "prefill"
        requests = ["r"]
        [[steps]]
        kind = "mixed_decode"
        spec = ["r[0]"]
        non_spec = ["x"]
        """, profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2))
    assert_parts(e, 9, 1, "non_spec", "request 'x' cannot be decoded")


def test_a_preempted_request_is_not_preempted_again(tmp_path):
    """A fresh user's find: two preempts of one request were accepted (and run);
    vLLM's scheduler preempts from its running queue only."""
    e = bad(tmp_path, """
        requests.a = { prompt = 8 }
        requests.b = { prompt = 8 }
        steps = [{ kind = "prefill", requests = ["a", "b"] },
                 { kind = "preempt", requests = ["a"] },
                 { kind = "preempt", requests = ["a"] }]
        """)
    assert_parts(e, 5, 2, "requests", "request 'a' cannot be preempted: it is preempted already")


def test_a_resume_past_what_is_left_says_the_prefix_hit(tmp_path):
    """A fresh user's find: 'resume schedules 8 tokens; allowed 1..2' without the
    why: on resumption the scheduler's prefix-cache lookup found most of them."""
    from stepwarm.profile import tiny_profile

    e = bad(tmp_path, """
        requests.a = { prompt = 300, sampling = "greedy" }
        requests.b = { prompt = 8 }
        steps = [{ kind = "prefill", requests = ["a", "b"] },
                 { kind = "preempt", requests = ["a"] },
                 { kind = "resume", requests = ["a"], tokens = 250 }]
        """, tiny_profile())
    assert_parts(e, 5, 2, "tokens", "request 'a': resume schedules 250 tokens, but 45 are "
                 "left to compute (256 of its 301 tokens are a prefix-cache hit on resumption, "
                 "as vLLM's scheduler looks it up); allowed: 1 to 45")
