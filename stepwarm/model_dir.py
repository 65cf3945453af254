"""A ``--model`` directory or Hugging Face id, checked before vLLM starts, and
vLLM's refusals in one paragraph.

A Hugging Face id (``ORG/NAME[@REVISION]``, :func:`resolve_hub_model`) is
looked up in the local Hugging Face cache first (``HF_HOME`` /
``HF_HUB_CACHE``, as ``huggingface_hub`` lays it out), and only where it is
not cached, and ``HF_HUB_OFFLINE`` is not set, fetched from the Hub: its
``config.json`` and tokenizer files, no weights (stepwarm starts vLLM with
``load_format="dummy"``). Its cached ``config.json`` gets the checks of a
directory's.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The most characters of vLLM's message :func:`vllm_rejection` keeps.
MAX_REASON = 400
SUPPORTED_ARCHS_HINT = ("list the supported ones with: python -c \"from vllm import ModelRegistry; "
                        "print('\\n'.join(sorted(ModelRegistry.get_supported_archs())))\"")


class ModelDirError(ValueError):
    """A model directory stepwarm will not hand to vLLM; one paragraph naming
    the path and what is wrong."""


#: A Hugging Face model id as ``vllm serve`` takes it (``ORG/NAME``), with an
#: optional ``@REVISION`` (branch, tag or commit: vLLM's ``revision``).
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")
#: Files fetched for a Hub model besides ``config.json`` (those the repo has).
HUB_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model",
                       "special_tokens_map.json", "generation_config.json")


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face model id resolved to its local snapshot."""

    #: ``ORG/NAME`` (vLLM's ``model``).
    repo_id: str
    #: vLLM's ``revision`` (None: the default branch).
    revision: str | None
    #: The snapshot directory in the Hugging Face cache holding its
    #: ``config.json`` (and the tokenizer files the repo has).
    snapshot: Path
    #: Where it came from: "cache" or "hub".
    source: str = field(default="cache", compare=False)

    @property
    def engine_args(self) -> dict[str, Any]:
        """``vllm.LLM`` keywords it adds: ``revision`` when one was given."""
        return {"revision": self.revision} if self.revision else {}


def parse_hub_id(model: str) -> tuple[str, str | None] | None:
    """``"ORG/NAME@REV"`` -> ``("ORG/NAME", "REV")``; ``("ORG/NAME", None)``
    without ``@``; None for anything else (a path of three parts, ``./x``)."""
    m = HUB_ID.fullmatch(model)
    return (m.group("repo"), m.group("revision")) if m else None


def resolve_hub_model(model: str) -> HubModel:
    """Resolve a Hugging Face id, offline first: the local cache's
    ``config.json`` for the revision (``huggingface_hub.try_to_load_from_cache``,
    refs resolved as the hub client does), else, unless ``HF_HUB_OFFLINE``,
    ``config.json`` and the tokenizer files from the Hub
    (``hf_hub_download``; no weights).

    Returns:
        The :class:`HubModel`.

    Raises:
        ModelDirError: ``model`` is not ``ORG/NAME[@REVISION]``; it is not
            in the cache while offline; the Hub has no such repo, revision
            or ``config.json``, or cannot be reached (one paragraph each,
            naming the cache directory).
    """
    parsed = parse_hub_id(model)
    if parsed is None:
        raise ModelDirError(f"--model {model}: not a Hugging Face model id; allowed: ORG/NAME "
                            "or ORG/NAME@REVISION")
    repo, revision = parsed
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(repo, "config.json", revision=revision)
    if isinstance(cached, str):
        return HubModel(repo, revision, Path(cached).parent)
    at = f" at revision {revision!r}" if revision else ""
    where = f"the Hugging Face cache {constants.HF_HUB_CACHE} (HF_HOME / HF_HUB_CACHE)"
    if constants.HF_HUB_OFFLINE:
        raise ModelDirError(
            f"--model {model}: no such directory, and {repo}{at} is not in {where}; "
            f"HF_HUB_OFFLINE is set, so the "
            f"Hub is not asked; fetch its config and tokenizer first (hf download {repo}"
            f"{' --revision ' + revision if revision else ''} config.json tokenizer.json "
            "tokenizer_config.json), or unset HF_HUB_OFFLINE, or give a local model directory")
    return _fetch_hub_model(model, repo, revision, at, where)


