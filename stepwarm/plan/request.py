"""A request on the scheduler's side: its state across steps
(:class:`LiveRequest`, what vLLM's ``v1/request.py`` ``Request`` tracks for
the scheduler)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stepwarm.plan.output import PlannedRequest


@dataclass(slots=True)
class LiveRequest:
    """A request's state across steps (scheduler's side)."""

    decl: PlannedRequest
    #: ``decl.prompt_len`` and whether ``decl.kind`` is "pool", kept here:
    #: a decode row reads them and nothing else of ``decl``, so the loop
    #: over a step's rows does not reach one more object (and its dict).
    prompt_len: int
    pooling: bool
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    state: Literal["waiting", "running", "preempted", "finished"] = "waiting"
    seen: bool = False  # runner has been sent NewRequestData
    resuming: bool = False  # resumed, still recomputing prompt + outputs
    #: The last ``(req_id, held counts)`` of a step's ``held_blocks``,
    #: shared by the next steps that answer the row from the same counts.
    held_pair: tuple[str, tuple[int, ...]] | None = None

    @property
    def num_tokens(self) -> int:
        return self.decl.prompt_len + self.num_output_tokens

