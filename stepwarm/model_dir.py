"""A ``--model`` directory, checked before vLLM starts, and vLLM's refusals in one paragraph.

vLLM's own errors for a bad model directory are long: an unsupported
architecture is a pydantic ``ValidationError`` listing every architecture it
knows (~10 KB on one line), an invalid ``config.json`` says neither line nor
column. :func:`check_model_dir` catches those cases first, with the file,
line and column; :func:`vllm_rejection` trims what vLLM raises for the rest.
"""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

#: The most characters of vLLM's message :func:`vllm_rejection` keeps.
MAX_REASON = 400
SUPPORTED_ARCHS_HINT = ("list the supported ones with: python -c \"from vllm import ModelRegistry; "
                        "print('\\n'.join(sorted(ModelRegistry.get_supported_archs())))\"")


class ModelDirError(ValueError):
    """A model directory stepwarm will not hand to vLLM; one paragraph naming
    the path and what is wrong."""


def check_model_dir(model: Path) -> dict[str, Any]:
    """Check ``model`` the way vLLM will read it, without starting vLLM.

    Returns:
        The parsed ``config.json``.

    Raises:
        ModelDirError: the directory is missing, has no ``config.json``, the
            file is not JSON (line and column given) or not a JSON object,
            or none of its ``architectures`` is one vLLM supports (named,
            with how to list the supported ones).
    """
    if model.is_file():
        raise ModelDirError(f"--model {model}: is a file; allowed: a model directory "
                            "(config.json; weights optional) or a zoo model name "
                            "(stepwarm list --models)")
    if not model.is_dir():
        from stepwarm.zoo import ZOO

        close = difflib.get_close_matches(str(model), list(ZOO), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ModelDirError(f"--model {model}: no such directory, nor a zoo model{hint}; "
                            f"zoo models: {', '.join(ZOO)} (stepwarm list --models)")
    config = model / "config.json"
    if not config.is_file():
        raise ModelDirError(f"--model {model}: not a model directory (no config.json)")
    try:
        data = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise ModelDirError(f"{config}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{config}: cannot read: {e}") from None
    if not isinstance(data, dict):
        raise ModelDirError(f"{config}: expected a JSON object, got {type(data).__name__}")
    archs = data.get("architectures")
    if archs is not None:
        if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
            raise ModelDirError(f"{config}: field 'architectures': expected a list of class "
                                f"names, got {archs!r}")
        supported = _supported_architectures()
        if supported and archs and not any(a in supported for a in archs):
            raise ModelDirError(
                f"{config}: field 'architectures': {', '.join(archs)} is not supported by the "
                f"installed vLLM ({_vllm_version()}); {SUPPORTED_ARCHS_HINT}")
    return data


def _supported_architectures() -> set[str]:
    try:
        from vllm import ModelRegistry

        return set(ModelRegistry.get_supported_archs())
    except Exception:  # noqa: BLE001 - no registry: let vLLM decide
        return set()


def _vllm_version() -> str:
    try:
        import vllm

        return f"vllm {vllm.__version__}"
    except Exception:  # noqa: BLE001
        return "vllm"


def vllm_rejection(e: BaseException, model: Path | None) -> str:
    """One paragraph for an exception vLLM raised while starting: for a
    pydantic ``ValidationError`` the first error's field and message, else
    the exception's first line; at most :data:`MAX_REASON` characters."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            loc = ".".join(str(p) for p in first.get("loc", ()) if p != "__root__")
            msg = str(first.get("msg", "")).removeprefix("Value error, ")
            reason = (f"field '{loc}': " if loc else "") + msg
        except Exception:  # noqa: BLE001 - not pydantic after all
            reason = str(e)
    else:
        reason = str(e)
    reason = re.sub(r"\s+", " ", reason.strip().splitlines()[0] if reason.strip() else "")
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON - 3] + "..."
    where = f" (--model {model})" if model is not None else ""
    return f"{type(e).__name__}{where}: {reason}"
