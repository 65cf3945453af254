"""Finding and reading scenario files: built-in names, the TOML loader, and the
line index that turns pydantic error locations into file:line: step: field messages."""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import dataclasses
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from stepwarm.files import MAX_INT_DIGITS, FileTooLarge, NotUtf8, read_text_capped
from stepwarm.scenario.errors import ScenarioError, toml_value, unknown_request
from stepwarm.scenario.sampling import SamplingTable
from stepwarm.scenario.sweeps import names_unchecked
from stepwarm.scenario.format import (
    MAX_FILE_BYTES,
    MAX_NESTING,
    Need,
    RequestSpec,
    SELECTOR_FIELDS,
    STEP_MODELS,
    ScenarioFile,
    _NAME_HELP,
    _REQUEST_NAME,
    _SELECTOR,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def builtin_dir() -> Any:
    """The packaged ``stepwarm.scenarios`` directory (a Traversable).

    When stepwarm runs from a checkout (its ``scenarios/`` beside the
    ``stepwarm`` package), that checkout's directory, also when another
    checkout is installed in editable mode (whose ``stepwarm.scenarios``
    would point at the other tree) or none is installed (e.g. on a GPU box).
    """
    checkout = _checkout_scenarios()
    if (checkout / "default.toml").is_file():
        return checkout
    try:
        return resources.files("stepwarm.scenarios")
    except ModuleNotFoundError:
        return resources.files("stepwarm").joinpath("..", "scenarios")


@functools.cache
def _checkout_scenarios() -> Path:
    """``scenarios/`` beside the ``stepwarm`` package (resolved once: a
    ``resolve()`` stats every part of the path, and every load of a built-in
    asked twice)."""
    return Path(__file__).resolve().parents[2] / "scenarios"


def builtin_names() -> list[str]:
    """Names of the built-in scenarios (``scenarios/*.toml`` without ``.toml``), sorted."""
    return sorted(p.name[:-5] for p in builtin_dir().iterdir()
                  if p.name.endswith(".toml") and not p.name.startswith("_"))


#: Named sets of built-ins: in a list of scenario names, a set's name stands
#: for its members, in order. ``all`` is every built-in, ``default`` first
#: (vLLM's own warmup), then the sampler scenarios, then the rest sorted;
#: those a runner cannot run are skipped with their reason.
SETS: dict[str, Callable[[], list[str]]] = {
    "all": lambda: ["default", "sampler-matrix", "sampler-spec-decode", "sampler-spec-matrix"] + [
        n for n in builtin_names()
        if n not in ("default", "sampler-matrix", "sampler-spec-decode", "sampler-spec-matrix")],
}


def resolve_names(names: Iterable[str]) -> list[str]:
    """``names`` with every set name (``all``) replaced by its members, in
    order, each scenario once: a name that reaches a file already named
    under another spelling (relative, absolute, through a link, ``./``, a
    built-in's name and its file) is left out (:func:`same_files` lists them)."""
    return _resolved(names)[0]


def same_files(names: Iterable[str]) -> list[tuple[str, str, str]]:
    """The names :func:`resolve_names` leaves out for naming a file named
    before: (the name left out, the one kept, the file's resolved path)."""
    return _resolved(names)[1]


def _resolved(names: Iterable[str]) -> tuple[list[str], list[tuple[str, str, str]]]:
    if isinstance(names, str):  # plans_for("default", ...): one name, not its letters
        names = [names]
    out: list[str] = []
    first: dict[str, str] = {}  # resolved path (or the name) -> the name kept
    dropped: list[tuple[str, str, str]] = []
    for name in names:
        for member in SETS[name]() if name in SETS else [name]:
            if member in out:
                continue
            key = _identity(member)
            if key in first:
                dropped.append((member, first[key], key))
                continue
            first[key] = member
            out.append(member)
    return out, dropped


def _looks_like_path(name: str) -> bool:
    """Whether :func:`load` reads ``name`` as a path whether or not it exists."""
    return name.endswith(".toml") or "/" in name or (os.sep != "/" and os.sep in name)


def _identity(name: str) -> str:
    """The file :func:`load` reads for ``name``, resolved (links followed);
    the name itself where there is none (an unknown name: :func:`load`'s
    error)."""
    path = Path(name)
    if name.strip() and (_looks_like_path(name) or path.is_file()):
        return os.path.realpath(path)
    if name in builtin_names():
        return os.path.realpath(str(builtin_dir() / f"{name}.toml"))
    return name


@dataclass(frozen=True)
class LoadedScenario:
    """A parsed, validated scenario file."""

    name: str
    #: Where it came from, for messages (a path, or "builtin:NAME.toml").
    file: str
    text: str
    model: ScenarioFile
    index: _TomlIndex
    #: Each of ``model.steps``' index in the file where the format refused
    #: some ``[[steps]]`` entries (:func:`_without_bad_steps`); (): 0, 1, ...
    step_numbers: tuple[int, ...] = ()
    #: The first ``[[steps]]`` entry the format refused (None: none).
    invalid_from: int | None = None
    #: ``[requests]`` entries the format refused, left out of ``model``:
    #: the steps that select them cannot be checked (the expander says so).
    refused_requests: tuple[str, ...] = ()


def load(name_or_path: str) -> LoadedScenario:
    """Read and validate a scenario: a built-in name or a path to a ``.toml`` file.

    Raises:
        ScenarioError: unknown name, unreadable file, malformed TOML, or a
            file the format rejects (file, line, step, field, what is allowed).
    """
    if not name_or_path.strip():
        raise ScenarioError("empty scenario name; allowed: a path to a .toml file or a built-in "
                            f"name: {', '.join(builtin_names())}", file=name_or_path)
    path = Path(name_or_path)
    if path.is_dir():
        raise ScenarioError(f"{name_or_path!r} is a directory, not a scenario file (*.toml); "
                            "allowed: a path to a .toml file or a built-in name: "
                            f"{', '.join(builtin_names())}", file=name_or_path)
    looks_like_path = _looks_like_path(name_or_path)
    if looks_like_path and not path.exists():
        what = ("a symbolic link that leads to no file (a loop, or its target is missing)"
                if path.is_symlink() else "no such file")
        raise ScenarioError(f"{name_or_path}: cannot read scenario file: {what}; allowed: "
                            "a path to an existing .toml file or a built-in name: "
                            + ", ".join(builtin_names()),
                            file=name_or_path)
    if looks_like_path or path.is_file():
        try:
            text = read_text_capped(path, MAX_FILE_BYTES)  # a BOM (Windows editors) is dropped
        except FileTooLarge:
            raise ScenarioError(
                f"{name_or_path}: scenario file of more than {MAX_FILE_BYTES} bytes; allowed: "
                f"at most {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES, see scenarios/README.md)",
                file=name_or_path) from None
        except OSError as e:
            raise ScenarioError(f"{name_or_path}: cannot read scenario file: "
                                f"{e.strerror or e}", file=name_or_path) from None
        except NotUtf8 as e:
            raise ScenarioError(f"{name_or_path}:{e.line}: cannot read scenario file: not UTF-8 "
                                f"(byte {e.byte:#04x} at offset {e.offset}); "
                                "allowed: TOML in UTF-8", file=name_or_path) from None
        return loads(text, str(path), path.stem)
    known = builtin_names()
    if name_or_path not in known:
        close = difflib.get_close_matches(name_or_path, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if "," in name_or_path:  # STEPWARM_SCENARIOS's form given to -s
            hint = " (one scenario a name: give them as separate names; a comma list is " \
                   "STEPWARM_SCENARIOS's form)"
        raise ScenarioError(f"unknown scenario {name_or_path!r}{hint}; allowed: a path to a "
                            f".toml file, a built-in name: {', '.join(known)}, or a set: "
                            + ", ".join(SETS),
                            file=name_or_path)
    text = (builtin_dir() / f"{name_or_path}.toml").read_text(encoding="utf-8")
    return loads(text, f"scenarios/{name_or_path}.toml", name_or_path)


#: What the nesting scan reads: strings and comments (skipped whole), brackets,
#: and the characters that start, dot and end a key.
_TOML_TOKEN = re.compile(r'"""[\s\S]*?"""|\'\'\'[\s\S]*?\'\'\'|"(?:[^"\\\n]|\\.)*"'
                         r"|'[^'\n]*'|#[^\n]*|[\[\]{}=,.\n]")


def looks_like_scenario(text: str) -> bool:
    """Whether ``text`` is TOML with a scenario's ``steps`` or ``requests`` (a
    scenario file given where a traffic file goes: every line would be
    refused as invalid JSON)."""
    if text.lstrip().startswith("{"):
        return False
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, RecursionError):
        return False
    return "steps" in data or "requests" in data


def _nesting_error(text: str, file: str) -> ScenarioError | None:
    """The error for TOML nested deeper than :data:`MAX_NESTING`, or None.

    Counted before ``tomllib`` reads the text: its parser recurses once per
    array or inline table (``RecursionError`` past ~300) and a key of many
    dotted parts costs it quadratic time and memory. The depth at a point is
    the open arrays and inline tables plus the dotted parts of the key being
    read, an upper bound of the parsed tables' depth.
    """
    stack: list[str] = []
    key, dots, line = True, 0, 1
    for m in _TOML_TOKEN.finditer(text):
        tok = m.group()
        if tok == "\n":
            line += 1
            if not stack:
                key, dots = True, 0
            continue
        if len(tok) > 1:  # a string or a comment
            line += tok.count("\n")
            continue
        if tok in "[{":
            stack.append(tok)
            if tok == "{":
                key, dots = True, 0
        elif tok in "]}":
            if stack:
                stack.pop()
        elif tok == "=":
            key = False
        elif tok == "," and stack and stack[-1] == "{":
            key, dots = True, 0
        elif tok == "." and key:
            dots += 1
        if len(stack) + dots > MAX_NESTING:
            return ScenarioError(
                f"{file}:{line}: nested deeper than {MAX_NESTING} levels (arrays, inline "
                f"tables and dotted keys); allowed: at most {MAX_NESTING} (MAX_NESTING, see "
                "scenarios/README.md)", file=file, line=line)
    return None


def loads(text: str, file: str, name: str) -> LoadedScenario:
    """Parse and validate scenario TOML ``text`` (``file`` for messages).

    The same ``text``, ``file`` and ``name`` are parsed and validated once
    (cached: doing it for the 16 built-ins took a quarter of planning them
    all, ``plans_for(["all"])``); each call returns its own copy of the
    scenario's ``model`` (2 ms for the 16), so a caller that changes it
    changes no later load. Errors are not cached.

    Raises:
        ScenarioError: every error the format finds (one a line, at most
            :data:`~stepwarm.scenario.errors.MAX_ERRORS`), or the one that
            stops reading (malformed TOML, nesting past :data:`MAX_NESTING`).
    """
    shared = _loads_cached(text, file, name)
    return dataclasses.replace(shared, model=shared.model.model_copy(deep=True))


@functools.lru_cache(maxsize=64)
def _loads_cached(text: str, file: str, name: str) -> LoadedScenario:
    """:func:`loads`' work, cached; the result is shared: never changed."""
    too_deep = _nesting_error(text, file)
    if too_deep is not None:
        raise too_deep
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        line = int(m.group(1)) if m else getattr(e, "lineno", None)
        msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
        col = f", column {m.group(2)}" if m else ""
        from stepwarm.record import looks_like_recording

        if looks_like_recording(text):
            raise ScenarioError(
                f"{file}:1: a STEPWARM_RECORD recording, not a scenario; make a scenario of it "
                f"with `stepwarm scenario from-record {file} -o FILE.toml`",
                file=file, line=1) from None
        raise ScenarioError(
            f"{file}:{line or '?'}: malformed TOML{col}: {msg}; allowed: TOML 1.0 "
            "(key = value, [requests.NAME] and [[steps]] tables, see scenarios/README.md)",
            file=file, line=line) from None
    except ValueError:  # an integer past Python's digit limit (int_max_str_digits)
        long_int = re.search(r"\d{%d,}" % MAX_INT_DIGITS, text)
        line = text.count("\n", 0, long_int.start()) + 1 if long_int else None
        raise ScenarioError(f"{file}:{line or '?'}: an integer of more than {MAX_INT_DIGITS} "
                            f"digits; allowed: integers of up to {MAX_INT_DIGITS} digits",
                            file=file, line=line) from None
    index = _TomlIndex(text)
    errors: list[ScenarioError] = []
    reqs = data.get("requests")
    if isinstance(reqs, dict):
        for rname in reqs:
            if not _REQUEST_NAME.fullmatch(rname):
                line = index.line(("requests", rname))
                errors.append(ScenarioError(
                    f"{file}:{line or '?'}: bad request name {rname!r}; allowed: {_NAME_HELP}",
                    file=file, line=line, field="requests"))
    try:
        model = ScenarioFile.model_validate(data)
    except ValidationError as e:
        errors += _validation_errors(e, file, index, names_reported=bool(errors))
    if errors:
        partial = _without_bad_steps(data, errors,
                                     LoadedScenario(name, file, text, ScenarioFile(), index))
        if partial is not None:  # a step naming no request: told beside the format's errors
            errors += _unknown_requests(partial.model, file, index, partial.step_numbers,
                                        partial.refused_requests)
            errors += _unknown_requests_of_refused_steps(data, errors, file, index, partial)
        raise ScenarioError.of(sorted(errors, key=lambda x: x.line or 1 << 30),
                               partial=partial)
    unknown = _unknown_requests(model, file, index)
    if unknown:  # told before any runner is known (check, run and the plugin alike)
        raise ScenarioError.of(unknown, partial=_without_bad_steps(
            data, unknown, LoadedScenario(name, file, text, ScenarioFile(), index)))
    if model.sequence is not None and (model.requests or model.steps):
        raise ScenarioError(
            f"{file}:{index.line(('top',), 'sequence')}: field 'sequence': a scenario "
            "with sequence = ... has no [requests] or [[steps]]; allowed: one or the other",
            file=file, line=index.line(("top",), "sequence"), field="sequence")
    if model.sequence is None and not model.steps:
        raise ScenarioError(
            f"{file}:1: field 'steps': empty scenario: no [[steps]]; allowed: at least one [[steps]] "
            "table with a kind (or sequence = \"vllm-default\")", file=file, line=1,
            field="steps")
    return LoadedScenario(name=name, file=file, text=text, model=model, index=index)


def _unknown_requests(model: ScenarioFile, file: str, index: _TomlIndex,
                      numbers: Sequence[int] = (), refused: Sequence[str] = ()
                      ) -> list[ScenarioError]:
    """A located error per step field that selects a request no
    ``[requests.NAME]`` declares (the expander's message, told without a
    runner). ``numbers``: each step's index in the file (where the format
    left some out); ``refused``: entries the format refused (declared, not
    in ``model``)."""
    declared = _in_file_order([*model.requests, *refused], index)
    errors = []
    for i, st in zip(numbers or range(len(model.steps)), model.steps):
        for field in SELECTOR_FIELDS:
            errors += _undeclared_in(getattr(st, field, None) or [], declared, file, index, i,
                                     field, st.kind)
    return errors


def _in_file_order(names: Iterable[str], index: _TomlIndex) -> list[str]:
    """``names`` once each, in the order their ``[requests.NAME]`` tables appear."""
    return sorted(dict.fromkeys(names), key=lambda n: index.line(("requests", n)) or 0)


def _undeclared_in(selectors: Iterable[object], declared: list[str], file: str,
                   index: _TomlIndex, step: int, field: str, kind: str | None
                   ) -> list[ScenarioError]:
    """A located error per request that the selectors of step ``step``'s
    ``field`` name and ``declared`` lacks (the expander's message)."""
    names = [m.group(1) for v in selectors if isinstance(v, str)
             and (m := _SELECTOR.match(v)) is not None]
    errors = []
    for name in dict.fromkeys(names):
        if name in declared:
            continue
        what, allowed = unknown_request(name, declared)
        line = index.line(("steps", step), field)
        errors.append(ScenarioError(
            f"{_where(file, line, ('steps', step), field, kind)}: {what}; allowed: {allowed}",
            file=file, line=line, step=step, field=field))
    return errors


def _unknown_requests_of_refused_steps(data: dict, errors: list[ScenarioError], file: str,
                                       index: _TomlIndex, partial: LoadedScenario
                                       ) -> list[ScenarioError]:
    """:func:`_unknown_requests` for the steps the format refused (left out
    of ``partial``), each selector field not already in error: so that
    ``repeat = -1`` or ``kind = "prefil"`` does not hide ``requests =
    ["c"]`` naming no request. A misspelt kind is read as its did-you-mean
    kind, as the step's other errors are (``step 0 (read as prefill)``)."""
    steps = data.get("steps")
    if not isinstance(steps, list):
        return []
    said = {(e.step, e.field) for e in errors}
    declared = _in_file_order([*partial.model.requests, *partial.refused_requests], index)
    out = []
    for i in sorted({e.step for e in errors if e.step is not None}):
        step = steps[i] if i < len(steps) else None
        if not isinstance(step, dict):
            continue
        kind = str(step.get("kind", ""))
        if kind not in STEP_MODELS:
            close = difflib.get_close_matches(kind, list(STEP_MODELS), n=1)
            kind = f"read as {close[0]}" if close else ""
        for field in SELECTOR_FIELDS:
            value = step.get(field)
            if (i, field) in said or not isinstance(value, list):
                continue
            out += _undeclared_in(value, declared, file, index, i, field, kind or None)
    return out


def _without_bad_steps(data: dict, errors: list[ScenarioError],
                       sc: LoadedScenario) -> LoadedScenario | None:
    """``sc`` with the ``[[steps]]`` and ``[requests]`` entries the format
    refused left out, so that the expander can still check the others
    against a runner (a refused request is named in ``refused_requests``:
    the steps that select it are not checked, and a last line says so);
    None where an error lies elsewhere (the top-level keys) that is more
    than an expression's names or form, or nothing valid is left. An
    expression refused for its names stays in (the expander says the same
    error, beside the runner's own)."""
    bad = {e.step for e in errors}
    steps = data.get("steps")
    if not isinstance(steps, list):
        return None
    keep = [i for i in range(len(steps)) if i not in bad]
    requests = data.get("requests")
    kept: dict[str, Any] = {}
    refused: list[str] = []
    for name, spec in (requests.items() if isinstance(requests, dict) else ()):
        ok, usable = _request_parts(name, spec)
        if not ok and _REQUEST_NAME.fullmatch(name):  # a bad name is no name a step selects
            refused.append(name)
        if usable is not None:
            kept[name] = usable
    candidate = {**data, "steps": [steps[i] for i in keep],
                 **({"requests": kept} if isinstance(requests, dict) else {})}
    try:
        with names_unchecked():
            model = ScenarioFile.model_validate(candidate)
    except ValidationError as e:
        # a fault among the top-level keys hides none of the requests' and
        # steps' errors: the file read without it (the ninth trial)
        mended = _without_bad_top_level_keys(candidate, e)
        if mended is None:
            return None
        try:
            with names_unchecked():
                model = ScenarioFile.model_validate(mended)
        except ValidationError:
            return None
    stepped = [i for i in bad if i is not None]
    return dataclasses.replace(sc, model=model, step_numbers=tuple(keep),
                               invalid_from=min(stepped) if stepped else None,
                               refused_requests=tuple(refused))


def _without_bad_top_level_keys(data: dict, e: ValidationError) -> dict | None:
    """``data`` with the top-level faults ``e`` names taken out: unknown
    keys and ``description`` dropped, bad ``requires`` entries dropped (the
    others still decide a skip), a misspelt ``needs`` entry read as its
    did-you-mean; None where a fault is elsewhere, or a ``needs`` entry has
    no close match (the scenario might be skipped on a runner: its steps
    are not checked against one)."""
    out = dict(data)
    drop: dict[str, set[int]] = {}
    for err in e.errors():
        loc = err["loc"]
        if not loc or loc[0] in ("steps", "requests"):
            return None
        key = str(loc[0])
        if err["type"] == "extra_forbidden" or key == "description":
            out.pop(key, None)
        elif key in ("requires", "needs") and len(loc) == 2 and isinstance(loc[1], int) \
                and isinstance(out.get(key), list):
            drop.setdefault(key, set()).add(loc[1])
        else:
            return None
    for key, where in drop.items():
        items = list(out[key])
        if key == "needs":
            for i in where:
                close = difflib.get_close_matches(str(items[i]), list(get_args(Need)), n=1)
                if not close:
                    return None
                items[i] = close[0]
        else:
            items = [x for i, x in enumerate(items) if i not in where]
        out[key] = items
    return out


def _request_parts(name: str, spec: Any) -> tuple[bool, Any]:
    """Whether the format takes ``[requests.NAME]`` (its name and table; an
    expression refused for its names alone passes: the expander says it),
    and the table the expander can still check: the whole of it, or, for a
    refused one, the keys the format did not refuse where they make a request
    (``count = 0`` beside ``prompt = -5``: the prompt is still checked), else None."""
    if not _REQUEST_NAME.fullmatch(name):
        return False, None
    try:
        with names_unchecked():
            RequestSpec.model_validate(spec)
    except ValidationError as e:
        errs = [err for err in e.errors() if err["loc"]]
        # an unknown or mistyped key in a sampling table: the table's other keys
        # still checked (by vLLM's SamplingParams, where the expander gets to it)
        in_table = [err["loc"][:2] == ("sampling", "table") and len(err["loc"]) >= 3
                    for err in errs]
        typos = {err["loc"][2] for err, key in zip(errs, in_table) if key}
        bad = {err["loc"][0] for err, key in zip(errs, in_table) if not key}
        rest = {k: v for k, v in spec.items() if k not in bad} if isinstance(spec, dict) else None
        if rest is not None and typos and isinstance(rest.get("sampling"), dict):
            rest["sampling"] = {k: v for k, v in rest["sampling"].items() if k not in typos}
        try:
            with names_unchecked():
                RequestSpec.model_validate(rest)
        except ValidationError:
            return False, None
        return False, rest
    return True, spec


class _TomlIndex:
    """Where tables and keys sit in a TOML text (tomllib keeps no positions)."""

    _HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")

    def __init__(self, text: str):
        self.lines = text.splitlines()
        self.sections: list[tuple[tuple, int, int]] = []  # key, first, last (0-based)
        current: tuple = ("top",)
        start, n_steps = 0, 0
        for i, raw in enumerate(self.lines):
            m = self._HEADER.match(raw)
            if not m:
                continue
            self.sections.append((current, start, i - 1))
            name = [p.strip().strip('"').strip("'") for p in m.group(2).split(".")]
            if m.group(1) == "[[" and name == ["steps"]:
                current = ("steps", n_steps)
                n_steps += 1
            elif name[0] == "requests" and len(name) == 2:
                current = ("requests", name[1])
            elif name[0] == "requests" and len(name) == 3:
                current = ("requests", name[1], name[2])  # [requests.NAME.sampling]
            elif name == ["requests"]:
                current = ("requests",)
            else:
                current = ("other", i)
            start = i
        self.sections.append((current, start, len(self.lines) - 1))

    def line(self, section: tuple, key: str | None = None) -> int | None:
        """1-based line of ``key`` in ``section`` (or of the section header).

        A dotted ``key`` ("sampling.logprobs") is looked up in the sub-table
        (``[requests.NAME.sampling]``) first, then as the line of its first
        part (an inline table: ``sampling = { logprobs = 5 }``).
        """
        if key is not None and "." in key:
            head, _, tail = key.partition(".")
            if any(sec == (*section, head) for sec, _, _ in self.sections):
                return self.line((*section, head), tail)
            return self.line(section, head)
        for sec, first, last in self.sections:
            if sec != section:
                continue
            if key is not None:
                pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*[=.]")
                for i in range(first, last + 1):
                    if pat.match(self.lines[i]):
                        return i + 1
            if section == ("top",) and key is not None:
                # a top-level key written as a table header: [steps] for [[steps]], [[stepz]]
                header = re.compile(rf"^\s*\[\[?\s*[\"']?{re.escape(key)}[\"']?\s*[\].]")
                return next((i + 1 for i, raw in enumerate(self.lines) if header.match(raw)),
                            None)
            return first + 1 if section != ("top",) else (1 if key is None else None)
        if section[0] == "steps" and len(section) == 2:  # steps = [{ ... }, { ... }]
            span = self._inline_step(section[1])
            if span is None:
                return None
            first, last = span
            if key is not None:
                pat = re.compile(rf"(?:^|[{{,\s])[\"']?{re.escape(key)}[\"']?\s*=")
                for i in range(first, last + 1):
                    if pat.search(self.lines[i]):
                        return i + 1
            return first + 1
        if section[0] == "requests" and len(section) == 2:
            # inline: [requests] NAME = { ... }
            found = self.line(("requests",), section[1])
            if found is None:  # a dotted top-level key: requests.NAME = { ... }
                dotted = re.compile(rf"^\s*requests\s*\.\s*[\"']?{re.escape(section[1])}"
                                    rf"[\"']?\s*=")
                found = next((i + 1 for i, raw in enumerate(self.lines) if dotted.match(raw)),
                             None)
            return found
        return None


    def _inline_step(self, n: int) -> tuple[int, int] | None:
        """0-based first and last line of the ``n``-th inline table of a
        top-level ``steps = [ ... ]`` array (None: no such array or entry)."""
        start = next((i for i, raw in enumerate(self.lines)
                      if re.match(r"^\s*steps\s*=\s*\[", raw)), None)
        if start is None:
            return None
        depth, entry, first, quote = 0, -1, 0, ""
        for i in range(start, len(self.lines)):
            line = self.lines[i]
            j = line.index("[") if i == start else 0
            while j < len(line):
                c = line[j]
                if quote:
                    if c == "\\":
                        j += 1
                    elif c == quote:
                        quote = ""
                elif c in "\"'":
                    quote = c
                elif c == "#":
                    break
                elif c in "[{":
                    depth += 1
                    if c == "{" and depth == 2:
                        entry, first = entry + 1, i
                elif c in "]}":
                    depth -= 1
                    if depth == 1 and c == "}" and entry == n:
                        return first, i
                    if depth == 0:
                        return None
                j += 1
        return None


def _model_at(loc: tuple) -> tuple[type[BaseModel] | None, tuple, str | None]:
    """(model, TOML section, field) for a pydantic error location."""
    if loc and loc[0] == "steps" and len(loc) >= 2 and isinstance(loc[1], int):
        sec = ("steps", loc[1])
        if len(loc) >= 3 and loc[2] in STEP_MODELS:
            return STEP_MODELS[loc[2]], sec, (str(loc[3]) if len(loc) >= 4 else None)
        return None, sec, ("kind" if len(loc) >= 3 else None)
    if loc and loc[0] == "requests" and len(loc) >= 2:
        if len(loc) == 2:  # the request itself is not a table
            return None, ("requests", loc[1]), None
        if loc[2] == "sampling" and len(loc) >= 5 and loc[3] == "table":
            return SamplingTable, ("requests", loc[1]), f"sampling.{loc[4]}"
        return RequestSpec, ("requests", loc[1]), str(loc[2])
    return ScenarioFile, ("top",), (str(loc[0]) if loc else None)


#: Longest value an error message quotes whole (characters of its repr).
MAX_SHOWN = 60


def _shown(value: object) -> str:
    """``value`` as an error message quotes it: as the file spells it
    (:func:`~stepwarm.scenario.errors.toml_value`), or, longer than
    :data:`MAX_SHOWN`, its start and its length (a 237-character expression
    is not echoed on one line)."""
    text = toml_value(value)
    if len(text) <= MAX_SHOWN:
        return text
    size = f", {len(value)} characters" if isinstance(value, (str, list, dict)) else ""
    return f"{text[:MAX_SHOWN - 20]}...{size}"


def _where(file: str, line: int | None, sec: tuple, field: str | None,
           kind: str | None = None) -> str:
    parts = [f"{file}:{line}" if line else file]
    if sec[0] == "steps":
        parts.append(f"step {sec[1]}" + (f" ({kind})" if kind else ""))
    elif sec[0] == "requests" and len(sec) == 2:
        parts.append(f"request {sec[1]!r}")
    if field:
        parts.append(f"field {field!r}")
    return ": ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")


