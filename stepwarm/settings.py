"""HookSettings: what the start-up hook reads from the environment.

The plugin (:mod:`stepwarm.hook`) is configured by environment variables only,
because ``vllm serve`` passes nothing else to a general plugin and every
worker process inherits the environment:

========================  =====================================  ==============
variable                  values                                 default
========================  =====================================  ==============
``STEPWARM_SCENARIOS``    comma-separated built-in names / files (unset/empty: off)
``STEPWARM_ON_ERROR``     ``raise`` | ``warn``                   ``raise``
``STEPWARM_TIME_LIMIT_S`` seconds > 0                            no limit
``STEPWARM_ROLE``         ``auto`` | ``prefill`` | ``decode`` |  ``auto``
                          ``both``
``STEPWARM_RANK_TIMEOUT_S`` seconds > 0                          ``300``
``STEPWARM_STEP_WARN_S``  seconds > 0, or ``off``                ``10``
``STEPWARM_STEP_TIMEOUT_S`` seconds > 0, or ``off``             no limit
``STEPWARM_SKIP_IDLE``    ``0`` | ``1``                          ``0``
``STEPWARM_COMPILE_THREADS`` ``auto`` | ``off`` | 1 … 64         ``auto``
``STEPWARM_GEMM_SIZES``   ``auto`` | ``off``                      ``auto``
========================  =====================================  ==============

A variable set to the empty string counts as unset; one of blanks only
(``" "``) is refused with one line. Any other ``STEPWARM_*`` name in the environment that stepwarm does not read
gets a did-you-mean warning (:func:`unknown_names`); see docs/plugin.md.

Parsing is pure (no vLLM, no torch) so that a bad value fails start-up in
``register()`` with one line naming the variable and the allowed values.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

ENV_SCENARIOS = "STEPWARM_SCENARIOS"
ENV_ON_ERROR = "STEPWARM_ON_ERROR"
ENV_TIME_LIMIT_S = "STEPWARM_TIME_LIMIT_S"
ENV_ROLE = "STEPWARM_ROLE"
ENV_RANK_TIMEOUT_S = "STEPWARM_RANK_TIMEOUT_S"
ENV_STEP_WARN_S = "STEPWARM_STEP_WARN_S"
ENV_STEP_TIMEOUT_S = "STEPWARM_STEP_TIMEOUT_S"
ENV_SKIP_IDLE = "STEPWARM_SKIP_IDLE"
ENV_COMPILE_THREADS = "STEPWARM_COMPILE_THREADS"
ENV_GEMM_SIZES = "STEPWARM_GEMM_SIZES"
#: Every ``STEPWARM_*`` variable stepwarm reads: the hook's, and those of the
#: zoo (``STEPWARM_CACHE``), the test suites and nox.
KNOWN_NAMES: tuple[str, ...] = (
    ENV_SCENARIOS, ENV_ON_ERROR, ENV_TIME_LIMIT_S, ENV_ROLE,
    ENV_RANK_TIMEOUT_S, ENV_STEP_WARN_S, ENV_STEP_TIMEOUT_S, ENV_SKIP_IDLE,
    ENV_COMPILE_THREADS, ENV_GEMM_SIZES, "STEPWARM_CACHE_DIR", "STEPWARM_CACHE", "STEPWARM_TORCH_INDEX", "STEPWARM_SHARDS", "STEPWARM_SHARD_EXAMPLES",
    "STEPWARM_LANE_DRY_RUN", "STEPWARM_LANE_RECORD", "STEPWARM_TEST_FAULT",
    "STEPWARM_TEST_HANG", "STEPWARM_TEST_RAY_CPU",
    "STEPWARM_RECORD", "STEPWARM_RECORD_MAX_MB",  # stepwarm.record
)

OnError = Literal["raise", "warn"]
#: A worker's role in disaggregated serving. ``both``: prefill and decode
#: (no KV transfer, or ``kv_role = "kv_both"``).
Role = Literal["prefill", "decode", "both"]
ON_ERROR_VALUES: tuple[str, ...] = ("raise", "warn")
SKIP_IDLE_VALUES: tuple[str, ...] = ("0", "1")
GEMM_SIZES_VALUES: tuple[str, ...] = ("auto", "off")
ROLE_VALUES: tuple[str, ...] = ("auto", "prefill", "decode", "both")
#: ``KVTransferConfig.kv_role`` -> the role stepwarm plans for.
KV_ROLE_TO_ROLE: dict[str, Role] = {
    "kv_producer": "prefill",
    "kv_consumer": "decode",
    "kv_both": "both",
}
DEFAULT_RANK_TIMEOUT_S = 300.0
#: Most compile threads ``STEPWARM_COMPILE_THREADS`` takes.
MAX_COMPILE_THREADS = 64
#: Seconds a step runs before the watchdog logs it (and again every as many
#: seconds): long enough that no step of a healthy CPU or GPU start-up hits
#: it, short enough that a hang is named while someone still watches.
DEFAULT_STEP_WARN_S = 10.0


class SettingsError(ValueError):
    """An environment variable with a value the hook does not accept; the
    message is one line naming the variable, the value and what is allowed."""


class SettingsExit(SettingsError, SystemExit):
    """A :class:`SettingsError` raised out of the plugin's ``register()``.

    vLLM's ``load_general_plugins`` calls ``register()`` without a ``try``, so
    an exception from it ends ``vllm serve`` / ``vllm.LLM(...)`` with its
    traceback. Being a ``SystemExit`` too, this one ends an unguarded program
    with its line on stderr, one a bad variable (``stepwarm: STEPWARM_ON_ERROR='x':
    allowed: raise | warn``), and exit status 1, no traceback; code that catches
    ``ValueError`` or ``SettingsError`` still catches it.
    """

    def __init__(self, error: SettingsError):
        super().__init__(str(error))
        self.code = "\n".join(f"stepwarm: {line}" for line in str(error).splitlines())


#: The longest time a variable may give (one day, seconds): timedelta and
#: gloo timeouts overflow on much larger values.
MAX_SECONDS = 86400.0


def _seconds(env: Mapping[str, str], name: str, *, off: bool = False) -> float | None:
    """The seconds ``name`` gives (None: unset or empty; with ``off``, also
    the word ``off``), else :class:`SettingsError` naming what is allowed."""
    given = env.get(name, "")
    if given == "":  # empty counts as unset
        return None
    raw = given.strip() or given  # blank (spaces only) is refused, quoted as given
    if off and raw.lower() == "off":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0 or value > MAX_SECONDS:
        what = ("not a number of seconds" if not math.isfinite(value)
                else "out of range" if value <= 0 else "too long")
        raise SettingsError(
            f"{name}={raw!r}: {what}; allowed: a number > 0 and <= "
            f"{MAX_SECONDS:g} (e.g. 60), {'off or unset' if off else 'or unset'}")
    return value


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    given = env.get(name, "")
    if given == "":  # empty counts as unset
        return default
    raw = given.strip() or given  # blank (spaces only) is refused, quoted as given
    if raw.lower() not in allowed:
        raise SettingsError(f"{name}={raw!r}: allowed: {' | '.join(allowed)}")
    return raw.lower()


def _threads(env: Mapping[str, str], name: str) -> int | None:
    """``name`` as a thread count: None for ``auto`` (or unset/empty), 0 for
    ``off``, else 1 … :data:`MAX_COMPILE_THREADS`; :class:`SettingsError`
    otherwise."""
    given = env.get(name, "")
    raw = given.strip() or given
    if given == "" or raw.lower() == "auto":
        return None
    if raw.lower() == "off":
        return 0
    # ASCII digits only: str.isdigit() is also true of '²', which int() refuses.
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_COMPILE_THREADS:
        return int(raw)
    raise SettingsError(f"{name}={raw!r}: allowed: auto | off | a whole number from 1 to "
                        f"{MAX_COMPILE_THREADS}")


@dataclass(frozen=True)
class HookSettings:
    """The hook's configuration, parsed from the environment.

    Attributes:
        scenarios: scenario names or files, in order (empty: the hook is off).
        on_error: ``raise`` — a bad scenario or a failed step fails start-up
            (after cleanup); ``warn`` — it is logged and the engine serves.
        time_limit_s: seconds from the start of stepwarm's run after which no
            further scenario starts (those are reported as skipped); None: no
            limit. A scenario already running is not interrupted.
        role: ``auto`` reads ``kv_transfer_config.kv_role`` off the worker;
            otherwise the role the scenarios are filtered by.
        rank_timeout_s: seconds a rank waits for the other ranks to report a
            step before it gives up (see :mod:`stepwarm.ranks`).
        step_warn_s: seconds a step runs before the watchdog logs it, and the
            interval of the repeats (:mod:`stepwarm.watchdog`); None: off.
        step_timeout_s: seconds after which a step that is still running
            fails start-up, under either ``on_error`` (a running step cannot
            be cancelled safely); None: no limit.
        skip_idle: skip the scenarios that compiled nothing at the last start
            with the same configuration (:mod:`stepwarm.idle_record`).
        compile_threads: threads compiling the sampler's Triton kernel
            variants while the steps go on (:mod:`stepwarm.deferred_compile`);
            None: ``auto`` (the cores shared by the ranks on this host, at most
            8); 0: off.
        gemm_sizes: after the scenarios (before them with ``skip_idle``),
            run the model's linear GEMMs at the token counts steps run
            eagerly (:mod:`stepwarm.gemm_sizes`; ``auto``: on a CUDA device);
            False: ``off``.
        startup_work: the start-up's work around the scenarios: the
            sampler's Triton variants vLLM's JIT warmup leaves out compiled
            before them, one compile pool for all of them (waited for at
            the end), and the allocator's cache given back after. No
            variable sets it; ``stepwarm run`` turns it off, so that each
            scenario's steps compile what they launch and its time holds the
            wait for them, as its table shows.
    """

    scenarios: tuple[str, ...] = ()
    on_error: OnError = "raise"
    time_limit_s: float | None = None
    role: Literal["auto", "prefill", "decode", "both"] = "auto"
    rank_timeout_s: float = DEFAULT_RANK_TIMEOUT_S
    step_warn_s: float | None = DEFAULT_STEP_WARN_S
    step_timeout_s: float | None = None
    skip_idle: bool = False
    compile_threads: int | None = None
    gemm_sizes: bool = True
    startup_work: bool = True

    @property
    def enabled(self) -> bool:
        """Whether any scenario is named (the hook does nothing otherwise)."""
        return bool(self.scenarios)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> HookSettings:
        """Parse the ``STEPWARM_*`` variables of ``env`` (default ``os.environ``).

        Without ``STEPWARM_SCENARIOS`` (unset or empty) the hook is off and
        the other variables are not read (their values cannot break a vLLM
        start-up). A variable set to the empty string counts as unset; one
        set to blanks only (``" "``, and for ``STEPWARM_SCENARIOS`` commas
        too) is refused: it is a mistake, and silence would hide it.

        Raises:
            SettingsError: a variable has a value outside the allowed ones,
                or is blank.
        """
        env = os.environ if env is None else env
        given = env.get(ENV_SCENARIOS, "")
        scenarios = scenario_names(given)
        if not given:
            # The plugin is off: the other variables are not read.
            return cls()
        errors: list[str] = []
        if not scenarios:
            # Set, but blank (" ", ","): a mistake, not a way to turn the plugin
            # off; the other variables are read too, every bad one told at once.
            errors.append(
                f"{ENV_SCENARIOS}={given!r}: names no scenario; allowed: comma-separated "
                "built-in names, .toml paths or all; unset or empty: the plugin is off")

        def read(parse: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return parse(*args, **kwargs)
            except SettingsError as e:  # every bad variable told at once
                errors.append(str(e))
                return None

        warn_off = env.get(ENV_STEP_WARN_S, "").strip().lower() == "off"
        values = dict(
            on_error=read(_choice, env, ENV_ON_ERROR, ON_ERROR_VALUES, "raise"),
            time_limit_s=read(_seconds, env, ENV_TIME_LIMIT_S),
            role=read(_choice, env, ENV_ROLE, ROLE_VALUES, "auto"),
            rank_timeout_s=read(_seconds, env, ENV_RANK_TIMEOUT_S) or DEFAULT_RANK_TIMEOUT_S,
            step_warn_s=(None if warn_off else read(_seconds, env, ENV_STEP_WARN_S, off=True)
                         or DEFAULT_STEP_WARN_S),
            step_timeout_s=read(_seconds, env, ENV_STEP_TIMEOUT_S, off=True),
            skip_idle=read(_choice, env, ENV_SKIP_IDLE, SKIP_IDLE_VALUES, "0") == "1",
            compile_threads=read(_threads, env, ENV_COMPILE_THREADS),
            gemm_sizes=read(_choice, env, ENV_GEMM_SIZES, GEMM_SIZES_VALUES, "auto") == "auto",
        )
        if errors:
            raise SettingsError("\n".join(errors))
        return cls(scenarios=scenarios, **values)


def scenario_names(given: str) -> tuple[str, ...]:
    """The names a ``STEPWARM_SCENARIOS`` value lists (comma-separated, blanks dropped)."""
    return tuple(s.strip() for s in given.split(",") if s.strip())


def compile_threads(env: Mapping[str, str] | None = None) -> int:
    """``STEPWARM_COMPILE_THREADS`` for one process (``stepwarm run``): its
    number, 0 for ``off``, the cores for ``auto`` (at most 8)."""
    from stepwarm.deferred_compile import default_threads

    threads = _threads(os.environ if env is None else env, ENV_COMPILE_THREADS)
    return default_threads() if threads is None else threads


def unknown_names(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``STEPWARM_*`` name in ``env`` that stepwarm does not
    read, with the closest known name (``difflib.get_close_matches``) when
    there is one: ``STEPWARM_ONERROR is not a stepwarm variable (ignored);
    did you mean STEPWARM_ON_ERROR?``.

    Args:
        env: the environment (default ``os.environ``).

    Returns:
        The warnings, sorted by name (empty when every name is known).
    """
    env = os.environ if env is None else env
    out = []
    for name in sorted(n for n in env if n.upper().startswith("STEPWARM_")):
        if name in KNOWN_NAMES:
            continue
        # compared past the shared prefix (else STEPWARM_FOO is "close" to STEPWARM_ROLE)
        tails = {k.removeprefix("STEPWARM_"): k for k in KNOWN_NAMES}
        close = [tails[t] for t in difflib.get_close_matches(
            name.upper().removeprefix("STEPWARM_"), list(tails), n=1, cutoff=0.75)]
        out.append(f"{name} is not a stepwarm variable (ignored)"
                   + (f"; did you mean {close[0]}?" if close else
                      f"; the plugin's: {', '.join(KNOWN_NAMES[:10])}"))
    return out


