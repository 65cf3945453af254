"""``STEPWARM_RECORD=PATH``: the shape of every step vLLM's live scheduler sends.

The plugin (:func:`stepwarm.hook.register` calls :func:`install`) wraps the
engine core's ``Scheduler.schedule`` and ``Scheduler.update_from_output``
(``vllm/v1/core/sched/scheduler.py``). The engine core is where recording is
simplest and correct: the scheduler holds every request's ``Request`` (its
``SamplingParams`` and prompt length whatever step it is in, not only in the
step that sends it as new), ``schedule()`` returns the ``SchedulerOutput``
before any worker sees it, and ``update_from_output`` gets the
``ModelRunnerOutput`` from which the accepted drafts are read. It runs once
per engine (no rank of a TP / PP grid to pick) and in the process that
schedules, whatever the executor.

The recording is JSON Lines, appended to ``PATH`` (``PATH.dpN`` for data-parallel
rank N of several). Its first line is a header::

    {"stepwarm_record": 1, "stepwarm": "0.1.0", "vllm": "0.32.0",
     "model": {"architecture": "LlamaForCausalLM", "config_hash": "6f0c..."},
     "block_size": 128, "max_num_seqs": 8, "max_num_batched_tokens": 512,
     "num_spec_tokens": 0, "runner": "v1", "cudagraph_sizes": [], "max_logprobs": 20,
     "moe": null}

(``moe``, for a model with fused MoE layers: ``top_k``, ``experts`` and the
token counts of the tuned config its ``fused_moe_kernel`` picks tiles by,
:func:`stepwarm.vllm_facts.moe_kernel_tuning`)

then one line per step that scheduled tokens::

    {"step": 0, "batch": 2, "tokens": 9, "finished": 0, "preempted": 0,
     "reqs": [{"r": 0, "scheduled": 5, "computed": 0, "prompt": 5, "new": true,
               "hit_blocks": 0, "sampler": {"kind": "greedy", ...}}, ...]}

``r`` is an ordinal (the order in which the scheduler first sent the
request); no token id, prompt text or request id is written. Every line is one
``os.write`` on an ``O_APPEND`` descriptor, so a line is whole or absent. At
``STEPWARM_RECORD_MAX_MB`` the recording stops with one log line; a failure
to write stops it with one log line and never reaches serving.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from stepwarm.settings import ENV_RECORD_MAX_MB, RecordSettings

logger = logging.getLogger("vllm.stepwarm")

#: The recording format's version (the header's ``stepwarm_record``).
RECORD_FORMAT = 1
#: The key of the last line written where the recording reached its cap:
#: ``{"capped": STEP}``, the step it could not write.
CAPPED_KEY = "capped"
#: Bytes kept under the cap for that line (``{"capped":`` a step number ``}``).
CAP_MARK_BYTES = 32
#: The class whose steps are recorded, as ``module:Class``.
SCHEDULER_CLASS = "vllm.v1.core.sched.scheduler:Scheduler"
#: ``config.json`` keys the header's ``config_hash`` covers: what makes two
#: models run different kernels, present in every causal LM's config.
IDENTITY_KEYS = ("architectures", "model_type", "hidden_size", "num_hidden_layers",
                 "vocab_size")
#: The sampler kinds (:func:`sampler_class`).
SAMPLER_KINDS = ("greedy", "random", "top_k", "top_p", "top_k_top_p", "pool")
#: vLLM's ``_SAMPLING_EPS``: a temperature below it samples greedily.
_SAMPLING_EPS = 1e-5


def looks_like_recording(text: str) -> bool:
    """Whether a file's text starts with a recording's header line (a
    recording given where a scenario or a traffic file was wanted)."""
    return text.lstrip("\ufeff \t\r\n").startswith('{"stepwarm_record"')


def first_header(path: str, limit: int = 1 << 16) -> dict[str, Any] | None:
    """The header line a recording at ``path`` starts with (None: no such
    file, or it starts with no header)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(limit)
        obj = json.loads(first)
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) and "stepwarm_record" in obj else None