_TYPE_ALLOWED = {
    "bool_type": "true or false", "bool_parsing": "true or false",
    "string_type": "a string", "list_type": "a list of strings",
    "dict_type": "a table", "model_type": "a table", "int_type": "an integer",
    "model_attributes_type": "a table",
}
#: Sampling fields whose lists hold token ids, not strings.
_LISTS_OF_IDS = {"bad_words": "a list of token-id lists", "stop_token_ids": "a list of token ids",
                 "allowed_token_ids": "a list of token ids"}
#: What a section must be, where a wrong type there has a better answer.
_SECTION_ALLOWED = {
    ("steps",): "[[steps]] tables (an array of tables, each with a kind), not a [steps] table",
    ("step",): "a [[steps]] table with a kind, e.g. kind = \"prefill\"",
    ("request",): "a [requests.NAME] table, e.g. prompt = 24",
}


#: SamplingParams fields a scenario's sampling table leaves out, and why (said
#: instead of a did-you-mean: ``max_tokens`` is not ``min_tokens``).
_SET_BY_STEPS = {
    "max_tokens": "a request's output length is its steps': each decode step samples one "
                  "token, a finish step ends it",
    "n": "each request samples one sequence; declare count = N for N requests",
}


def _validation_errors(e: ValidationError, file: str, index: _TomlIndex, *,
                       names_reported: bool = False) -> list[ScenarioError]:
    """Every error in ``e``, located, unknown keys first (a typo explains the
    "missing" error that comes with it, which is then left out), then by line.
    ``names_reported``: the bad request names were reported already (the
    format's own name check is left out)."""
    errors = sorted([*e.errors(), *_as_meant(e.errors())],
                    key=lambda x: x["type"] != "extra_forbidden")
    if names_reported:
        errors = [x for x in errors if tuple(x["loc"]) != ("requests",)]
    typos: list[ScenarioError] = []
    rest: list[ScenarioError] = []
    explained: set[tuple] = set()  # (section loc, key) that a typo's did-you-mean names
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "missing" and (loc[:-1], str(loc[-1])) in explained:
            continue
        one, suggestion = _validation_error(err, file, index)
        if err["type"] == "extra_forbidden":
            typos.append(one)
            if suggestion:
                explained.add((loc[:-1], suggestion))
        else:
            rest.append(one)
    by_line = lambda x: x.line or 1 << 30  # noqa: E731
    return sorted(typos, key=by_line) + sorted(rest, key=by_line)


