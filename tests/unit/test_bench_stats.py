"""``stepwarm bench``'s statistics, ratios, gate and A/B interleaving (no engine)."""

from __future__ import annotations

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

    got = interleave({"A": child("A", 1.0), "B": child("B", 2.0)}, rounds=3, per_round=2, warmup=1)
    assert calls == [("A", "warm 1"), ("B", "warm 1"), ("A", "run 2"), ("B", "run 2"),
                     ("B", "run 2"), ("A", "run 2"), ("A", "run 2"), ("B", "run 2")]
    assert got["A"].steps[0].host_ms == [1.0] * 6 and got["B"].repeat == 6
    # the header's "after K warm-up" is the warm-up each child ran (was 0: the rounds')
    assert (got["A"].warmup, got["B"].warmup) == (1, 1)
    assert merge([_report([1.0]), _report([2.0])]).steps[0].host_ms == [1.0, 2.0]


def test_a_childs_error_is_raised_with_its_name():
    def bad(cmd):
        return {"error": "StepFailed: boom"}

    with pytest.raises(RuntimeError, match="B: StepFailed: boom"):
        interleave({"A": lambda c: {"warmed": 0}, "B": bad}, 1, 1, 0)


def test_a_report_goes_through_json_and_back():
    rep = _report([1.0, 2.0], device=[0.5, 0.6])
    back = BenchReport.from_dict(rep.to_dict())
    assert back == rep and rep.to_dict()["steps"][0]["stats"]["p50"] == 0.55
