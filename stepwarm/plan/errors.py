"""Why a step is refused, as data: :class:`PlanError`, and the reasons the
scheduler's limits give (shared with the scenario expander, which checks the
same limits before it builds)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stepwarm.profile import RunnerProfile


class PlanError(ValueError):
    """A step the scheduler would never produce, as data: ``step`` (the step
    index, or None for a declaration), ``request`` (the request id it is
    about, or None), ``field`` (what was wrong: "tokens", "blocks", ...) and
    ``reason`` (what the scheduler says, and what is allowed), and ``limit``:
    the scheduler setting that refused it ("max_num_seqs", ...), or None.
    ``str()``
    is ``"step N: reason"``; callers that show it their own way (the
    scenario expander) read the fields."""

    def __init__(self, reason: str, *, step: int | None = None, field: str | None = None,
                 request: str | None = None, limit: str | None = None):
        super().__init__(reason if step is None else f"step {step}: {reason}")
        self.limit = limit
        self.reason = reason
        self.step = step
        self.field = field
        self.request = request


def too_many_seqs(n: int, p: RunnerProfile) -> str:
    """Why ``n`` requests cannot be scheduled in one step (``max_num_seqs``)."""
    return f"{n} requests scheduled but max_num_seqs is {p.max_num_seqs}"


def over_token_budget(total: int, p: RunnerProfile, rows: int = 0, slots: int = 0) -> str:
    """Why ``total`` tokens of ``rows`` requests, each keeping ``slots``
    draft slots, cannot be scheduled in one step (``max_num_batched_tokens``)."""
    if not slots:
        return f"{total} tokens scheduled but max_num_batched_tokens is {p.max_num_batched_tokens}"
    return (f"{total} tokens scheduled + {rows} requests x {slots} draft slot(s) (draft_slots, "
            f"vLLM's max_num_new_slots_for_drafting) = {total + rows * slots} but "
            f"max_num_batched_tokens is {p.max_num_batched_tokens}")


def bad_drafts(rid: str, k: int, p: RunnerProfile) -> str | None:
    """Why request ``rid`` cannot be decoded with ``k`` draft tokens on this
    runner (whatever its state), or None."""
    if k < 0:
        return f"request {rid!r}: draft tokens must be >= 0, got {k}"
    if k and not p.has_speculator:
        return (f"request {rid!r}: {k} draft token(s) but the runner has no "
                "speculator (num_speculative_steps is 0)")
    if k > p.num_speculative_steps:
        return (f"request {rid!r}: {k} draft tokens exceed num_speculative_steps "
                f"{p.num_speculative_steps}")
    return None

