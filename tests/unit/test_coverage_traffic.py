"""The traffic file of ``stepwarm coverage``: every bad field is an error naming
the file, the line and the field, before any engine starts; prompts made up
for replay are distinct where they must be and shared where a prefix says so."""

from __future__ import annotations

import json
import os

import pytest

from stepwarm.coverage.traffic import (
    SAMPLING_DEFAULTS,
    TrafficError,
    TrafficLimits,
    builtin_path,
    check_limits,
    fitting,
    load_traffic,
    loads_traffic,
    make_sampling_params,
    new_size_delta,
    prefix_notes,
    prompts_for,
)

GOOD = '{"prompt": 7}'


def _error(*lines: str) -> str:
    with pytest.raises(TrafficError) as e:
        loads_traffic("\n".join(lines), "t.jsonl")
    return str(e.value)


@pytest.mark.parametrize("line, message", [
    ('{"prompt": 0}', "t.jsonl:2: prompt: 0: allowed: a length (an integer > 0) or a list of "
                      "token ids (integers >= 0, at least one)"),
    ('{"prompt": "abc"}', 't.jsonl:2: prompt: "abc": allowed: a length'),
    ('{"prompt": true}', "t.jsonl:2: prompt: true: allowed: a length"),
    ('{"prompt": []}', "t.jsonl:2: prompt: []: allowed: a length (an integer > 0) or a list "
                       "of token ids (integers >= 0, at least one)"),
    ('{"prompt": [3, false]}', "t.jsonl:2: prompt: [3, false]: allowed: a length"),
    ('{"promt": 3}', "t.jsonl:2: promt: unknown field (did you mean 'prompt'?); allowed: name, "
                     "prompt, count, sampling, server_defaults, prefix, if_fits"),
    ('{"prompt": 5, "count": 4097}', "t.jsonl:2: count: 4097; allowed: an integer from 1 to "
                                     "4096 (MAX_COUNT, see docs/traffic.md)"),
    ('{"prompt": 5, "sampling": {"temprature": 1}}',
     "t.jsonl:2: sampling.temprature: not a SamplingParams field (did you mean 'temperature'?)"),
    ('{"prompt": ' + "[" * 65 + "]" * 65 + "}",
     "t.jsonl:2: nested deeper than 64 levels of arrays and objects; allowed: at most 64 "
     "(MAX_NESTING, see docs/traffic.md)"),
    ('{"prompt": [1, -2]}', "t.jsonl:2: prompt: [1, -2]: allowed:"),
    ('{"count": 2}', "t.jsonl:2: prompt: Field required"),
    ('{"prompt": 5, "count": 0}', "t.jsonl:2: count: 0; allowed: an integer from 1 to 4096 "
                                  "(MAX_COUNT, see docs/traffic.md)"),
    ('{"prompt": 5, "count": "a"}', 't.jsonl:2: count: "a"; allowed: an integer from 1 to 4096'),
    ('{"prompt": 5, "extra": 1}',
     "t.jsonl:2: extra: unknown field; allowed: name, prompt, count, sampling, "
     "server_defaults, prefix, if_fits"),
    ('{"prompt": 5, "prefix": {"group": "g", "tokenz": 5}}',
     "t.jsonl:2: prefix.tokenz: unknown field (did you mean 'tokens'?); allowed: group, tokens"),
    ('{"prompt": 5, "prefix": {"group": "", "tokens": 2}}',
     "t.jsonl:2: prefix.group: String should have at least 1 character"),
    ('{"prompt": 5, "prefix": {"group": "g", "tokens": 5}}',
     "t.jsonl:2: prefix.tokens: 5 must be less than the prompt's 5 tokens"),
    ('{"prompt": 5, "sampling": {"tempx": 1}}', "t.jsonl:2: sampling.tempx: not a SamplingParams field"),
    ('{"prompt": 5, "sampling": {"temperature": -1}}',
     "t.jsonl:2: sampling.temperature: vLLM's SamplingParams refused it: temperature must be "
     "non-negative, got -1.0."),
    ('{"prompt": 5, "sampling": {"temperature": "hot"}}',
     "t.jsonl:2: sampling.temperature: vLLM's SamplingParams refused it: Expected `float`, got `str`"),
    ('{"prompt": 5, "sampling": {"top_p": 2}}',
     "t.jsonl:2: sampling.top_p: vLLM's SamplingParams refused it: top_p must be in (0, 1], got 2"),
    ('{"prompt": 5, "sampling": {"min_p": 3}}',
     "t.jsonl:2: sampling.min_p: vLLM's SamplingParams refused it: min_p must be in [0, 1], got 3"),
    ('{"prompt": 5, "sampling": {"seed": "x"}}',
     "t.jsonl:2: sampling.seed: vLLM's SamplingParams refused it: Expected `int | null`, got `str`"),
    ('{"prompt": 5, "sampling": {"max_tokens": 0}}',
     "t.jsonl:2: sampling.max_tokens: vLLM's SamplingParams refused it: max_tokens must be at least 1"),
    ('{"prompt": 5, "sampling": {"logprobs": "many"}}',
     "t.jsonl:2: sampling.logprobs: 'many': allowed: a number or \"max\""),
    ('{"prompt": 5, "sampling": {"logit_bias": {"a": 1.0}}}',
     "t.jsonl:2: sampling.logit_bias: vLLM's SamplingParams refused it: Expected `int`, got `str`"),
    ('[1]', "t.jsonl:2: expected a JSON object (one request a line), got list"),
    ('{"prompt": 5', "t.jsonl:2:13: invalid JSON: Expecting ',' delimiter"),
])
def test_each_bad_field_is_named_with_its_line(line, message):
    assert _error(GOOD, line).startswith(message)