def _as_meant(errors: list[Any]) -> list[Any]:
    """The errors of each step whose ``kind`` is misspelt, read as the kind it
    was probably meant to be (the did-you-mean): the unknown kind would
    otherwise hide them until it is mended. Located as that kind's errors
    are; a step with no close kind gives none."""
    more: list[Any] = []
    for err in errors:
        step = err["input"]
        if err["type"] != "union_tag_invalid" or not isinstance(step, dict):
            continue
        close = difflib.get_close_matches(str(step.get("kind", "")), list(STEP_MODELS), n=1)
        if not close:
            continue
        try:
            STEP_MODELS[close[0]].model_validate({**step, "kind": close[0]})
        except ValidationError as meant:
            more += [{**x, "loc": (*err["loc"], close[0], *x["loc"]), "read_as": close[0]}
                     for x in meant.errors()]
    return more


def _validation_error(err: Any, file: str, index: _TomlIndex) -> tuple[ScenarioError, str | None]:
    """One pydantic error as a located :class:`ScenarioError`, and for an
    unknown key the known key it was probably meant to be (else None)."""
    suggestion = None
    loc = tuple(err["loc"])
    model, sec, fld = _model_at(loc)
    key = (fld or "").rpartition(".")[2]  # the model's field ("sampling.top_k": "top_k")
    kind = loc[2] if sec[0] == "steps" and len(loc) >= 3 and loc[2] in STEP_MODELS else None
    typ = err["type"]
    if typ == "extra_forbidden":
        allowed = sorted(model.model_fields) if model else []
        close = difflib.get_close_matches(key, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if key in _SET_BY_STEPS and "min_tokens" in allowed:  # a sampling table
            close, hint = [], f" ({_SET_BY_STEPS[key]})"
        suggestion = close[0] if close else None
        what = f"unknown key {fld!r}{hint}; allowed keys: {', '.join(allowed)}"
    elif typ == "missing":
        desc = model.model_fields[key].description if model and key in model.model_fields else ""
        what = f"missing required key {fld!r}; allowed: {desc or 'see scenarios/README.md'}"
    elif typ in ("union_tag_invalid", "union_tag_not_found"):
        fld = "kind"
        tags = ", ".join(STEP_MODELS)
        got = f"unknown step kind {err['input'].get('kind')!r}" if typ == "union_tag_invalid" \
            and isinstance(err["input"], dict) else "a step without kind"
        close = difflib.get_close_matches(str(err["input"].get("kind", "")), list(STEP_MODELS), n=1) \
            if isinstance(err["input"], dict) else []
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if typ == "union_tag_not_found" and isinstance(err["input"], dict):
            # A misspelt ``kind`` key: name it, as an unknown key elsewhere is named.
            typo = next((k for k in err["input"]
                         if difflib.get_close_matches(str(k), ["kind"], n=1, cutoff=0.6)), None)
            if typo is not None:
                got = f"unknown key {typo!r} (did you mean 'kind'?); a step without kind"
        what = f"{got}{hint}; allowed kinds: {tags}"
    elif typ in _TYPE_ALLOWED or typ == "literal_error":
        allowed = _TYPE_ALLOWED.get(typ) or err["msg"].removeprefix("Input should be ")
        if typ == "list_type" and key in _LISTS_OF_IDS:
            allowed = _LISTS_OF_IDS[key]
        if sec == ("top",) and fld == "steps":
            allowed = _SECTION_ALLOWED[("steps",)]
        elif sec[0] == "steps" and fld is None:
            allowed = _SECTION_ALLOWED[("step",)]
        elif sec[0] == "requests" and fld is None:
            allowed = _SECTION_ALLOWED[("request",)]
        hint = ""
        if typ == "literal_error" and isinstance(err["input"], str):  # a misspelt word
            options = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            close = difflib.get_close_matches(err["input"], options, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
        what = f"wrong type or value {_shown(err['input'])}{hint}; allowed: {allowed}"
        desc = model.model_fields[key].description if model and key in model.model_fields else ""
        what += f" ({desc})" if desc else ""
    else:
        msg = err["msg"].removeprefix("Value error, ")
        desc = ""
        if model and key in model.model_fields and "allowed" not in msg:
            desc = model.model_fields[key].description or ""
            desc = f"; allowed: {desc}" if desc else ""
        said = ("got" in msg or (isinstance(err["input"], str)
                                 and msg.startswith(repr(err["input"].strip())))
                or (isinstance(err["input"], int) and f" {err['input']} " in f" {msg} "))
        what = msg + desc if said else f"{msg} (got {_shown(err['input'])}){desc}"
        if "allowed" not in what:
            what += "; allowed: see scenarios/README.md"
    line = index.line(sec, fld)
    if "read_as" in err:  # the kind it was read as, not the file's
        kind = f"read as {kind}"
    return ScenarioError(f"{_where(file, line, sec, fld, kind)}: {what}", file=file, line=line,
                         step=sec[1] if sec[0] == "steps" else None, field=fld), suggestion
