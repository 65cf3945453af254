"""stepwarm: scheduler-realistic warmup steps for vLLM workers.

Data flows one way: :mod:`~stepwarm.profile` (runner facts) ->
:mod:`~stepwarm.scenario` (files) -> :mod:`~stepwarm.plan` (steps, with block
ids from :mod:`~stepwarm.blocks`) -> :mod:`~stepwarm.compile` (vLLM objects) ->
:mod:`~stepwarm.driver` (execute_model / sample_tokens) -> report.
Worker code calls :func:`stepwarm.hook.warmup`.
"""

from stepwarm.version import __version__

__all__ = ["__version__"]