def test_blank_lines_count_for_line_numbers_and_an_empty_file_is_an_error():
    assert _error(GOOD, "", '{"prompt": 0}').startswith("t.jsonl:3: prompt: 0:")
    assert _error("", "  ") == "t.jsonl: no request (one JSON object a line)"


def test_files_that_cannot_be_read(tmp_path):
    with pytest.raises(TrafficError, match=r"missing\.jsonl: cannot read: No such file"):
        load_traffic(tmp_path / "missing.jsonl")
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(b'{"name": "caf\xe9", "prompt": 3}\n')
    with pytest.raises(TrafficError, match=r"latin1\.jsonl:1: not UTF-8 \(byte 0xe9 at offset 13\)"):
        load_traffic(bad)
    # after a byte-order mark, on line 2: the offset counts the mark
    bad.write_bytes(b'\xef\xbb\xbf{"prompt": 3}\n{"name": "caf\xff"}\n')
    with pytest.raises(TrafficError, match=r"latin1\.jsonl:2: not UTF-8 \(byte 0xff at offset 30\)"):
        load_traffic(bad)
    # a device reports size 0 to stat(): the cap is on the bytes read
    with pytest.raises(TrafficError, match=r"^/dev/zero: traffic file of more than 67108864 bytes"):
        load_traffic("/dev/zero")


#: Runs ``stepwarm coverage ARGS`` in a fresh interpreter, then prints the
#: exit status and which of vLLM and torch were imported.
_COVERAGE_IMPORTS = """
import sys
from stepwarm.cli import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("STATUS", code, sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "torch"}))
"""


