"""The one error a scenario raises: :class:`ScenarioError`, naming file, line, step and field.

A file with several faults raises one :class:`ScenarioError` holding each
(:attr:`ScenarioError.errors`, at most :data:`MAX_ERRORS` shown), so that one
``stepwarm check`` shows them all; :func:`joined` is the text both scenario
and traffic files use for such a list.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

#: Most errors one file's message lists; the rest are counted.
MAX_ERRORS = 20


def joined(messages: Sequence[str], file: str) -> str:
    """``messages`` one a line, the first :data:`MAX_ERRORS`, then how many more."""
    shown = list(messages[:MAX_ERRORS])
    if len(messages) > MAX_ERRORS:
        shown.append(f"{file}: {len(messages) - MAX_ERRORS} more error(s) not shown "
                     f"(at most {MAX_ERRORS} are listed)")
    return "\n".join(shown)


#: TOML's name of each value type a scenario file can hold.
_TOML_TYPES = {bool: "boolean", int: "integer", float: "float", str: "string",
               list: "array", dict: "table"}


def toml_value(value: Any) -> str:
    """``value`` as a scenario file can spell it, for messages: ``true`` (not
    Python's ``True``), arrays and inline tables in TOML's form, strings as
    literal strings (``'x'``, TOML's single-quoted form)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return repr(value)


def got(value: Any) -> str:
    """``got integer 5`` / ``got boolean true``: what a wrong value is, in TOML's words."""
    return f"got {_TOML_TYPES.get(type(value), type(value).__name__)} {toml_value(value)}"


def unknown_request(name: str, declared: Sequence[str]) -> tuple[str, str]:
    """What a step selecting an undeclared request is told, and what is
    allowed: ``("unknown request 'x' (did you mean 'y'?)", "names declared
    under [requests]: y, z")`` (the loader and the expander say the same)."""
    close = difflib.get_close_matches(name, list(declared), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (f"unknown request {name!r}{hint}",
            "names declared under [requests]: " + (", ".join(declared) or "none"))


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names file, line, step and field.

    Attributes:
        file: the scenario file (or name).
        line: 1-based line in the file, or None where it cannot be told.
        step: index of the ``[[steps]]`` entry (from 0), or None.
        field: the TOML key, or None.
        errors: every error found in the file, this one's first (itself
            alone for a single error); the message lists them one a line.
    """

    def __init__(self, message: str, *, file: str = "", line: int | None = None,
                 step: int | None = None, field: str | None = None,
                 errors: Sequence[ScenarioError] = (), partial: Any = None):
        super().__init__(message)
        self.file, self.line, self.step, self.field = file, line, step, field
        self.errors: tuple[ScenarioError, ...] = tuple(errors) or (self,)
        #: no runner profile can mend it: a literal value out of its field's
        #: fixed range (``prompt = -5``); set by the expander, read by
        #: :func:`~stepwarm.scenario.expand.profile_free_errors`
        self.profile_free = False
        #: set by the loader where only some ``[[steps]]`` entries broke the
        #: format: the scenario without them, so that the expander can still
        #: check the rest against a profile (a LoadedScenario; else None)
        self.partial = partial

    @classmethod
    def of(cls, errors: Sequence[ScenarioError], *, note: str = "",
           partial: Any = None) -> ScenarioError:
        """One error for all of ``errors`` (not empty): the first's location,
        every message, then ``note`` (a line that is no error of its own: what
        could not be checked)."""
        if len(errors) == 1 and not note and partial is None:
            return errors[0]
        first = errors[0]
        text = joined([str(e) for e in errors], first.file)
        return cls(text + (f"\n{note}" if note else ""), file=first.file, line=first.line,
                   step=first.step, field=first.field,
                   errors=[e for one in errors for e in one.errors], partial=partial)


class ScenarioExit(ScenarioError, SystemExit):
    """A :class:`ScenarioError` raised out of the plugin's ``register()``.

    As ``stepwarm.settings.SettingsExit``: vLLM's ``load_general_plugins``
    calls ``register()`` without a ``try``, so an unguarded ``vllm serve`` /
    ``vllm.LLM(...)`` ends with this error's text (``stepwarm: FILE:LINE:
    ...``) on stderr and exit status 1, no traceback; code that catches
    ``ValueError`` or ``ScenarioError`` still catches it.
    """

    def __init__(self, error: ScenarioError):
        super().__init__(str(error), file=error.file, line=error.line, step=error.step,
                         field=error.field, errors=error.errors, partial=error.partial)
        self.code = f"stepwarm: {error}"
