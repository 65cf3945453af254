"""``stepwarm bench --plot``: batch sweeps read off the steps, the picture's
panels and legend, and the options' errors before an engine starts (no engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwarm.bench import BenchReport, StepSamples
from stepwarm.bench_command import check_plot_and_trace
from stepwarm.bench_plot import plot, sweeps


def _step(i, kind, reqs, ctx, ms):
    return StepSamples(i, kind, f"{kind} {reqs}", reqs, reqs, 0, host_ms=[ms, ms * 1.1, ms * 0.9],
                       context_tokens=ctx)


def _grid_report():
    """A batch x context grid as a scenario plans it: prefill, a decode
    batch sweep 1, 2, 4 at context 65, prefill, the sweep at context 257,
    cleanup."""
    steps = [_step(0, "prefill", 4, 64, 9.0)]
    steps += [_step(1 + i, "decode", b, 65 + i, 1.0 + b) for i, b in enumerate((1, 2, 4))]
    steps += [_step(4, "prefill", 4, 256, 30.0)]
    steps += [_step(5 + i, "decode", b, 257 + i, 2.0 + b) for i, b in enumerate((1, 2, 4))]
    steps += [_step(8, "cleanup", 0, 0, 0.2)]
    return BenchReport("grid", 3, 0, steps, {"model": "/tmp/models/tiny-llama", "device": "cpu",
                                             "vllm": "0.32.0", "torch": "2.13.0+cpu"})


def test_batch_sweeps_are_runs_of_decodes_whose_batch_grows():
    found = sweeps(_grid_report().steps)
    assert [[s.index for s in run] for run in found] == [[1, 2, 3], [5, 6, 7]]
    assert [run[0].context_tokens for run in found] == [65, 257]
    # a decode whose batch does not grow starts a new run; a lone step is none
    flat = [_step(0, "decode", 2, 10, 1.0), _step(1, "decode", 2, 11, 1.0),
            _step(2, "spec_decode", 4, 12, 1.0)]
    assert sweeps(flat) == []


def test_the_svg_has_a_line_per_configuration_and_sweep(tmp_path):
    a, b = _grid_report(), _grid_report()
    out = tmp_path / "grid.svg"
    assert plot({"A": a, "B": b}, out) == 2
    text = out.read_text()
    for label in ("A p50", "B p50", "A ctx 65", "A ctx 257", "B ctx 65", "B ctx 257",
                  "batch sweeps", "grid: each step, p10-p90",
                  "tiny-llama · cpu · vLLM 0.32.0 · torch 2.13.0+cpu"):
        assert label in text, label


def test_a_plan_without_a_sweep_is_one_panel_and_png_is_png(tmp_path):
    rep = BenchReport("one", 3, 0, [_step(0, "prefill", 2, 8, 5.0), _step(1, "cleanup", 0, 0, 0.1)])
    out = tmp_path / "one.png"
    assert plot({"A": rep}, out) == 1
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, errors", [
    ((Path("x.pdf"), None, None, False), ["--plot x.pdf: the file's suffix must be .png or .svg"]),
    ((None, 2, None, True), ["--trace traces one configuration: run it without --against-e, "
                             "--against-env or --against-python"]),
    ((None, None, Path("t.json"), False), ["--trace-file needs --trace STEP"]),
    ((None, -1, None, False), ["--trace -1: allowed: a step's index, from 0"]),
    ((Path("p.svg"), 0, Path("t.json"), False), []),
])
def test_plot_and_trace_options_are_checked_together(args, errors):
    assert check_plot_and_trace(*args) == errors


def test_the_report_fits_80_columns_and_marks_a_wide_spread(monkeypatch, capsys):
    from stepwarm.bench_command import print_report

    monkeypatch.delenv("COLUMNS", raising=False)
    rep = _grid_report()
    rep.setup.update(attention_backend="vLLM's default", runner="v1")
    rep.steps[1].host_ms = [1.0, 2.0, 3.0]  # spread (2.8 - 1.2) / 2 = 0.8
    rep.steps[1].label = "decode d[0]..d[3] beside a long prefill of the waiting requests"
    print_report(BenchReport("grid", 3, 1, rep.steps[:2], rep.setup))
    assert capsys.readouterr().out.splitlines() == [
        "grid: 3 repeats after 1 warm-up; cpu, vLLM 0.32.0, torch 2.13.0+cpu, vLLM's",
        "  default, v1 runner; host time, ms",
        "step reqs tokens       p50       p90       p99 spread     tok/s",
        "   0    4      4      9.00      9.72      9.88   0.16       444",
        "     prefill: prefill 4",
        "   1    1      1      2.00      2.80      2.98   0.80*      500",
        "     decode: decode d[0]..d[3] beside a long prefill of the waiting requests",
        "* spread (p90 - p10) / p50 above 0.25: too wide to compare",
        "grid: 2 steps, 11.00 ms at the medians, 455 tokens/s"]


def test_two_plans_are_compared_before_either_is_measured():
    from stepwarm.bench import ShapeDrift, plan_shapes, same_plans
    from stepwarm.scenario import expand, load, tiny_profile

    profile = tiny_profile()
    a = plan_shapes(expand(load("default"), profile))
    assert a[0] == [8, 16, 0]  # 8 requests prefilled 2 tokens each
    same_plans(a, [list(x) for x in a])
    b = [list(x) for x in a]
    b[3][0] -= 1
    with pytest.raises(ShapeDrift, match=rf"step 3 is \({a[3][0]}, "):
        same_plans(a, b)
    with pytest.raises(ShapeDrift, match=f"A {len(a)} steps, B 1"):
        same_plans(a, a[:1])


def test_a_gate_without_b_is_refused_before_an_engine():
    from typer.testing import CliRunner

    from stepwarm.cli import app

    r = CliRunner().invoke(app, ["bench", "default", "--gate", "5"], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and r.stdout == ""
    assert " ".join(r.stderr.split()) == (
        "error: --gate 5: the gate compares B with A; give B with --against-e, --against-env "
        "or --against-python")


def test_numbers_that_are_not_numbers_are_said_with_every_other_error():
    """click stops at the first option it cannot convert; bench says each
    (twelfth trial, item 8: ``--gate abc`` hid the rest)."""
    from typer.testing import CliRunner

    from stepwarm.cli import app

    r = CliRunner().invoke(app, ["bench", "default", "--gate", "abc", "--repeat", "x",
                                 "--warmup", "1.5", "--rounds", "0", "--trace", "nan"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "error: --repeat x: allowed: a whole number from 1 to 100000",
        "error: --warmup 1.5: allowed: a whole number from 0 to 100000",
        "error: --rounds 0: allowed: a whole number from 1 to 1000",
        "error: --trace nan: allowed: a step's index, from 0",
        "error: --gate abc: allowed: a slowdown in percent, 0 or more",
    ]
    r = CliRunner().invoke(app, ["bench", "default", "--gate", "inf", "--against-e", "x=1"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 2
    assert "error: --gate inf: allowed: a slowdown in percent, 0 or more" in r.stderr.splitlines()