def test_a_junk_traffic_file_is_refused_before_vllm_is_imported(tmp_path):
    """Empty, binary, too large or not JSON: exit 2 with the file's error on
    stderr, and neither vLLM nor torch imported (issue 42 item 7: 28-40 s
    before, about 2 s now on a 2-core machine)."""
    import subprocess
    import sys

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(bytes(range(128, 256)))
    text = tmp_path / "text.jsonl"
    text.write_text("hello world\n\n[1, 2]\n")
    cases = {empty: f"error: {empty}: no request (one JSON object a line)",
             binary: f"error: {binary}:1: not UTF-8 (byte 0x80 at offset 0)",
             text: f"error: {text}:1:1: invalid JSON: Expecting value\n"
                   f"error: {text}:3: expected a JSON object (one request a line), got list",
             "/dev/zero": "error: /dev/zero: traffic file of more than 67108864 bytes; allowed: "
                          "at most 67108864 bytes (MAX_FILE_BYTES, see docs/traffic.md)"}
    for path, error in cases.items():
        proc = subprocess.run([sys.executable, "-c", _COVERAGE_IMPORTS, "coverage", str(path)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "300"})
        assert proc.stdout == "STATUS 2 []\n", (path, proc.stdout, proc.stderr)
        assert proc.stderr == error + "\n"
    # with --model DIR too: its architecture goes unasked (vLLM's registry
    # imports vLLM: 8 s, the trial of 2026-12-07); its config.json is read
    from stepwarm.zoo import write_model

    model = write_model("tiny-llama", tmp_path / "m")
    proc = subprocess.run([sys.executable, "-c", _COVERAGE_IMPORTS, "coverage", str(text),
                           "--model", str(model)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert proc.stdout == "STATUS 2 []\n", (proc.stdout, proc.stderr)
    assert proc.stderr == cases[text] + "\n"


def test_sampling_defaults_max_and_json_keys_reach_vllm():
    (tl,) = loads_traffic('{"prompt": 5, "sampling": {"logprobs": "max", "logit_bias": '
                          '{"5": 2.0}, "max_tokens": 9}}', "t.jsonl").lines
    kwargs = tl.request.sampling_kwargs(max_logprobs=20)
    assert kwargs == {"max_tokens": 9, "ignore_eos": True, "detokenize": False,
                      "logprobs": 20, "logit_bias": {"5": 2.0}}
    params = make_sampling_params(kwargs)
    assert (params.logprobs, params.max_tokens, params.ignore_eos, params.logit_bias) == (
        20, 9, True, {5: 2.0})
    assert SAMPLING_DEFAULTS == {"max_tokens": 4, "ignore_eos": True, "detokenize": False}


def test_engine_limits_are_checked_per_line_and_field():
    traffic = loads_traffic("\n".join([
        GOOD,
        '{"prompt": 510, "sampling": {"max_tokens": 4}}',
    ]), "t.jsonl")
    limits = TrafficLimits(max_model_len=512, vocab_size=512, max_logprobs=20)
    with pytest.raises(TrafficError) as e:
        check_limits(traffic, limits)
    assert str(e.value) == ("t.jsonl:2: prompt: 510 tokens + max_tokens 4 = 514 > the engine's "
                            "max_model_len 512")
    ids = loads_traffic('{"prompt": [3, 600]}', "t.jsonl")
    with pytest.raises(TrafficError, match=r"^t\.jsonl:1: prompt: token id 600 >= the model's "
                                           r"vocab_size 512$"):
        check_limits(ids, limits)
    lp = loads_traffic('{"prompt": 3, "sampling": {"prompt_logprobs": 21}}', "t.jsonl")
    with pytest.raises(TrafficError, match=r"^t\.jsonl:1: sampling\.prompt_logprobs: 21 > the "
                                           r"engine's max_logprobs 20"):
        check_limits(lp, limits)
    check_limits(loads_traffic('{"prompt": 3, "sampling": {"logprobs": "max"}}', "t.jsonl"), limits)


def test_made_up_prompts_are_distinct_and_prefix_lines_share_their_group():
    traffic = loads_traffic("\n".join([
        '{"prompt": 9, "count": 40}',
        '{"prompt": 40, "prefix": {"group": "sys", "tokens": 32}}',
        '{"prompt": 36, "count": 3, "prefix": {"group": "sys", "tokens": 32}}',
        '{"prompt": [5, 6, 7], "count": 2}',
    ]), "t.jsonl")
    batch, prefix_a, prefix_b, ids = traffic.lines
    first, priming = prompts_for(batch, 0, vocab_size=512)
    second, _ = prompts_for(batch, 1, vocab_size=512)
    assert priming is None and len(first) == 40 and all(len(p) == 9 for p in first)
    assert len({p[0] for p in first + second}) == 80  # no request shares a first block
    assert all(3 <= t < 512 for p in first for t in p)
    a, prime_a = prompts_for(prefix_a, 0, 512)
    b, prime_b = prompts_for(prefix_b, 1, 512)
    assert [len(p) for p in a + b] == [40, 36, 36, 36]
    assert {tuple(p[:32]) for p in a + b} == {tuple(prime_a[:32])} == {tuple(prime_b[:32])}
    assert len(prime_a) == 33 and len({tuple(p[32:]) for p in b}) == 3
    assert prompts_for(ids, 1, 512) == ([[5, 6, 7], [5, 6, 7]], None)


def test_the_new_size_control_shifts_every_prompt_by_one_token_and_keeps_the_prefix():
    traffic = loads_traffic("\n".join([
        '{"prompt": 9, "count": 3}',
        '{"prompt": 40, "count": 2, "prefix": {"group": "sys", "tokens": 32}}',
        '{"prompt": [5, 6, 7], "count": 2}',
        '{"prompt": 33, "prefix": {"group": "sys", "tokens": 32}, "sampling": {"max_tokens": 31}}',
        '{"prompt": 1, "sampling": {"max_tokens": 63}}',
    ]), "t.jsonl")
    batch, prefix, ids, full_prefix, full_one = traffic.lines
    longer, _ = prompts_for(batch, 5, 512, extra=1)
    assert [len(p) for p in longer] == [10, 10, 10]
    (a, b), prime = prompts_for(prefix, 5, 512, extra=1)
    head, _ = prompts_for(prefix, 0, 512)
    assert len(a) == len(b) == 41 and a[:32] == b[:32] == prime[:32] == head[0][:32]
    (x, y), _ = prompts_for(prefix, 5, 512, extra=-1)
    assert len(x) == 39 and x[:32] == head[0][:32]
    more, _ = prompts_for(ids, 5, 512, extra=1)
    assert [p[:3] for p in more] == [[5, 6, 7]] * 2 and [len(p) for p in more] == [4, 4]
    assert prompts_for(ids, 5, 512, extra=-1)[0] == [[5, 6], [5, 6]]
    limits = TrafficLimits(max_model_len=64, vocab_size=512, max_logprobs=20)
    assert new_size_delta(batch, limits, max_tokens=16) == 1
    # 33 + 31 = 64 fills max_model_len: one token less, the prefix and one token kept
    assert new_size_delta(full_prefix, limits, max_tokens=31) == 0
    assert new_size_delta(prefix, limits, max_tokens=24) == -1
    assert new_size_delta(full_one, limits, max_tokens=63) == 0  # 1 token: none to take
    unknown = TrafficLimits(max_model_len=None, vocab_size=512, max_logprobs=20)
    assert new_size_delta(full_one, unknown, max_tokens=63) == 1


def test_a_prefix_the_engine_cannot_hit_gets_a_note_naming_the_line():
    traffic = loads_traffic("\n".join([
        '{"prompt": 40, "prefix": {"group": "sys", "tokens": 32}}',
        '{"prompt": 40, "prefix": {"group": "short", "tokens": 8}}',
        '{"prompt": 9}',
    ]), "t.jsonl")
    assert prefix_notes(traffic, True, 16) == [
        "t.jsonl:2: prefix: 8 tokens is less than one prefix-cache block of this engine "
        "(16 tokens): no prefix hit"]
    assert prefix_notes(traffic, True, 8) == []
    assert prefix_notes(traffic, False, 1) == [
        f"t.jsonl:{n}: prefix: the engine runs without prefix caching: no prefix hit "
        "(vLLM: --enable-prefix-caching)" for n in (1, 2)]


def test_the_builtin_traffic_covers_the_classes_it_promises():
    traffic = load_traffic(None)
    assert traffic.source == str(builtin_path())
    reqs = [tl.request for tl in traffic.lines]
    assert {r.count for r in reqs} == {1, 5, 8, 16, 17, 40}
    assert {r.prompt_len for r in reqs if r.count == 1} >= {1, 7, 16, 33, 300}
    samplings = [r.sampling for r in reqs]
    # one count per class of _topk_log_softmax_kernel's next_power_of_2(k + 1)
    # up to max_logprobs (20), other counts than sampler-matrix warms (1, 3, 7, 15, 20)
    # (15: topk = 16, the multiple of 16 Triton compiles apart in block 16)
    assert {s.get("logprobs") for s in samplings} >= {1, 2, 5, 9, 15, "max"}
    assert {s.get("prompt_logprobs") for s in samplings} >= {1, 3, 5, 11, 15, "max"}
    assert any("seed" in s for s in samplings) and any("min_p" in s for s in samplings)
    assert any(s.get("temperature") == 0.7 and len(s) == 1 for s in samplings)  # temperature only
    # top-k alone, top-p alone and both at 1, 16 and 17 requests (Triton's
    # int classes, which sampler-matrix warms) and at 40
    for only in ({"top_k"}, {"top_p"}, {"top_k", "top_p"}):
        assert {r.count for r in reqs if only <= set(r.sampling)
                and not ({"top_k", "top_p"} - only) & set(r.sampling)} >= {1, 16, 17, 40}
    # greedy and plain random at the same classes
    for temp in (0.0, 1.0):
        assert {r.count for r in reqs if r.sampling == {"temperature": temp}} >= {1, 16, 17, 40}
    # prompts over a step's token budget: chunked prefill beside decodes
    assert any(r.count * r.prompt_len > 2048 and r.prompt_len <= 300 for r in reqs)
    assert any("repetition_penalty" in s for s in samplings)
    assert sum(1 for r in reqs if r.prefix is not None) == 2
    # server-style: sampling from the model's generation_config.json
    assert {r.count for r in reqs if r.server_defaults and not r.sampling} == {1, 16, 17}
    assert any(isinstance(r.prompt, list) for r in reqs)
    # an eager prefill past vLLM's default CUDA-graph range (512), not a multiple
    # of 16 (the fused MoE kernel's own variants), left out where it does not fit
    long = [tl for tl in traffic.lines if tl.request.prompt_len > 512]
    assert [(tl.request.prompt_len, tl.request.if_fits) for tl in long] == [(1003, True)]
    limits = TrafficLimits(max_model_len=512, vocab_size=512, max_logprobs=20)
    check_limits(traffic, limits)  # fits the embedded tiny Llama's engine
    kept, notes = fitting(traffic, limits)
    assert [tl.line for tl in kept.lines] == [tl.line for tl in traffic.lines
                                              if tl is not long[0]]
    assert notes == [f"{builtin_path()}:{long[0].line}: prompt: 1003 tokens + max_tokens 4 > "
                     "the engine's max_model_len 512: left out (if_fits)"]
    assert fitting(traffic, TrafficLimits(1007, 512, 20))[0] == traffic
    assert all(json.loads(line) for line in builtin_path().read_text().splitlines())


def test_a_server_defaults_line_takes_the_generation_config_under_its_own_keys(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": 7, "server_defaults": true, "sampling": {"top_p": 0.5}}\n'
                    '{"prompt": 7, "sampling": {"top_p": 0.5}}\n')
    server_line, plain = [tl.request for tl in load_traffic(str(path)).lines]
    server = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "max_tokens": 2048}
    # the line's top_p wins; the model's max_tokens is not taken (outputs stay short)
    assert server_line.sampling_kwargs(20, server) == {
        "max_tokens": 4, "ignore_eos": True, "detokenize": False,
        "temperature": 0.6, "top_k": 20, "top_p": 0.5}
    assert plain.sampling_kwargs(20, server) == {
        "max_tokens": 4, "ignore_eos": True, "detokenize": False, "top_p": 0.5}
    path.write_text('{"prompt": 7, "server_defaults": "yes"}\n')
    with pytest.raises(TrafficError) as e:
        load_traffic(str(path))
    assert f"{path}:1: server_defaults: " in str(e.value)


def test_lines_that_would_not_be_what_they_say_are_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"prompt": [5, 6, 7, 8], "prefix": {"group": "g", "tokens": 2}}\n'
        '{"prompt": 40, "prefix": {"group": "g", "tokens": 16}, '
        '"sampling": {"prompt_logprobs": 2}}\n'
        '{"prompt": 5, "sampling": {"allowed_token_ids": [3, 600]}}\n'
        '{"prompt": 5, "sampling": {"logit_bias": {"700": 1.0, "4": -1.0}}}\n'
        '{"prompt": 5, "sampling": {"allowed_token_ids": [3, 511]}}\n')
    limits = TrafficLimits(max_model_len=512, vocab_size=512, max_logprobs=20)
    with pytest.raises(TrafficError) as e:
        load_traffic(str(path), limits)
    assert e.value.errors == (
        f"{path}:1: prefix: a prompt of token ids is sent as given, with no shared prefix made "
        "up or primed; allowed: a prompt length with a prefix",
        f"{path}:2: prefix: vLLM skips the prefix cache for a request with prompt_logprobs, so "
        "it would not be a prefix hit; allowed: one or the other",
        f"{path}:3: sampling.allowed_token_ids: token id 600 >= the model's vocab_size 512",
        f"{path}:4: sampling.logit_bias: token id 700 >= the model's vocab_size 512",
    )


