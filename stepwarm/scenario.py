"""Scenario resolution (placeholder until the scenario file format lands)."""

from __future__ import annotations

from stepwarm.plan import Plan
from stepwarm.profile import RunnerProfile
from stepwarm.sequences import default_plan


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names file, step and field."""


def plans_for(names: list[str], profile: RunnerProfile) -> list[Plan]:
    """Expand scenario names or file paths into plans for ``profile``.

    Raises:
        ScenarioError: an unknown name.
    """
    plans = []
    for name in names:
        if name != "default":
            raise ScenarioError(f"unknown scenario {name!r} (known: default)")
        plans.append(default_plan(profile))
    return plans
