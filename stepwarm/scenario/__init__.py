"""Scenario files: the format, the loader, the needs, and the expansion to plans.

A scenario is one TOML file (see ``scenarios/README.md``). The package is
split the way data flows through it:

- :mod:`~stepwarm.scenario.format`: :class:`ScenarioFile` and its step models,
  the single source of the format (validation, ``stepwarm schema``);
- :mod:`~stepwarm.scenario.load`: built-in names, reading TOML, and turning
  pydantic error locations into ``file:line: step N: field`` messages;
- :mod:`~stepwarm.scenario.sweeps`: the ``buckets`` / ``range`` / ``values`` /
  ``pow2_classes`` forms of a size;
- :mod:`~stepwarm.scenario.sampling`: sampling presets and tables, checked with
  vLLM's own ``SamplingParams``;
- :mod:`~stepwarm.scenario.needs`: whether a runner meets ``needs`` / ``requires``;
- :mod:`~stepwarm.scenario.expand`: a scenario and a
  :class:`~stepwarm.profile.RunnerProfile` become a :class:`~stepwarm.plan.Plan`;
- :mod:`~stepwarm.scenario.errors`: :class:`ScenarioError`, the one error
  all of them raise.
"""

from stepwarm.expressions import MAX_LEN
from stepwarm.profile import tiny_profile
from stepwarm.scenario.errors import MAX_ERRORS, ScenarioError
from stepwarm.scenario.expand import check, expand, plans_for
from stepwarm.scenario.format import (
    MAX_COUNT,
    MAX_EXPANDED,
    MAX_FILE_BYTES,
    MAX_NESTING,
    MAX_REQUESTS,
    MAX_STARTUP_STEPS,
    MAX_STEPS,
    MAX_WORD,
    ScenarioFile,
    json_schema,
)
from stepwarm.scenario.load import (
    SETS,
    LoadedScenario,
    builtin_dir,
    builtin_names,
    load,
    loads,
    resolve_names,
    same_files,
)
from stepwarm.scenario.needs import unmet_need, unmet_requirement

__all__ = [
    "MAX_COUNT", "MAX_ERRORS", "MAX_EXPANDED", "MAX_FILE_BYTES", "MAX_LEN", "MAX_NESTING",
    "MAX_REQUESTS", "MAX_STARTUP_STEPS", "MAX_STEPS", "MAX_WORD", "SETS", "LoadedScenario", "ScenarioError", "ScenarioFile",
    "builtin_dir", "builtin_names", "check", "expand", "json_schema", "load", "loads",
    "plans_for", "resolve_names", "same_files", "tiny_profile", "unmet_need", "unmet_requirement",
]