def header_differences(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """What differs between two sessions' headers, field by field ("max_num_seqs
    8, then 4"), stepwarm's own version left out."""
    out = []
    for key in sorted(set(first) | set(other)):
        if key != "stepwarm" and first.get(key) != other.get(key):
            a, b = (json.dumps(h.get(key), separators=(",", ":")) for h in (first, other))
            out.append(f"{key} {a[:60]}, then {b[:60]}")
    return out


def model_identity(config: Mapping[str, Any]) -> dict[str, str]:
    """The header's ``model``: the first architecture and a hash of the
    :data:`IDENTITY_KEYS` of a model's config (``config.json`` as read, or
    ``PretrainedConfig.to_dict()``: the same values for those keys)."""
    archs = config.get("architectures") or ["?"]
    shape = json.dumps({k: config.get(k) for k in IDENTITY_KEYS}, sort_keys=True)
    return {"architecture": str(archs[0]),
            "config_hash": hashlib.sha256(shape.encode()).hexdigest()[:16]}


def sampler_class(sampling: Any, pooling: Any = None, structured: bool = False) -> dict[str, Any]:
    """What of a request's ``SamplingParams`` picks the sampler's kernels:
    ``kind`` (greedy, random, top_k, top_p, top_k_top_p; pool for pooling),
    ``penalties`` (presence, frequency or repetition), ``seeded`` (a
    per-request generator), ``logprobs`` / ``prompt_logprobs`` (the count,
    None when not asked) and ``structured`` (a grammar bitmask)."""
    if sampling is None:
        return {"kind": "pool", "penalties": False, "seeded": False, "logprobs": None,
                "prompt_logprobs": None, "structured": False}
    if sampling.temperature < _SAMPLING_EPS:
        kind = "greedy"
    else:
        top_k = 0 < (sampling.top_k or 0)
        top_p = (sampling.top_p if sampling.top_p is not None else 1.0) < 1.0
        kind = ("top_k_top_p" if top_k and top_p else "top_k" if top_k else
                "top_p" if top_p else "random")
    penalties = (sampling.presence_penalty != 0.0 or sampling.frequency_penalty != 0.0
                 or sampling.repetition_penalty != 1.0)
    return {"kind": kind, "penalties": bool(penalties), "seeded": sampling.seed is not None,
            "logprobs": sampling.logprobs, "prompt_logprobs": sampling.prompt_logprobs,
            "structured": bool(structured)}


def header(vllm_config: Any) -> dict[str, Any]:
    """The recording's first line, read off the engine's ``VllmConfig``."""
    from stepwarm.version import __version__
    from stepwarm import vllm_facts

    mc, sc = vllm_config.model_config, vllm_config.scheduler_config
    spec = getattr(vllm_config, "speculative_config", None)
    return {
        "stepwarm_record": RECORD_FORMAT,
        "stepwarm": __version__,
        "vllm": vllm_facts.version(),
        "model": model_identity(mc.hf_config.to_dict()),
        "block_size": int(vllm_config.cache_config.block_size),
        "max_num_seqs": int(sc.max_num_seqs),
        "max_num_batched_tokens": int(sc.max_num_batched_tokens),
        "num_spec_tokens": int(getattr(spec, "num_speculative_tokens", 0) or 0),
        "runner": vllm_facts.runner_of_config(vllm_config),
        "cudagraph_sizes": vllm_facts.cudagraph_sizes(vllm_config),
        "max_logprobs": int(getattr(mc, "max_logprobs", 20)),
        "moe": vllm_facts.moe_kernel_tuning(vllm_config),
    }


class Recorder:
    """One engine core's recording: turns each ``SchedulerOutput`` into a
    line (:meth:`scheduled`), completes it with the accepted drafts and
    appends it (:meth:`updated`).

    Args:
        path: the file appended to.
        max_bytes: the file's size at which recording stops.
        head: the header line (written before the first step).
        block_size: tokens per block, for ``hit_blocks``.
    """

    def __init__(self, path: str, max_bytes: int, head: dict[str, Any], block_size: int):
        self.path, self.max_bytes, self.head = path, max_bytes, head
        self.block_size = max(1, block_size)
        self.fd: int | None = None
        self.size = 0
        self.stopped = False
        self.head_written = False  # this session's header: a cap line belongs to it
        self.step = 0
        self.ordinals: dict[str, int] = {}
        self.next_ordinal = 0
        #: Lines waiting for their step's ``update_from_output`` (async
        #: scheduling schedules the next step first), by ``id(SchedulerOutput)``.
        self.pending: dict[int, dict[str, Any]] = {}
        #: Requests finished in steps that scheduled no token (not recorded:
        #: vLLM's scheduler sends a request's finish in the step after it, and
        #: with nothing else running that step is empty): counted in the next
        #: recorded step's ``finished``.
        self.finished_unrecorded = 0

    def scheduled(self, scheduler: Any, out: Any) -> None:
        """Note the step ``out`` that ``scheduler.schedule()`` returned."""
        if self.stopped:
            return
        for rid in out.finished_req_ids:
            self.ordinals.pop(rid, None)
        if not out.total_num_scheduled_tokens:
            self.finished_unrecorded += len(out.finished_req_ids)
            return
        new = {r.req_id: r for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        computed = dict(zip(cached.req_ids, cached.num_computed_tokens))
        computed.update((rid, r.num_computed_tokens) for rid, r in new.items())
        resumed = getattr(cached, "resumed_req_ids", None) or ()
        reqs = []
        for rid, n in out.num_scheduled_tokens.items():
            request = scheduler.requests.get(rid)
            if rid not in self.ordinals:
                self.ordinals[rid] = self.next_ordinal
                self.next_ordinal += 1
            row: dict[str, Any] = {
                "r": self.ordinals[rid], "scheduled": int(n), "computed": int(computed.get(rid, 0)),
                "prompt": int(getattr(request, "num_prompt_tokens", 0) or 0)}
            if rid in new:
                row["new"] = True
                row["hit_blocks"] = int(new[rid].num_computed_tokens) // self.block_size
                row["sampler"] = sampler_class(
                    getattr(request, "sampling_params", None), None,
                    bool(getattr(request, "use_structured_output", False)))
            if rid in resumed:
                row["resumed"] = True
            drafts = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            if drafts:
                row["drafts"] = drafts
            encoder = len(out.scheduled_encoder_inputs.get(rid, ()))
            if encoder:
                row["encoder_inputs"] = encoder
            reqs.append(row)
        self.pending[id(out)] = {
            "step": self.step, "batch": len(reqs), "tokens": int(out.total_num_scheduled_tokens),
            "finished": len(out.finished_req_ids) + self.finished_unrecorded,
            "preempted": len(getattr(out, "preempted_req_ids", None) or ()), "reqs": reqs}
        self.finished_unrecorded = 0
        self.step += 1

    def updated(self, out: Any, runner_output: Any, result: Any = None) -> None:
        """Add the drafts ``runner_output`` accepted to ``out``'s line and
        append it: those the output kept, where ``result`` (what
        ``update_from_output`` returned: per client, ``EngineCoreOutputs``)
        says a request stopped at ``max_tokens`` or a stop token with fewer
        new tokens than the runner sampled (the drafts past the stop are
        dropped, and so is the block they would fill: the plan must not
        cache it)."""
        line = self.pending.pop(id(out), None)
        if line is None or self.stopped:
            return
        from stepwarm.vllm_facts import sampled_rows

        drafted = [row for row in line["reqs"] if "drafts" in row]
        index = sampled_rows(runner_output) if drafted else {}
        sampled = getattr(runner_output, "sampled_token_ids", None) or []
        by_ordinal = {o: rid for rid, o in self.ordinals.items()} if drafted else {}
        kept = _kept_tokens(result) if drafted else {}
        for row in drafted:
            rid = by_ordinal.get(row["r"], "")
            i = index.get(rid)
            if i is not None and i < len(sampled):
                n = len(sampled[i])
                row["accepted"] = max(0, min(n, kept.get(rid, n)) - 1)
        self.write(line)

    def write(self, line: dict[str, Any]) -> None:
        """Append ``line`` (the header first) with one ``os.write``; at the cap
        or on a failure, one log line and recording stops."""
        if self.stopped:
            return
        try:
            if self.fd is None:
                # O_NONBLOCK: a FIFO with no reader fails at once (ENXIO), a full
                # one fails the write (EAGAIN): one log line, serving never waits
                self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                                  | os.O_NONBLOCK, 0o644)
                self.size = os.fstat(self.fd).st_size
                self._announce()
                self._append(self.head)
                self.head_written = True
            self._append(line)
        except _CapReached:
            self._mark_capped(int(line.get("step", 0)))
            logger.warning("stepwarm: STEPWARM_RECORD %s: reached its cap of %d bytes (%s) at "
                           "step %d; recording stopped, serving goes on", self.path,
                           self.max_bytes, ENV_RECORD_MAX_MB, line.get("step", 0))
            self.stop()
        except Exception as e:  # noqa: BLE001 - recording never fails serving
            logger.warning("stepwarm: STEPWARM_RECORD %s: cannot write (%s: %s); recording "
                           "stopped, serving goes on", self.path, type(e).__name__, e)
            self.stop()

    def _announce(self) -> None:
        """One log line as the file is opened (the first step): where the
        steps go, whether this session is appended to an earlier one, and a
        warning where the earlier session's header differs (``scenario
        from-record`` takes the sessions of one engine configuration)."""
        where = f"stepwarm: STEPWARM_RECORD: recording the scheduler's steps to {self.path}"
        cap = f"cap {self.max_bytes >> 20} MiB, {ENV_RECORD_MAX_MB}"
        if not self.size:
            logger.info("%s (a new recording; %s)", where, cap)
            return
        first = first_header(self.path)
        differs = header_differences(first, self.head) if first is not None else []
        if not differs:
            logger.info("%s (a new session appended to its %d bytes; %s)", where, self.size, cap)
            return
        logger.warning("%s: this engine's header differs from the file's first session (%s): "
                       "scenario from-record refuses this session; record into a new file "
                       "for this configuration", where, "; ".join(differs))

    def _append(self, obj: dict[str, Any]) -> None:
        data = _line(obj)
        if self.size + len(data) + CAP_MARK_BYTES > self.max_bytes:
            raise _CapReached
        assert self.fd is not None
        written = os.write(self.fd, data)
        self.size += written
        if written != len(data):
            raise OSError(f"short write: {written} of {len(data)} bytes")

    def _mark_capped(self, step: int) -> None:
        """The last line at the cap, in the room :data:`CAP_MARK_BYTES` kept
        for it: ``{"capped": STEP}`` (from-record then says the recording
        stops there). Nothing where this session wrote no header (a file
        already full from earlier sessions: the line would be theirs) or
        where it would not fit under the cap."""
        data = _line({CAPPED_KEY: step})
        if self.fd is None or not self.head_written or self.size + len(data) > self.max_bytes:
            return
        try:
            self.size += os.write(self.fd, data)
        except OSError:
            pass

    def stop(self) -> None:
        """Stop recording and close the file."""
        self.stopped = True
        self.pending.clear()
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def _line(obj: dict[str, Any]) -> bytes:
    """``obj`` as one line of the recording."""
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


class _CapReached(Exception):
    """The next line would take the file past its cap."""


def _path_for(path: str, vllm_config: Any) -> str:
    """``path``, or ``path.dpN`` on data-parallel rank N of several engines."""
    pc = getattr(vllm_config, "parallel_config", None)
    if int(getattr(pc, "data_parallel_size", 1) or 1) > 1:
        return f"{path}.dp{int(getattr(pc, 'data_parallel_rank', 0) or 0)}"
    return path


def recorder_of(scheduler: Any) -> Recorder | None:
    """The scheduler's recorder, made at its first step from
    ``STEPWARM_RECORD`` (None: off, or it could not be made: one log line)."""
    rec = scheduler.__dict__.get("_stepwarm_recorder", False)
    if rec is not False:
        return rec
    rec = None
    try:
        settings = RecordSettings.from_env()
        if settings.path is not None:
            cfg = scheduler.vllm_config
            rec = Recorder(_path_for(settings.path, cfg), settings.max_bytes, header(cfg),
                           int(getattr(scheduler, "block_size", 0) or
                               cfg.cache_config.block_size))
    except Exception as e:  # noqa: BLE001 - recording never fails serving
        logger.warning("stepwarm: STEPWARM_RECORD: not recording (%s: %s)", type(e).__name__, e)
    scheduler._stepwarm_recorder = rec
    return rec


def _guarded(what: str, fn: Any, rec: Recorder, *args: Any) -> None:
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - recording never fails serving
        logger.warning("stepwarm: STEPWARM_RECORD %s: %s failed (%s: %s); recording stopped, "
                       "serving goes on", rec.path, what, type(e).__name__, e)
        rec.stop()


def _kept_tokens(result: Any) -> dict[str, int]:
    """Request id -> new tokens ``update_from_output``'s outputs carry
    (``EngineCoreOutputs.outputs[i].new_token_ids``, per client), for the
    requests it finished; empty where ``result`` has another shape."""
    kept: dict[str, int] = {}
    for outputs in (result.values() if isinstance(result, dict) else ()):
        for o in getattr(outputs, "outputs", None) or ():
            if getattr(o, "finish_reason", None) is not None:
                kept[o.request_id] = len(o.new_token_ids or ())
    return kept


def wrap_scheduler(cls: type) -> None:
    """Wrap ``cls.schedule`` and ``cls.update_from_output`` (its own) to
    record each step. Wrapping twice is a no-op."""
    schedule, update = cls.__dict__.get("schedule"), cls.__dict__.get("update_from_output")
    if schedule is None or update is None or getattr(schedule, "_stepwarm_record", False):
        return

    @functools.wraps(schedule)
    def recorded_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = schedule(self, *args, **kwargs)
        rec = recorder_of(self)
        if rec is not None and not rec.stopped:
            _guarded("schedule", rec.scheduled, rec, self, out)
        return out

    @functools.wraps(update)
    def recorded_update(self: Any, scheduler_output: Any, model_runner_output: Any,
                        *args: Any, **kwargs: Any) -> Any:
        result = update(self, scheduler_output, model_runner_output, *args, **kwargs)
        rec = self.__dict__.get("_stepwarm_recorder")
        if rec is not None and not rec.stopped:
            _guarded("update_from_output", rec.updated, rec, scheduler_output,
                     model_runner_output, result)
        return result

    recorded_schedule._stepwarm_record = True  # type: ignore[attr-defined]
    cls.schedule = recorded_schedule  # type: ignore[attr-defined]
    cls.update_from_output = recorded_update  # type: ignore[attr-defined]


def install(env: Mapping[str, str] | None = None) -> bool:
    """Arrange for the scheduler to be recorded when ``STEPWARM_RECORD`` is
    set: its class wrapped now when its module is loaded, else when vLLM
    imports it. Imports nothing of vLLM.

    Returns:
        Whether recording is on.

    Raises:
        SettingsError: ``STEPWARM_RECORD`` or ``STEPWARM_RECORD_MAX_MB`` is bad.
    """
    if RecordSettings.from_env(env).path is None:
        return False
    from stepwarm.wrap_on_import import wrap_now_or_on_import

    wrap_now_or_on_import("record", {SCHEDULER_CLASS: wrap_scheduler})
    return True
