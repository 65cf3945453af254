"""``stepwarm bench``'s statistics, ratios, gate and A/B interleaving (no engine)."""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import psutil
import pytest

from stepwarm.bench import (
    BenchReport,
    ShapeDrift,
    StepSamples,
    compare,
    gate,
    interleave,
    merge,
    percentile,
    round_sizes,
    stats,
    tokens_per_s,
)


def test_percentiles_interpolate_between_ranks_as_numpy_does():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([10, 20, 30, 40, 50], 90) == 46.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_stats_and_tokens_per_second_of_one_step():
    st = stats([10.0, 11.0, 12.0, 13.0, 14.0])
    assert (st["p50"], st["p90"], st["min"]) == (12.0, 13.6, 10.0)
    assert st["spread"] == pytest.approx((13.6 - 10.4) / 12.0)
    step = StepSamples(3, "decode", "decode all", 8, 8, 0, host_ms=[4.0, 4.0, 4.0])
    assert tokens_per_s(step) == 2000.0


def _report(times, shape=(8, 8, 0), device=None):
    return BenchReport("s", len(times), 0, [StepSamples(0, "decode", "d", *shape, host_ms=list(times),
                                                        device_ms=device)])


def test_device_times_are_compared_where_measured():
    assert _report([9.0], device=[2.0]).steps[0].times() == [2.0]
    assert _report([9.0]).steps[0].times() == [9.0]


def test_a_ratio_has_a_seeded_bootstrap_interval_around_it():
    a = _report([10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.1])
    b = _report([12.0, 12.1, 11.9, 12.2, 12.0, 11.8, 12.3, 12.1])
    r, = compare(a, b)
    assert r.ratio == pytest.approx(12.05 / 10.05)
    assert 1.17 < r.low <= r.ratio <= r.high < 1.23
    assert compare(a, b) == compare(a, b)  # seeded
    assert not r.noisy


def test_the_gate_fails_only_beyond_the_noise():
    a = _report([10.0, 10.2, 9.9, 10.1, 10.0, 9.8, 10.3, 10.1])
    slower = _report([12.0, 12.1, 11.9, 12.2, 12.0, 11.8, 12.3, 12.1])
    noisy = _report([7.0, 14.0, 9.0, 13.0, 8.0, 15.0, 10.0, 12.0])
    assert [r.index for r in gate(compare(a, slower), 10)] == [0]
    assert gate(compare(a, slower), 25) == []
    (n,) = compare(a, noisy)
    assert n.noisy and gate([n], 5) == []


def test_different_plans_do_not_compare():
    with pytest.raises(ShapeDrift, match="different steps"):
        compare(_report([1.0]), _report([1.0], shape=(4, 4, 0)))


def test_a_b_that_measured_different_times_do_not_compare():
    """A B of ``--against-python`` whose stepwarm counts the host's
    preparation in the device time (before 2026-12-07) against one that
    does not."""
    gpu = "device: the GPU's work, the host's launch hidden behind a queued sleep"
    a, b, old = _report([1.0]), _report([1.0]), _report([1.0])
    a.setup["time"] = b.setup["time"] = gpu
    assert compare(a, b)[0].ratio == 1.0
    with pytest.raises(ShapeDrift, match=r"measured different times \(None; device: the GPU's "):
        compare(a, old)


def test_rounds_interleave_a_and_b_and_merge_their_samples():
    calls = []

    def child(name, ms):
        def send(cmd):
            calls.append((name, cmd))
            if cmd.startswith("warm"):
                return {"warmed": int(cmd.split()[1])}
            n = int(cmd.split()[1])
            return _report([ms] * n).to_dict()
        return send

    got = interleave({"A": child("A", 1.0), "B": child("B", 2.0)}, round_sizes(7, 3), warmup=1)
    assert calls == [("A", "warm 1"), ("B", "warm 1"), ("A", "run 3"), ("B", "run 3"),
                     ("B", "run 2"), ("A", "run 2"), ("A", "run 2"), ("B", "run 2")]
    assert got["A"].steps[0].host_ms == [1.0] * 7 and got["B"].repeat == 7
    # the header's "after K warm-up" is the warm-up each child ran (was 0: the rounds')
    assert (got["A"].warmup, got["B"].warmup) == (1, 1)
    assert merge([_report([1.0]), _report([2.0])]).steps[0].host_ms == [1.0, 2.0]


