"""The hook's watchdog, memory report, random state and failure attribution,
without an engine (the plugin's runs are in tests/e2e/test_observable.py)."""

from __future__ import annotations

import logging
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from stepwarm.driver import raised_by
from stepwarm.memory import TOLERANCE_BYTES, MemoryReport, flag, measured
from stepwarm.random_state import random_state_kept
from stepwarm.settings import HookSettings, SettingsError, unknown_names
from stepwarm.watchdog import StepTimedOut, StepWatch

WHAT = "sampler-matrix step 3/57 (decode, top-k)"


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.02)


def test_a_running_step_is_logged_after_the_threshold_and_at_each_interval(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        with StepWatch(warn_s=0.3).watching(WHAT):
            _busy(1.05)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    secs = [float(re.fullmatch(rf"stepwarm: {re.escape(WHAT)} running for (\d+\.\d) s", m)[1])
            for m in lines]
    assert [round(s, 1) for s in secs] == [0.3, 0.6, 0.9]


def test_a_late_wake_up_says_one_line_not_one_per_missed_interval(caplog, monkeypatch):
    """The third trial (issue 42 item 15): with the watch thread woken late
    (a stalled host; STEPWARM_STEP_WARN_S=0.001) one interval's line came
    13 to 136 times in a burst, each with the same seconds. The clock here
    jumps 5 s at once, past 50 intervals of 0.1 s: one line."""
    import stepwarm.watchdog as wd

    real = time.monotonic
    start = real()
    monkeypatch.setattr(wd.time, "monotonic", lambda: start if real() - start < 0.05
                        else start + 5.0)
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        with StepWatch(warn_s=0.1).watching(WHAT):
            time.sleep(0.6)
    assert [r.getMessage() for r in caplog.records] == [
        f"stepwarm: {WHAT} running for 5.0 s"]


def test_the_cli_shows_each_running_step_once_on_stderr(caplog, capsys):
    """``run`` shows its own line (``on_running``) on stderr, where vLLM's
    log goes too: the watchdog's warning is then DEBUG, so each interval is
    one line on stderr, not two (issue 42 item 15)."""
    from stepwarm.cli import _show_running

    handler = logging.StreamHandler(sys.stderr)  # vLLM's stderr handler at WARNING
    handler.setLevel(logging.WARNING)
    stepwarm_log = logging.getLogger("vllm.stepwarm")
    stepwarm_log.addHandler(handler)
    try:
        with caplog.at_level(logging.DEBUG, logger="vllm.stepwarm"):
            with StepWatch(warn_s=0.3).watching(WHAT, _show_running):
                _busy(1.05)
    finally:
        stepwarm_log.removeHandler(handler)
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.splitlines()
    assert [re.sub(r"\d+\.\d s$", "S s", line) for line in lines] == [
        f"running: {WHAT} for S s"] * 3
    assert [round(float(line.split()[-2]), 1) for line in lines] == [0.3, 0.6, 0.9]
    assert [r.levelname for r in caplog.records] == ["DEBUG"] * 3  # still logged, at DEBUG


def test_a_quick_step_logs_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        with StepWatch(warn_s=0.5, timeout_s=5).watching(WHAT):
            _busy(0.05)
    assert caplog.records == []


def test_a_step_past_the_timeout_is_failed_in_its_thread(caplog):
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vllm.stepwarm"):
        with pytest.raises(StepTimedOut, match=re.escape(
                f"{WHAT} still running after STEPWARM_STEP_TIMEOUT_S=0.4 s; a running step "
                "cannot be cancelled safely, so start-up fails")):
            with StepWatch(warn_s=None, timeout_s=0.4).watching(WHAT):
                _busy(30)
    assert 0.4 <= time.monotonic() - t0 < 1.0
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    _busy(0.1)  # nothing pending is delivered afterwards


def test_unknown_names_get_a_did_you_mean():
    env = {"STEPWARM_ONERROR": "warn", "STEPWARM_STEP_TIMEOUT": "5", "STEPWARM_CACHE": "/x",
           "STEPWARM_ZZZ": "1", "VLLM_X": "1"}
    assert unknown_names(env) == [
        "STEPWARM_ONERROR is not a stepwarm variable (ignored); did you mean STEPWARM_ON_ERROR?",
        "STEPWARM_STEP_TIMEOUT is not a stepwarm variable (ignored); did you mean "
        "STEPWARM_STEP_TIMEOUT_S?",
        "STEPWARM_ZZZ is not a stepwarm variable (ignored); the plugin's: STEPWARM_SCENARIOS, "
        "STEPWARM_ON_ERROR, STEPWARM_TIME_LIMIT_S, STEPWARM_ROLE, STEPWARM_RANK_TIMEOUT_S, "
        "STEPWARM_STEP_WARN_S, STEPWARM_STEP_TIMEOUT_S, STEPWARM_SKIP_IDLE, "
        "STEPWARM_COMPILE_THREADS, STEPWARM_GEMM_SIZES",
    ]
    # the shared prefix makes no match (STEPWARM_FOO was "close" to STEPWARM_ROLE)
    assert unknown_names({"STEPWARM_FOO": "1"})[0].startswith(
        "STEPWARM_FOO is not a stepwarm variable (ignored); the plugin's: ")


def test_step_watch_settings():
    base = {"STEPWARM_SCENARIOS": "default"}
    s = HookSettings.from_env(base)
    assert (s.step_warn_s, s.step_timeout_s) == (10.0, None)
    s = HookSettings.from_env({**base, "STEPWARM_STEP_WARN_S": "OFF",
                               "STEPWARM_STEP_TIMEOUT_S": "120"})
    assert (s.step_warn_s, s.step_timeout_s) == (None, 120.0)
    with pytest.raises(SettingsError, match=r"^STEPWARM_STEP_TIMEOUT_S='0': out of range; allowed: a number > 0"):
        HookSettings.from_env({**base, "STEPWARM_STEP_TIMEOUT_S": "0"})
    # "off" (the README's word for the default) is a value of both
    s = HookSettings.from_env({**base, "STEPWARM_STEP_TIMEOUT_S": " Off "})
    assert (s.step_warn_s, s.step_timeout_s) == (10.0, None)
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({**base, "STEPWARM_STEP_WARN_S": "never"})
    assert str(e.value) == ("STEPWARM_STEP_WARN_S='never': not a number of seconds; allowed: "
                            "a number > 0 and <= 86400 (e.g. 60), off or unset")
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({**base, "STEPWARM_TIME_LIMIT_S": "off"})
    assert str(e.value) == ("STEPWARM_TIME_LIMIT_S='off': not a number of seconds; allowed: "
                            "a number > 0 and <= 86400 (e.g. 60), or unset")


@pytest.mark.parametrize(("before", "after", "lower"), [
    (8 << 30, (8 << 30) - TOLERANCE_BYTES, False),
    (8 << 30, (8 << 30) - TOLERANCE_BYTES - 1, True),
    (8 << 30, (9 << 30), False),
])
def test_free_memory_lower_after_beyond_the_tolerance_is_flagged(before, after, lower):
    report = flag(MemoryReport(device="cuda:0", free_before=before, free_after=after))
    assert report.lower_after is lower and report.lost == before - after


def test_cpu_rss_growth_is_measured_and_flagged():
    with measured() as m:
        kept = bytearray(3 * TOLERANCE_BYTES)
        kept[::4096] = b"x" * len(kept[::4096])
    assert m.device == "cpu" and m.free_before is None
    assert m.used_after - m.used_before >= 3 * TOLERANCE_BYTES - (8 << 20)
    assert m.peak >= m.used_after and m.lower_after
    del kept


def test_random_state_is_put_back():
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    expected = (torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random())
    torch.manual_seed(7), np.random.seed(7), random.seed(7)
    with random_state_kept():
        torch.rand(100), np.random.rand(50), random.random()
    assert (torch.rand(3).tolist(), np.random.rand(2).tolist(), random.random()) == expected


def test_raised_by_is_the_innermost_frames_package():
    def raise_in_torch():
        torch.zeros(2).view(3)

    with pytest.raises(RuntimeError) as info:
        raise_in_torch()
    # torch raises from C: the innermost Python frame is this test file.
    assert raised_by(info.value) == "other"
    from stepwarm.scenario import load

    with pytest.raises(Exception) as info:
        load("no-such-scenario")
    assert raised_by(info.value) == "stepwarm"
    from vllm.sampling_params import SamplingParams

    with pytest.raises(Exception) as info:
        SamplingParams(temperature=-1.0)
    assert raised_by(info.value) == "vllm"


def test_raised_by_reads_the_frames_module_not_its_folders(tmp_path, monkeypatch):
    """A user's module in folders named stepwarm/vllm/torch is ``other``
    (as is this suite in a clone named ``stepwarm``); a module named
    ``vllm.*`` anywhere is vLLM's."""
    folder = tmp_path / "stepwarm" / "vllm" / "torch"
    folder.mkdir(parents=True)
    (folder / "user_code_42.py").write_text("def boom():\n    raise ValueError('user')\n")
    monkeypatch.syspath_prepend(str(folder))
    import importlib

    user = importlib.import_module("user_code_42")
    with pytest.raises(ValueError) as info:
        user.boom()
    assert raised_by(info.value) == "other"
    scope: dict = {"__name__": "vllm.v1.worker.fake"}
    exec("def boom():\n    raise ValueError('vllm')\n", scope)
    with pytest.raises(ValueError) as info:
        scope["boom"]()
    assert raised_by(info.value) == "vllm"
    assert raised_by(ValueError("never raised")) == "other"


def test_register_ends_an_unguarded_program_with_one_line(monkeypatch):
    from stepwarm import hook
    from stepwarm.settings import SettingsExit

    monkeypatch.setenv("STEPWARM_SCENARIOS", "default")
    monkeypatch.setenv("STEPWARM_ON_ERROR", "later")
    with pytest.raises(SettingsExit) as info:
        hook.register()
    assert isinstance(info.value, SystemExit) and isinstance(info.value, SettingsError)
    assert info.value.code == "stepwarm: STEPWARM_ON_ERROR='later': allowed: raise | warn"
    # every bad variable at once, a line each, in the order the plugin reads them
    monkeypatch.setenv("STEPWARM_ROLE", "bogus")
    monkeypatch.setenv("STEPWARM_TIME_LIMIT_S", "x")
    monkeypatch.setenv("STEPWARM_GEMM_SIZES", "on")
    with pytest.raises(SettingsExit) as info:
        hook.register()
    assert info.value.code.splitlines() == [
        "stepwarm: STEPWARM_ON_ERROR='later': allowed: raise | warn",
        "stepwarm: STEPWARM_TIME_LIMIT_S='x': not a number of seconds; allowed: a number > 0 "
        "and <= 86400 (e.g. 60), or unset",
        "stepwarm: STEPWARM_ROLE='bogus': allowed: auto | prefill | decode | both",
        "stepwarm: STEPWARM_GEMM_SIZES='on': allowed: auto | off"]


def test_the_log_line_says_this_processs_allocator_growth_on_cuda():
    from stepwarm.memory import lower_text

    mib = 1 << 20
    shared = flag(MemoryReport(device="cuda:0", free_before=9000 * mib, free_after=1000 * mib,
                               reserved_before=500 * mib, reserved_after=500 * mib,
                               peak=12256 * mib))
    assert shared.lower_after and lower_text(shared) == (
        "left 8000 MiB less free memory on cuda:0 than it found "
        "(this process's allocator +0 MiB; peak 12256 MiB)")
    cpu = flag(MemoryReport(device="cpu", used_before=100 * mib, used_after=300 * mib, peak=400 * mib))
    assert lower_text(cpu) == ("left this process 200 MiB more resident memory on cpu than "
                               "it found (peak 400 MiB)")


def test_on_the_cpu_the_plugin_says_how_much_the_process_grew_after_its_warmup(caplog):
    """What stepwarm's warmup left is said on the CPU too, in bytes (a new
    user's trial: only CUDA had a line; RSS had grown 33.6 MB, unsaid)."""
    import logging
    from types import SimpleNamespace

    from stepwarm.hook import _give_back_memory

    mib = 2**20
    memory = MemoryReport(device="cpu", used_before=1860 * mib, used_after=1894 * mib)
    worker = SimpleNamespace()
    with caplog.at_level(logging.INFO, logger="vllm.stepwarm"):
        _give_back_memory(worker, "stepwarm", memory)
    assert worker.stepwarm_memory is memory
    assert [r.getMessage() for r in caplog.records] == [
        "stepwarm: after stepwarm's warmup the process's RSS is 34 MiB more than vLLM left it "
        "(CPU: lazy imports, allocator caches and kernels loaded on a first use; the KV cache "
        "was allocated before and keeps its size)"]


def test_a_tiny_interval_says_seconds_that_tell_its_lines_apart():
    """The fourth trial (issue 42 item 15): at STEPWARM_STEP_WARN_S=0.001 the
    thread wakes each millisecond and "%.1f" made 100 lines alike."""
    from stepwarm.watchdog import seconds_text

    assert [seconds_text(1.23456, w) for w in (10.0, 0.1, 0.05, 0.001, None)] == [
        "1.2", "1.2", "1.23", "1.235", "1.2"]


def test_the_logging_config_directory_is_removed_when_the_command_ends(tmp_path):
    """The fourth trial: each CLI call left a /tmp/stepwarm-log-* directory."""
    code = ("import os; from stepwarm.console import route_vllm_log; route_vllm_log(0); "
            "print(os.path.dirname(os.environ['VLLM_LOGGING_CONFIG_PATH']))")
    # (a test before may have routed this process's log: its config path is in the environment)
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_CONFIG_PATH"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120, env=env).stdout.strip()
    assert os.path.basename(out).startswith("stepwarm-log-") and not os.path.exists(out)