def test_every_bad_line_is_named_at_once_not_the_json_ones_first(tmp_path):
    """A traffic file with lines that are not JSON and lines whose fields are
    wrong: every one named (file:line, field), 20 listed then how many more,
    exit 2, stdout empty, vLLM and torch not imported (a new user's trial:
    the JSON errors hid the others)."""
    import subprocess
    import sys

    f = tmp_path / "t.jsonl"
    f.write_text("\n".join(['{"prompt": 4, "sampling": {"temperature": 0}}', '{bad',
                            '{"prompt": 0}', '[1, 2]', '{"promt": 4}']
                           + ['{"prompt": -1}' if i % 2 else 'nope' for i in range(20)]) + "\n")
    prompt = "allowed: a length (an integer > 0) or a list of token ids (integers >= 0, at least one)"
    expected = [f"error: {f}:2:2: invalid JSON: Expecting property name enclosed in double quotes",
                f"error: {f}:3: prompt: 0: {prompt}",
                f"error: {f}:4: expected a JSON object (one request a line), got list",
                f"error: {f}:5: promt: unknown field (did you mean 'prompt'?); allowed: name, prompt, "
                "count, sampling, server_defaults, prefix, if_fits"]
    for line in range(6, 22):
        expected.append(f"error: {f}:{line}:1: invalid JSON: Expecting value" if line % 2 == 0
                        else f"error: {f}:{line}: prompt: -1: {prompt}")
    expected += [f"{f}: 4 more error(s) not shown (at most 20 are listed)",
                 f"{f}: the sampling of line(s) 1 is checked by vLLM's SamplingParams once "
                 "every line is a JSON object"]
    proc = subprocess.run([sys.executable, "-c", _COVERAGE_IMPORTS, "coverage", str(f)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300"})
    assert proc.stdout == "STATUS 2 []\n", proc.stderr
    assert proc.stderr == "\n".join(expected) + "\n"


def test_a_sampling_table_names_every_field_vllm_refuses(tmp_path):
    """Issue 42's fourth trial: an unknown key, a string temperature and a
    negative top_k each came in a round of their own."""
    from stepwarm.coverage.traffic import TrafficError, load_traffic

    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt": 5, "sampling": {"temperature": "hot", "top_kk": 3, "top_k": -7}}\n'
                 '{"prompt": 5, "sampling": {"temperature": 0.5, "top_p": 7}}\n')
    with pytest.raises(TrafficError) as e:
        load_traffic(f)
    assert str(e.value).splitlines() == [
        f"{f}:1: sampling.top_kk: not a SamplingParams field (did you mean 'top_k'?)",
        f"{f}:1: sampling.temperature: vLLM's SamplingParams refused it: Expected `float`, "
        "got `str` - at `$.temperature`",
        f"{f}:1: sampling.top_k: vLLM's SamplingParams refused it: top_k must be 0 (disable), "
        "or at least 1, got -7.",
        f"{f}:2: sampling.top_p: vLLM's SamplingParams refused it: top_p must be in (0, 1], "
        "got 7.0."]


def test_a_field_error_says_the_sampling_tables_wait_for_it(tmp_path):
    """Line 2's count hides nothing silently: the last line says line 1's
    sampling is checked once the file's other errors are mended."""
    from stepwarm.coverage.traffic import TrafficError, loads_traffic

    text = '{"prompt": 5, "sampling": {"temperature": "hot"}}\n{"prompt": 5, "count": 0}\n'
    with pytest.raises(TrafficError) as e:
        loads_traffic(text, "t.jsonl", sampling=False)
    assert str(e.value).splitlines() == [
        "t.jsonl:2: count: 0; allowed: an integer from 1 to 4096 (MAX_COUNT, see docs/traffic.md)",
        "t.jsonl: the sampling of line(s) 1 is checked by vLLM's SamplingParams once the "
        "errors above are mended"]


def test_a_lines_sampling_is_checked_beside_its_other_errors(tmp_path):
    """Fresh trial (issue 42), defect 9: ``prompt: -1`` (or ``count: 0``)
    hid the same line's ``top_p: 2`` until it was mended."""
    from stepwarm.coverage.traffic import TrafficError, loads_traffic

    text = ('{"prompt": -1, "sampling": {"top_p": 2}}\n'
            '{"prompt": 5, "count": 0, "sampling": {"top_p": 2}}\n')
    with pytest.raises(TrafficError) as e:
        loads_traffic(text, "t.jsonl", sampling=False)
    assert str(e.value).splitlines()[-1] == (
        "t.jsonl: the sampling of line(s) 1-2 is checked by vLLM's SamplingParams once the "
        "errors above are mended")
    assert e.value.unchecked_sampling == (1, 2)
    from stepwarm.coverage.traffic import check_json

    with pytest.raises(TrafficError) as e:  # beside a line that is no JSON: said as waiting
        check_json('{"prompt": -1, "sampling": {"top_p": 2}}\nnot json\n'
                   '{"prompt": 5, "sampling": {"temperature": -3}}\n', "t.jsonl")
    assert str(e.value).splitlines()[-1] == (
        "t.jsonl: the sampling of line(s) 1, 3 is checked by vLLM's SamplingParams once every "
        "line is a JSON object")
    with pytest.raises(TrafficError) as e:
        loads_traffic(text, "t.jsonl")
    assert str(e.value).splitlines() == [
        "t.jsonl:1: prompt: -1: allowed: a length (an integer > 0) or a list of token ids "
        "(integers >= 0, at least one)",
        "t.jsonl:1: sampling.top_p: vLLM's SamplingParams refused it: top_p must be in (0, 1], "
        "got 2.0.",
        "t.jsonl:2: count: 0; allowed: an integer from 1 to 4096 (MAX_COUNT, see docs/traffic.md)",
        "t.jsonl:2: sampling.top_p: vLLM's SamplingParams refused it: top_p must be in (0, 1], "
        "got 2.0."]


def test_a_line_vllm_refuses_is_checked_against_the_models_limits_too():
    """Second fresh trial (issue 42): ``{"logprobs": 21, "top_p": 5}`` said
    only top_p's error; logprobs past the model's max_logprobs came next round."""
    from stepwarm.coverage.traffic import TrafficError, TrafficLimits, loads_traffic

    limits = TrafficLimits(max_model_len=512, max_logprobs=20, vocab_size=1000, source="the model's")
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"prompt": 5, "sampling": {"logprobs": 21, "top_p": 5}}\n', "t.jsonl",
                      limits)
    assert str(e.value).splitlines() == [
        "t.jsonl:1: sampling.top_p: vLLM's SamplingParams refused it: top_p must be in (0, 1], "
        "got 5.0.",
        "t.jsonl:1: sampling.logprobs: 21 > the model's max_logprobs 20 (use \"max\", or -e "
        "max_logprobs=N)"]