def role_of_kv_role(kv_role: str | None) -> Role:
    """The role for a ``KVTransferConfig.kv_role`` (None: no KV transfer ->
    ``both``). ``kv_consumer`` (a decode-only worker) -> ``decode``,
    ``kv_producer`` -> ``prefill``."""
    return KV_ROLE_TO_ROLE.get(kv_role or "kv_both", "both")


ENV_RECORD = "STEPWARM_RECORD"
ENV_RECORD_MAX_MB = "STEPWARM_RECORD_MAX_MB"
#: ``STEPWARM_RECORD_MAX_MB``'s default: the size (MiB) at which a recording stops.
DEFAULT_RECORD_MAX_MB = 256


@dataclass(frozen=True)
class RecordSettings:
    """``STEPWARM_RECORD=PATH`` (:mod:`stepwarm.record`): where the scheduler's
    steps are recorded (None: off), and the size in bytes at which recording
    stops (``STEPWARM_RECORD_MAX_MB``, MiB, default
    :data:`DEFAULT_RECORD_MAX_MB`). Read apart from ``STEPWARM_SCENARIOS``:
    recording is on or off whatever the scenarios."""

    path: str | None = None
    max_bytes: int = DEFAULT_RECORD_MAX_MB << 20

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RecordSettings:
        """Parse ``STEPWARM_RECORD`` and ``STEPWARM_RECORD_MAX_MB``.

        Raises:
            SettingsError: a blank path, a path no file can be appended to
                (:func:`stepwarm.output_path.unwritable`: a missing directory,
                ``/proc``, a directory), or a cap that is not a whole number
                of MiB from 1 to 1048576 (every bad variable, one a line).
        """
        env = os.environ if env is None else env
        path = env.get(ENV_RECORD, "")
        errors = []  # recording off (path ""): a bad cap is still said
        if path and not path.strip():
            errors.append(f"{ENV_RECORD}={path!r}: blank; allowed: a file path (the "
                          "recording is appended to it); unset or empty: off")
        elif path and (why := _record_path_refusal(path)):
            errors.append(f"{ENV_RECORD}={path!r}: {why}" + (
                "" if "allowed:" in why else "; allowed: a file path this process can "
                "append to"))
        given = env.get(ENV_RECORD_MAX_MB, "")
        raw = given.strip()
        max_mb = DEFAULT_RECORD_MAX_MB
        if given and not raw:  # as every other STEPWARM_* variable: blank is refused
            errors.append(f"{ENV_RECORD_MAX_MB}={given!r}: blank; allowed: a whole number of "
                          f"MiB from 1 to {1 << 20}; unset or empty: {DEFAULT_RECORD_MAX_MB}")
        elif raw:
            if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= 1 << 20:
                max_mb = int(raw)
            else:
                errors.append(f"{ENV_RECORD_MAX_MB}={raw!r}: allowed: a whole number of MiB "
                              f"from 1 to {1 << 20}; unset: {DEFAULT_RECORD_MAX_MB}")
        if errors:
            raise SettingsError("\n".join(errors))
        return cls(path=path, max_bytes=max_mb << 20) if path else cls()


def _record_path_refusal(path: str) -> str | None:
    """Why the recording cannot be appended to ``path`` (None: it can, or it
    is something other than a regular file, such as a pipe, which is opened
    only when the first step is recorded)."""
    from pathlib import Path

    from stepwarm.output_path import unwritable

    p = Path(path)
    if p.exists() and not p.is_file() and not p.is_dir():
        return None
    return unwritable(p)
