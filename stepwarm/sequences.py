"""vLLM's own warmup sequences, as stepwarm plans.

:func:`warmup_kernels_plan` is ``vllm.v1.worker.gpu.warmup.warmup_kernels``
and :func:`mixed_prefill_decode_plan` is
``run_mixed_prefill_decode_warmup``, step for step, expressed with
:class:`~stepwarm.plan.PlanBuilder` so that every block id comes from the
ledger. The built-in ``default`` scenario is these two plans back to back.
"""

from __future__ import annotations

from stepwarm.blocks import ReservationContext, reserved_blocks_per_group
from stepwarm.plan import REQ_ID_PREFIX, Plan, PlanBuilder, PlannedRequest
from stepwarm.profile import RunnerProfile


def max_warmup_requests(profile: RunnerProfile, prompt_len: int, decode_len: int) -> int:
    """How many requests vLLM's warmup sends at once.

    ``min(max_num_seqs, max_num_batched_tokens // (max(prompt_len,
    decode_query_len) + warmup_draft_slots), (num_blocks - 1) //
    blocks_per_request)`` (the draft slots: vLLM 0.34), where
    ``blocks_per_request`` is the worst case over the warmup (all groups, at
    ``decode_len`` tokens); the block cap is skipped when the request holds
    no blocks or the runner redirects writes to the null block. At least 1.
    """
    n = min(
        profile.max_num_seqs,
        profile.max_num_batched_tokens
        // (max(prompt_len, profile.decode_query_len) + profile.warmup_draft_slots),
    )
    per_req = sum(
        reserved_blocks_per_group(decode_len, profile.kv_cache_groups, ReservationContext.of(profile))
    )
    if per_req > 0 and not profile.null_block_writes:
        n = min(n, max(1, (profile.num_blocks - 1) // per_req))
    return max(1, n)


def warmup_kernels_plan(profile: RunnerProfile, builder: PlanBuilder | None = None) -> Plan:
    """vLLM's ``warmup_kernels`` sequence for ``profile``.

    Steps: prefill every request with ``decode_query_len + 1`` tokens (sampled
    with an all-ones bitmask on the last PP rank); the decode steps the
    installed vLLM's warmup sends (``profile.warmup_decodes``; vLLM 0.27 -
    0.33: decode all; then, with two or more requests, decode [0, 1] with
    spec and non-spec mixed (and both non-spec under a speculator); decode
    [0] alone (and [0] without drafts under a speculator); vLLM 0.26: decode
    all once); cleanup. Where the installed vLLM's warmup does
    (``profile.warmup_greedy_pass``, vLLM 0.33) the pass runs again under a
    speculator with ``SamplingParams(temperature=0)``. Pooling models: the
    prefill and cleanup only.
    Encoder-only models: an empty plan.

    Args:
        builder: append to this builder (its requests stay live) instead of
            a fresh one; the returned plan is then the builder's whole plan.
    """
    b = builder or PlanBuilder(profile, name="warmup_kernels", draft_slots=profile.warmup_draft_slots)
    if profile.is_encoder_only:
        return Plan(name=b.name, requests=(), steps=(), skipped="encoder-only model: vLLM warms no step")
    _warmup_pass(b, profile, "warmup", REQ_ID_PREFIX)
    if profile.warmup_greedy_pass and profile.has_speculator and not profile.is_pooling_model:
        # vLLM 0.33: "Greedy batches skip logits processing, so rejection
        # kernels also see model-dtype logits instead of FP32."
        _warmup_pass(b, profile, (("temperature", 0.0),), f"{REQ_ID_PREFIX}greedy_",
                     " (greedy)")
    return b.build()


def _warmup_pass(b: PlanBuilder, profile: RunnerProfile, sampling: str | tuple[tuple[str, float], ...],
                 prefix: str, suffix: str = "") -> None:
    """One pass of ``_warmup_kernels``: prefill, the decodes, cleanup, with
    every request sampled with ``sampling``."""
    num_spec = profile.num_speculative_steps
    dql = profile.decode_query_len
    prompt_len = dql + 1
    # vLLM sizes the blocks for every request advancing decode_query_len on
    # each of the pass's decode steps (the longest pass of the release: 5
    # under a speculator on vLLM 0.27 - 0.33, 3 without; 1 on 0.26).
    num_decode_steps = 1 if profile.is_pooling_model else max(
        len(profile.warmup_decode_steps(n)) for n in range(1, 5))
    decode_len = prompt_len + num_decode_steps * dql
    num_reqs = max_warmup_requests(profile, prompt_len, decode_len)
    ids = [f"{prefix}{i}_" for i in range(num_reqs)]
    for i, rid in enumerate(ids):
        b.add_request(
            PlannedRequest(
                req_id=rid,
                prompt_len=prompt_len,
                kind="pool" if profile.is_pooling_model else "sample",
                # vLLM registers a dummy encoder input per request and
                # schedules no encoder (0.26 - 0.33): cross-attention over
                # max_encoder_len tokens, in one prefill step.
                encoder_len=profile.max_encoder_len if profile.is_encoder_decoder else 0,
                encoder_cached=profile.is_encoder_decoder,
                name="greedy" if suffix else "req", index=i,
                sampling=sampling,
            )
        )
    # vLLM samples the prefill with an all-ones bitmask (the structured-output
    # kernel) and the decodes without one.
    b.step("prefill", f"prefill {num_reqs} x {prompt_len}{suffix}", prefill={r: prompt_len for r in ids},
           grammar=not profile.is_pooling_model)
    if not profile.is_pooling_model:
        for n, code in enumerate(profile.warmup_decode_steps(num_reqs)):
            label, decode = _decode_step(code, ids, num_spec, first=n == 0)
            kind = "spec_decode" if any(decode.values()) else "decode"
            if any(decode.values()) and not all(decode.values()):
                kind = "mixed_decode"
            b.step(kind, f"decode {label}{suffix}", decode=decode)
    b.step("cleanup", "cleanup" + suffix, finish=tuple(ids))


def _decode_step(code: str, ids: list[str], num_spec: int, first: bool) -> tuple[str, dict[str, int]]:
    """A decode step of ``RunnerProfile.warmup_decodes`` (``"all:S"``,
    ``"0,1:SN"``) over the pass's requests ``ids``: its label ("all" for a
    first step over every request, else the indices, with "spec+non-spec" /
    "non-spec" under a speculator) and request -> drafts."""
    who, flags = code.split(":")
    idx = list(range(len(ids))) if who == "all" else [int(i) for i in who.split(",")]
    if len(flags) == 1:
        flags *= len(idx)
    decode = {ids[i]: num_spec if f == "S" else 0 for i, f in zip(idx, flags)}
    label = "all" if first and len(idx) == len(ids) else f"[{','.join(map(str, idx))}]"
    if num_spec and "N" in flags:
        label += " spec+non-spec" if "S" in flags else " non-spec"
    return label, decode


def mixed_prefill_decode_plan(
    profile: RunnerProfile, num_tokens: int = 16, builder: PlanBuilder | None = None
) -> Plan:
    """vLLM's ``run_mixed_prefill_decode_warmup`` for ``profile``.

    A decode request is prefilled with 2 tokens and sampled; then one step
    decodes it beside new requests prefilling the rest of ``num_tokens``;
    cleanup. ``num_tokens`` is capped at ``max_num_batched_tokens`` and
    ``max_model_len`` as ``mixed_batch_attention_warmup`` does. vLLM 0.26 -
    0.33: the decode is 1 token, beside one prefill of ``num_tokens - 1``.
    vLLM 0.34 (``profile.mixed_warmup_drafts``): the decode verifies a full
    set of drafts (``decode_query_len`` tokens), the prefill tokens are split
    across requests of at most ``max_model_len - 1`` (one slot per request
    of ``max_num_seqs``), the budget keeps every request's draft slots free,
    and prefills the blocks cannot hold are dropped, the last first.

    Returns:
        The plan, or an empty plan with ``skipped`` set where vLLM skips it
        (pooling model, ``max_num_seqs < 2``, fewer than 3 tokens, or too few
        blocks).
    """
    b = builder or PlanBuilder(profile, name="mixed_prefill_decode",
                                draft_slots=profile.warmup_draft_slots)
    num_tokens = min(num_tokens, profile.max_num_batched_tokens, profile.max_model_len)
    drafts = profile.num_speculative_steps if profile.mixed_warmup_drafts else 0
    decode_tokens = 1 + drafts
    max_prefill = profile.max_model_len - 1 if profile.mixed_warmup_drafts else num_tokens
    if profile.mixed_warmup_drafts and profile.max_num_seqs >= 2:
        num_prefills = min(-(-(num_tokens - decode_tokens) // max_prefill), profile.max_num_seqs - 1)
        num_tokens = min(num_tokens, decode_tokens + num_prefills * max_prefill)
        if profile.has_speculator:
            num_tokens = min(num_tokens, profile.max_num_batched_tokens
                             - (1 + num_prefills) * profile.warmup_draft_slots)
    why = ""
    if profile.is_pooling_model:
        why = "pooling model"
    elif profile.max_num_seqs < 2:
        why = "max_num_seqs < 2"
    elif num_tokens < 3:
        why = f"num_tokens {num_tokens} < 3"
    prefills: list[int] = []
    if not why:
        ctx = ReservationContext.of(profile)
        rest = num_tokens - decode_tokens
        prefills = [min(max_prefill, rest - i) for i in range(0, rest, max_prefill)]
        blocks = [sum(reserved_blocks_per_group(n, profile.kv_cache_groups, ctx)) for n in prefills]
        need = sum(reserved_blocks_per_group(2 + decode_tokens, profile.kv_cache_groups, ctx)) + sum(blocks)
        while profile.num_blocks <= need and len(prefills) > 1:  # vLLM 0.34 drops the last
            prefills.pop()
            need -= blocks.pop()
        if profile.num_blocks <= need:
            why = f"only {profile.num_blocks} KV blocks for {need} required"
    if why:
        return Plan(name=b.name, requests=(), steps=(), skipped=why)
    dec = f"{REQ_ID_PREFIX}mixed_decode_"
    pre = [f"{REQ_ID_PREFIX}mixed_prefill_" + (f"{i}_" if profile.mixed_warmup_drafts else "")
           for i in range(len(prefills))]
    b.add_request(PlannedRequest(dec, 2, sampling="greedy", name="mixed_decode"))
    for rid, n in zip(pre, prefills):
        b.add_request(PlannedRequest(rid, n, sampling="greedy", name="mixed_prefill"))
    b.step("prefill", "prefill decode request (2)", prefill={dec: 2})
    label = " + ".join(map(str, prefills))
    b.step("mixed_prefill_decode", f"decode {decode_tokens} + prefill {label}",
           decode={dec: drafts}, prefill=dict(zip(pre, prefills)))
    b.step("cleanup", "cleanup", finish=(dec, *pre))
    return b.build()


def default_plan(profile: RunnerProfile) -> Plan:
    """The ``default`` scenario: :func:`warmup_kernels_plan` then
    :func:`mixed_prefill_decode_plan`, as one plan."""
    b = PlanBuilder(profile, name="default", draft_slots=profile.warmup_draft_slots)
    first = warmup_kernels_plan(profile, b)
    if first.skipped:
        return Plan(name="default", requests=(), steps=(), skipped=first.skipped)
    mixed = mixed_prefill_decode_plan(profile, builder=b)
    return mixed if not mixed.skipped else b.build()