def test_round_sizes_measure_exactly_the_repeats_asked():
    # the first rounds a repeat longer; fewer rounds than repeats: one each
    assert round_sizes(10, 4) == [3, 3, 2, 2]
    assert round_sizes(30, 4) == [8, 8, 7, 7]
    assert round_sizes(3, 4) == [1, 1, 1]
    assert round_sizes(1, 4) == [1]
    assert round_sizes(8, 4) == [2, 2, 2, 2]
    assert all(sum(round_sizes(n, r)) == n for n in range(1, 60) for r in range(1, 9))


def test_a_childs_error_is_raised_with_its_name():
    def bad(cmd):
        return {"error": "StepFailed: boom"}

    with pytest.raises(RuntimeError, match="B: StepFailed: boom"):
        interleave({"A": lambda c: {"warmed": 0}, "B": bad}, [1], 0)


def test_a_report_goes_through_json_and_back():
    rep = _report([1.0, 2.0], device=[0.5, 0.6])
    back = BenchReport.from_dict(rep.to_dict())
    assert back == rep and rep.to_dict()["steps"][0]["stats"]["p50"] == 0.55


def _noisy(center, n=12, seed=0):
    import random

    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-0.01, 0.01)) for _ in range(n)]


def test_pairs_of_processes_that_drift_widen_the_interval_to_hold_both():
    """s24 / s26: each child's medians held within a run and moved between
    runs (the mixed step 1.208 then 1.137): one pair's interval cannot hold
    that drift; the two-level bootstrap over pairs does."""
    from stepwarm.bench import PROCESS_DRIFT, compare_pairs

    p1 = (_report(_noisy(10.0, seed=1)), _report(_noisy(12.0, seed=2)))
    p2 = (_report(_noisy(10.0, seed=3)), _report(_noisy(11.0, seed=4)))
    r, = compare_pairs([p1, p2])
    assert [round(x, 2) for x in r.per_process] == [1.2, 1.1]
    assert r.drift == pytest.approx(0.1 / r.ratio, abs=0.01) and r.drift > PROCESS_DRIFT
    assert r.low < 1.12 and r.high > 1.18 and r.low <= r.ratio <= r.high
    first, = compare(*p1)  # one pair's interval is narrow and misses the other pair
    assert first.high - first.low < 0.02 and not first.low <= 1.1 <= first.high
    assert compare_pairs([p1, p2]) == compare_pairs([p1, p2])  # seeded
    # one pair: compare's answer, its own ratio kept, no drift
    single, = compare_pairs([p1])
    assert single == compare(*p1)[0] and single.per_process == [single.ratio]
    assert single.drift == 0.0


def test_pairs_of_other_speeds_give_a_ratio_between_their_own():
    """A first-contact trial (CPU, --processes 2): the ratio was median(all B)
    / median(all A), and with the two pairs at other speeds it lay outside
    both pairs' ratios (0.901 against 0.957 and 1.029). It is now their
    geometric mean."""
    from stepwarm.bench import compare_pairs

    fast = (_report([1.0, 1.0, 1.0, 5.0]), _report([1.0, 1.0, 1.0, 1.0]))   # B / A = 1.0
    slow = (_report([4.0, 4.0, 4.0, 4.0]), _report([4.0, 4.0, 4.4, 4.4]))   # B / A = 1.05
    r, = compare_pairs([fast, slow])
    assert r.per_process == [1.0, pytest.approx(1.05)]
    assert r.ratio == pytest.approx((1.0 * 1.05) ** 0.5)
    assert min(r.per_process) <= r.ratio <= max(r.per_process)
    # the medians pooled over both pairs would say 2.5 / 4.0: faster than either pair
    pooled_a = [t for p in (fast, slow) for t in p[0].steps[0].host_ms]
    pooled_b = [t for p in (fast, slow) for t in p[1].steps[0].host_ms]
    assert percentile(pooled_b, 50) / percentile(pooled_a, 50) == 0.625


