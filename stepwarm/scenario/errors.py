"""The one error a scenario raises: :class:`ScenarioError`, naming file, line, step and field."""

from __future__ import annotations


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names file, line, step and field.

    Attributes:
        file: the scenario file (or name).
        line: 1-based line in the file, or None where it cannot be told.
        step: index of the ``[[steps]]`` entry (from 0), or None.
        field: the TOML key, or None.
    """

    def __init__(self, message: str, *, file: str = "", line: int | None = None,
                 step: int | None = None, field: str | None = None):
        super().__init__(message)
        self.file, self.line, self.step, self.field = file, line, step, field
