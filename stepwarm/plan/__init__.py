"""Plans: the steps stepwarm sends, as pure data (:mod:`.output`), and the
planner that builds them in the scheduler's phases (:mod:`.builder`).
Nothing here imports vLLM."""

from stepwarm.plan.builder import PlanBuilder, collector_paused, max_prompt_len
from stepwarm.plan.errors import PlanError, bad_drafts, over_token_budget, too_many_seqs
from stepwarm.plan.output import (
    REQ_ID_PREFIX,
    Plan,
    PlannedRequest,
    PlannedStep,
    ScheduledRequest,
    StepKind,
)

__all__ = [
    "REQ_ID_PREFIX", "Plan", "PlanBuilder", "PlanError", "PlannedRequest", "PlannedStep",
    "ScheduledRequest", "StepKind", "bad_drafts", "collector_paused", "max_prompt_len",
    "over_token_budget", "too_many_seqs",
]