def test_a_step_at_the_timers_resolution_is_not_compared_gated_or_drifting(capsys):
    """s28 (H100): the finish and cleanup steps schedule no tokens and launch
    no kernels; their device times (1.28-1.31 microseconds) gave 1.000 [0.975,
    1.025] marked drift. Below TIMER_FLOOR_MS on both sides nothing is compared."""
    from stepwarm.bench import TIMER_FLOOR_MS, compare_pairs, gate
    from stepwarm.bench_command import print_ratios

    tick = [0.00128, 0.00131] * 6
    p1 = (_report([0.07] * 12, device=tick), _report([0.08] * 12, device=tick[::-1][:11] + [0.00128]))
    p2 = (_report([0.07] * 12, device=[0.00131] * 12), _report([0.07] * 12, device=[0.00128] * 12))
    r, = compare_pairs([p1, p2])
    assert r.idle and (r.ratio, r.low, r.high, r.drift) == (1.0, 1.0, 1.0, 0.0)
    assert gate([dataclasses.replace(r, low=2.0)], 5) == []
    print_ratios([r], "a", "b")
    assert "at the timer's resolution (no kernels)" in capsys.readouterr().out
    # just above the floor on one side: compared
    busy = (_report([0.07] * 12, device=[TIMER_FLOOR_MS * 1.5] * 12), _report([0.07] * 12, device=tick))
    r2, = compare_pairs([busy])
    assert not r2.idle and r2.ratio == pytest.approx(0.001295 / 0.015)


def test_pairs_that_planned_different_steps_do_not_compare():
    from stepwarm.bench import compare_pairs

    with pytest.raises(ShapeDrift, match="different steps"):
        compare_pairs([(_report([1.0]), _report([1.0])),
                       (_report([1.0]), _report([1.0], shape=(4, 4, 0)))])


FAKE_CHILD = r'''
import json, os, sys
PREFIX = "STEPWARM-BENCH "
ms = float(sys.argv[1])
log = sys.argv[2]
with open(log, "a") as f:
    f.write(f"start {os.getpid()}\n")
print("vLLM noise on stdout", flush=True)
print(PREFIX + json.dumps({"ready": 1, "shapes": [[8, 8, 0]]}), flush=True)
for line in sys.stdin:
    cmd, _, n = line.strip().partition(" ")
    if cmd == "quit" or not cmd:
        break
    if cmd == "warm":
        print(PREFIX + json.dumps({"warmed": int(n)}), flush=True)
    elif cmd == "run":
        step = {"index": 0, "kind": "decode", "label": "d", "num_reqs": 8, "num_tokens": 8,
                "num_spec_tokens": 0, "host_ms": [ms] * int(n), "device_ms": None,
                "context_tokens": 8}
        print(PREFIX + json.dumps({"scenario": "s", "repeat": int(n), "warmup": 0,
                                   "steps": [step]}), flush=True)
'''


def test_each_pair_is_a_fresh_a_and_b_process_one_after_another(tmp_path):
    """``--processes 3``: three pairs of real child processes, each started,
    warmed, run through every round and ended before the next pair."""
    from stepwarm.bench_command import run_compare

    script = tmp_path / "child.py"
    script.write_text(FAKE_CHILD)
    log = tmp_path / "starts.log"
    seen = []
    pairs = run_compare([str(script), "1.0", str(log)], [str(script), "2.0", str(log)], {}, None,
                        rounds=2, repeat=4, warmup=1, processes=3, on_pair=seen.append)
    assert seen == [0, 1, 2] and len(pairs) == 3
    assert all(a.steps[0].host_ms == [1.0] * 4 and b.steps[0].host_ms == [2.0] * 4
               for a, b in pairs)
    pids = [ln.split()[1] for ln in log.read_text().splitlines()]
    assert len(pids) == 6 and len(set(pids)) == 6  # six processes, none reused