def test_the_json_lines_of_a_file_with_junk_lines_are_checked_against_the_model(tmp_path):
    """The twelfth trial: beside a line that is no JSON, a prompt past the
    model's max_model_len went unsaid (a second round needed)."""
    from typer.testing import CliRunner

    from stepwarm.cli import app

    f = tmp_path / "tj.jsonl"
    f.write_text('not json\n{"prompt": 9999}\n{"prompt": 5}\n')
    r = CliRunner().invoke(app, ["coverage", str(f)], env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"error: {f}:1:1: invalid JSON: Expecting value\n"
                        f"error: {f}:2: prompt: 9999 tokens + max_tokens 4 = 10003 > the "
                        "model's max_model_len 512\n")


def test_if_fits_leaves_a_long_line_out_where_a_plain_one_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": 600, "if_fits": true}\n'
                    '{"prompt": 7}\n'
                    '{"prompt": 600, "sampling": {"max_tokens": 8}}\n')
    limits = TrafficLimits(max_model_len=512, vocab_size=None, max_logprobs=None,
                           source="config.json's")
    with pytest.raises(TrafficError) as e:
        load_traffic(str(path), limits)
    # only the plain long line is an error, before the engine starts
    assert e.value.errors == (f"{path}:3: prompt: 600 tokens + max_tokens 8 = 608 > "
                              "config.json's max_model_len 512",)
    path.write_text('{"prompt": 600, "if_fits": true}\n{"prompt": 7}\n')
    traffic = load_traffic(str(path), limits)
    kept, notes = fitting(traffic, limits)
    assert [tl.line for tl in kept.lines] == [2]
    assert notes == [f"{path}:1: prompt: 600 tokens + max_tokens 4 > config.json's "
                     "max_model_len 512: left out (if_fits)"]
    path.write_text('{"prompt": 7, "if_fits": 1}\n')
    with pytest.raises(TrafficError) as e:
        load_traffic(str(path))
    assert f"{path}:1: if_fits: " in str(e.value)


def test_a_file_whose_every_line_is_left_out_is_refused_before_and_after_start(tmp_path):
    # a gate on a report of no request would pass on nothing
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": 600, "if_fits": true}\n\n{"prompt": 700, "if_fits": true}\n')
    model = TrafficLimits(max_model_len=512, vocab_size=None, max_logprobs=None,
                          source="the model's")
    with pytest.raises(TrafficError) as e:  # before the engine starts
        load_traffic(str(path), model)
    assert str(e.value) == (f"{path}: every line is left out (if_fits: prompt + max_tokens > "
                            "the model's max_model_len 512), so no request would be replayed; "
                            "give a line that fits, or a longer max_model_len "
                            "(-e max_model_len=N)")
    traffic = load_traffic(str(path), TrafficLimits(1024, None, None, source="the model's"))
    assert [tl.line for tl in fitting(traffic, TrafficLimits(650, None, None))[0].lines] == [1]
    with pytest.raises(TrafficError) as e:  # the engine's own max_model_len is shorter
        fitting(traffic, TrafficLimits(max_model_len=600, vocab_size=None, max_logprobs=None))
    assert "every line is left out (if_fits: prompt + max_tokens > the engine's " \
        "max_model_len 600)" in str(e.value)
