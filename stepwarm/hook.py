"""Run stepwarm scenarios inside a vLLM worker's own start-up.

Two ways in:

* :func:`warmup` — call it from worker code after the KV cache exists (e.g.
  at the end of ``compile_or_warm_up_model``).
* The vLLM plugin :func:`register` (entry point ``vllm.general_plugins``,
  installed with stepwarm). It does nothing unless ``STEPWARM_SCENARIOS`` is
  set (comma-separated names or files); then every worker class's
  ``compile_or_warm_up_model`` runs those scenarios right after vLLM's own
  warmup, in every worker process, and keeps the reports on the worker as
  ``worker.stepwarm_reports``. An invalid scenario or a failing step raises
  out of ``compile_or_warm_up_model``, so the engine does not start half
  warmed (the runner is cleaned up first).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

from stepwarm.driver import RunReport, drive
from stepwarm.profile import read_profile

#: A child of vLLM's logger, so the lines appear in vLLM's start-up log.
logger = logging.getLogger("vllm.stepwarm")

#: Environment variable naming the scenarios the plugin runs.
ENV_SCENARIOS = "STEPWARM_SCENARIOS"
#: Worker classes whose ``compile_or_warm_up_model`` the plugin wraps.
WORKER_CLASSES = (
    "vllm.v1.worker.gpu_worker:Worker",
    "vllm.v1.worker.cpu_worker:CPUWorker",
)


def warmup(worker: Any, scenarios: Sequence[str] = ("default",)) -> list[RunReport]:
    """Run ``scenarios`` (built-in names or scenario file paths) on ``worker``.

    Every scenario is expanded and checked against the worker's profile
    before the first step runs; scenarios whose needs the runner does not
    meet are skipped (their report's ``skipped`` says why).

    Returns:
        One :class:`~stepwarm.driver.RunReport` per scenario.

    Raises:
        stepwarm.scenario.ScenarioError: a scenario is invalid (nothing ran).
        stepwarm.driver.StepFailed: a step raised (the runner was cleaned up).
    """
    from stepwarm.scenario import plans_for

    profile = read_profile(worker)
    plans = plans_for(list(scenarios), profile)
    reports = []
    for plan in plans:
        report = drive(worker, plan, profile)
        logger.info(
            "stepwarm: %s: %s", plan.name,
            f"skipped ({report.skipped})" if report.skipped
            else f"{len(report.steps)} steps in {report.wall_ms:.0f} ms",
        )
        reports.append(report)
    return reports


def _scenario_names() -> list[str]:
    """The scenarios ``STEPWARM_SCENARIOS`` names (comma-separated), in order."""
    return [s.strip() for s in os.environ.get(ENV_SCENARIOS, "").split(",") if s.strip()]


def _wrap(cls: type) -> None:
    original = cls.__dict__.get("compile_or_warm_up_model")
    if original is None or getattr(original, "_stepwarm", False):
        return

    @functools.wraps(original)
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A wrapped subclass may call a wrapped base class's method: only the
        # outermost call runs the scenarios.
        outermost = not getattr(self, "_stepwarm_in_warmup", False)
        self._stepwarm_in_warmup = True
        try:
            result = original(self, *args, **kwargs)
        finally:
            if outermost:
                self._stepwarm_in_warmup = False
        names = _scenario_names()
        if outermost and names:
            # Kept on the worker so that callers (and tests) can read them.
            self.stepwarm_reports = warmup(self, names)
        return result

    compile_or_warm_up_model._stepwarm = True  # type: ignore[attr-defined]
    cls.compile_or_warm_up_model = compile_or_warm_up_model  # type: ignore[attr-defined]


def register() -> None:
    """vLLM general plugin: wrap the worker classes' warmup when
    ``STEPWARM_SCENARIOS`` is set. Safe to call more than once."""
    if not _scenario_names():
        return
    import importlib

    for path in WORKER_CLASSES:
        module, _, name = path.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        _wrap(cls)