def test_the_sleep_before_a_measured_step_outlasts_its_warm_up_host_time():
    from stepwarm.bench import (HIDE_HOST_DEFAULT_MS, HIDE_HOST_FACTOR, HIDE_HOST_MARGIN_MS,
                                HIDE_HOST_MAX_MS, hide_host_ms)

    assert hide_host_ms(None) == HIDE_HOST_DEFAULT_MS == 50.0  # no warm-up repeat
    assert hide_host_ms(4.0) == 4.0 * HIDE_HOST_FACTOR + HIDE_HOST_MARGIN_MS == 5.5
    assert hide_host_ms(0.0) == 0.5
    assert hide_host_ms(10_000.0) == HIDE_HOST_MAX_MS == 500.0  # a compile in the warm-up


HANGING_CHILD = '''
import sys, time
from stepwarm.bench_command import stacks_on_signal
stacks_on_signal()


def engine_start_that_never_ends():
    time.sleep(120)


engine_start_that_never_ends()
'''


def test_a_child_that_never_answers_prints_its_stacks_and_is_ended(tmp_path, capfd):
    """s28: a B child's engine start never answered and the bench waited
    until it was killed. Now the wait is bounded: the child's Python stacks
    (stepwarm's ``--child`` handler, registered before its engine starts)
    reach stderr, the child is ended, and the error names it."""
    from stepwarm.bench_command import Child, ChildTimeout

    script = tmp_path / "hang.py"
    script.write_text(HANGING_CHILD)
    t0 = time.monotonic()
    with pytest.raises(ChildTimeout, match=r"^B: no answer in 1.5 s \(its engine's start and "
                       r"plan\); its Python stacks are above \(stderr\); it was ended"):
        Child("B", [sys.executable, str(script)], dict(os.environ), timeout=1.5)
    assert time.monotonic() - t0 < 30
    err = capfd.readouterr().err
    assert "engine_start_that_never_ends" in err and "hang.py" in err  # faulthandler's stack
    assert not [p for p in psutil.process_iter(["cmdline"])
                if str(script) in " ".join(p.info["cmdline"] or [])]


def test_a_child_that_exits_before_answering_is_said_at_once(tmp_path):
    from stepwarm.bench_command import Child

    script = tmp_path / "gone.py"
    script.write_text("import sys; sys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"^A: the child exited \(3\) before answering$"):
        Child("A", [sys.executable, str(script)], dict(os.environ), timeout=60)


def test_a_stray_byte_on_a_childs_stdout_is_not_a_hang(tmp_path):
    """A reviewer's find: a non-UTF-8 byte killed the reader thread, and the
    parent waited the whole --child-timeout for an answer the child had sent."""
    from stepwarm.bench_command import Child

    script = tmp_path / "stray.py"
    script.write_text("import sys, time\nsys.stdout.buffer.write(b'\\xff\\n')\nsys.stdout.flush()\n"
                      "print('STEPWARM-BENCH {\"shapes\": []}', flush=True)\ntime.sleep(30)\n")
    t0 = time.monotonic()
    child = Child("A", [sys.executable, str(script)], dict(os.environ), timeout=20)
    assert child.ready == {"shapes": []} and time.monotonic() - t0 < 15
    child.proc.kill()
    child.proc.wait()


def test_steps_that_read_zero_are_idle_not_a_division_by_zero():
    from stepwarm.bench import compare_pairs

    r, = compare_pairs([(_report([0.07] * 4, device=[0.0] * 4),
                         _report([0.07] * 4, device=[0.0] * 4))])
    assert r.idle and r.ratio == 1.0