def _fetch_hub_model(model: str, repo: str, revision: str | None, at: str, where: str) -> HubModel:
    """``config.json`` and the tokenizer files of ``repo`` from the Hub into the cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (GatedRepoError, RemoteEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    try:
        config = Path(hf_hub_download(repo, "config.json", revision=revision))
    except GatedRepoError:
        raise ModelDirError(f"--model {model}: {repo} is gated on the Hugging Face Hub; accept "
                            "its terms on huggingface.co and log in (hf auth login)") from None
    except RepositoryNotFoundError:
        raise ModelDirError(f"--model {model}: no model {repo} on the Hugging Face Hub (or it "
                            f"is private: log in with hf auth login), nor in {where}") from None
    except RevisionNotFoundError:
        raise ModelDirError(f"--model {model}: {repo} has no revision {revision!r} on the "
                            "Hugging Face Hub") from None
    except RemoteEntryNotFoundError:
        raise ModelDirError(f"--model {model}: {repo}{at} has no config.json on the Hugging "
                            "Face Hub; not a model vLLM can load") from None
    except Exception as e:  # noqa: BLE001 - no network (LocalEntryNotFoundError), HTTP errors
        reason = re.sub(r"\s+", " ", str(e).strip().splitlines()[0] if str(e).strip() else "")
        raise ModelDirError(f"--model {model}: {repo}{at} is not in {where}, and the Hugging "
                            f"Face Hub could not be asked ({type(e).__name__}: "
                            f"{reason[:200]}); set HF_HUB_OFFLINE=1 to use the cache only, "
                            "or give a local model directory") from None
    for name in HUB_TOKENIZER_FILES:
        try:
            hf_hub_download(repo, name, revision=revision)
        except RemoteEntryNotFoundError:
            pass
    return HubModel(repo, revision, config.parent, source="hub")


def check_model_dir(model: Path, registry: bool = True) -> dict[str, Any]:
    """Check ``model`` the way vLLM will read it, without starting vLLM
    (``registry`` False: without asking vLLM's model registry whether it
    supports the architecture, which imports vLLM).

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
        from stepwarm.zoo import TINY_ZOO, ZOO

        close = difflib.get_close_matches(str(model), list(ZOO), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        real = len(ZOO) - len(TINY_ZOO)
        raise ModelDirError(f"--model {model}: no such directory, nor a zoo model{hint}, nor "
                            f"a Hugging Face id (ORG/NAME[@REVISION]); zoo models: "
                            f"{', '.join(TINY_ZOO)} and {real} of real dimensions "
                            "(stepwarm list --models)")
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
    if archs is None and "model_type" not in data:
        _check_model_type_guess(model, config)
    if archs is not None:
        if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
            raise ModelDirError(f"{config}: field 'architectures': expected a list of class "
                                f"names, got {archs!r}")
        supported = _supported_architectures() if registry else set()
        if supported and archs and not any(a in supported for a in archs):
            raise ModelDirError(
                f"{config}: field 'architectures': {', '.join(archs)} is not supported by the "
                f"installed vLLM ({_vllm_version()}); {SUPPORTED_ARCHS_HINT}")
    return data


def _check_model_type_guess(model: Path, config: Path) -> None:
    """A config.json with neither ``architectures`` nor ``model_type``: ask
    transformers' ``AutoConfig`` (some releases guess the type from the
    directory's name); where it refuses, say so now, not after vLLM has
    started (:class:`ModelDirError`)."""
    try:
        from transformers import AutoConfig
    except ImportError:  # no transformers: vLLM's own error, later
        return
    try:
        AutoConfig.from_pretrained(str(model))
    except ValueError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelDirError(
            f"{config}: has neither 'architectures' nor 'model_type', and transformers "
            f"cannot tell the model from the directory's name ({first}); allowed: a "
            "config.json with 'model_type' (and 'architectures')") from None
    except Exception:  # noqa: BLE001 - anything else is vLLM's to report
        return


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


def _first_sentence(text: str) -> str:
    """The first line of ``text``, with the lines after it while each one so
    far ends with a colon (``Validation error for field 'hidden_size':`` is
    followed by its cause)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    out = lines[:1]
    for line in lines[1:]:
        if not out[-1].endswith(":"):
            break
        out.append(line)
    return " ".join(out)


def vllm_rejection(e: BaseException, model: Path | None) -> str:
    """One paragraph for an exception vLLM raised while starting: for a
    pydantic ``ValidationError`` the first error's field and message, else
    the exception's first line (and its cause where that line ends with a
    colon); at most :data:`MAX_REASON` characters."""
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
    reason = re.sub(r"\s+", " ", _first_sentence(reason))
    if len(reason) > MAX_REASON:
        reason = reason[:MAX_REASON - 3] + "..."
    where = f" (--model {model})" if model is not None else ""
    return f"{type(e).__name__}{where}: {reason}"
