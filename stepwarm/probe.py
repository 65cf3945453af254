"""read_profile: a :class:`~stepwarm.profile.RunnerProfile` read off a live worker.

The runner's facts come through :class:`~stepwarm.worker_view.WorkerView`
(the one place that knows the attribute names of vLLM's V1 and V2 runners);
the vLLM config's are read here; facts that differ between vLLM releases are
probed by behaviour in :mod:`stepwarm.vllm_facts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepwarm import vllm_facts
from stepwarm.drafter import read_drafter
from stepwarm.encoder_inputs import read_image_classes
from stepwarm.profile import CacheSpec, ProfileError, RunnerProfile, SpecKind
from stepwarm.settings import role_of_kv_role

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView


#: vLLM spec class name -> kind, most specific first (subclasses before bases).
_SPEC_CLASS_KIND: tuple[tuple[str, SpecKind], ...] = (
    ("CircularBufferSpec", "circular_buffer"),
    ("CrossAttentionSpec", "cross_attention"),
    ("EncoderOnlyAttentionSpec", "encoder_only_attention"),
    ("SlidingWindowSpec", "sliding_window"),
    ("ChunkedLocalAttentionSpec", "chunked_local_attention"),
    ("MLAAttentionSpec", "mla_attention"),
    ("FullAttentionSpec", "full_attention"),
    ("MambaSpec", "mamba"),
)


def cache_spec_from_vllm(spec: Any) -> CacheSpec:
    """Convert a ``vllm.v1.kv_cache_interface.KVCacheSpec`` to a :class:`CacheSpec`.

    ``UniformTypeKVCacheSpecs`` is read through its first layer's spec
    (``first_spec``, as ``_reserved_block_count`` does; vLLM 0.26 has no
    ``first_spec``, so the first of ``kv_cache_specs``) and marked
    ``uniform_type``.

    Raises:
        ProfileError: the spec class (or none of its bases) is not one stepwarm
            knows how to reserve blocks for.
    """
    uniform = type(spec).__name__ == "UniformTypeKVCacheSpecs"
    if uniform:
        # ``first_spec`` (vLLM 0.32) is this; vLLM 0.26 has only ``kv_cache_specs``.
        spec = next(iter(spec.kv_cache_specs.values()))
    mro = [c.__name__ for c in type(spec).__mro__]
    for cls_name, kind in _SPEC_CLASS_KIND:
        if cls_name in mro:
            break
    else:
        raise ProfileError(
            f"KV cache spec {type(spec).__name__} is not supported by stepwarm "
            f"(known: {', '.join(n for n, _ in _SPEC_CLASS_KIND)})"
        )
    return CacheSpec(
        kind=kind,
        block_size=spec.block_size,
        sliding_window=getattr(spec, "sliding_window", None)
        if kind == "sliding_window"
        else None,
        attention_chunk_size=getattr(spec, "attention_chunk_size", None)
        if kind == "chunked_local_attention"
        else None,
        mamba_cache_mode=getattr(spec, "mamba_cache_mode", "none")
        if kind == "mamba"
        else "none",
        num_speculative_blocks=getattr(spec, "num_speculative_blocks", 0)
        if kind == "mamba"
        else 0,
        uniform_type=uniform,
        vllm_class=type(spec).__name__,
        zeroed=vllm_facts.records_new_block_ids(spec),
        fine_grained_hits=vllm_facts.fine_grained_hits(spec),
        checkpoint_recached=vllm_facts.checkpoint_recached() if kind == "mamba" else None,
    )


def _max_logprobs(model_config: Any) -> int:
    """``ModelConfig.max_logprobs`` (vLLM 0.26 and 0.32: default 20; -1 means
    the vocabulary), as a count of tokens."""
    n = getattr(model_config, "max_logprobs", 20)
    n = 20 if n is None else int(n)
    return int(model_config.get_vocab_size()) if n == -1 else n


def _decoder_start_token_id(model_config: Any) -> int | None:
    """An encoder-decoder model's decoder start token, as
    ``BaseRenderer.get_dec_start_token_id`` (vLLM 0.32 ``renderers/base.py``;
    0.26 the same rule) picks it: ``hf_config.decoder_start_token_id``, else
    the BOS token id (the tokenizer's there, the config's here); None for a
    decoder-only model or when neither is set."""
    if not model_config.is_encoder_decoder:
        return None
    hf = model_config.hf_config
    for name in ("decoder_start_token_id", "bos_token_id"):
        value = getattr(hf, name, None)
        if isinstance(value, int):
            return value
    return None


def read_profile(worker: WorkerView | Any) -> RunnerProfile:
    """Read a :class:`RunnerProfile` off a live vLLM worker (vLLM's worker or
    its :class:`~stepwarm.worker_view.WorkerView`).

    Works for the V1 runner and the V2 runner (the facts that differ are
    read by :class:`~stepwarm.worker_view.WorkerView`).

    Raises:
        ProfileError: the runner has no KV cache config yet (call after
            ``initialize_from_config``) or uses a spec stepwarm does not know.
    """
    import vllm

    from stepwarm.worker_view import WorkerView

    worker = WorkerView.of(worker)
    cfg = worker.vllm_config
    kv_cache_config = worker.kv_cache_config
    if kv_cache_config is None:
        raise ProfileError("the runner has no kv_cache_config yet: profile it "
                           "after the KV cache is initialized")
    model_config = cfg.model_config
    image_classes, encoder_budget, max_images = read_image_classes(worker)
    is_pooling = worker.is_pooling_model
    pooling_task = None
    if is_pooling:
        try:
            pooling_task = model_config.get_pooling_task(worker.supported_tasks())
        except Exception:
            pooling_task = None
    groups = tuple(cache_spec_from_vllm(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups)
    if not groups:
        raise ProfileError("the model has no KV cache groups (attention-free, or encoder-only): "
                           "the scheduler's steps stepwarm plans need a KV cache")
    enable_caching = bool(cfg.cache_config.enable_prefix_caching)
    vllm_facts.log_if_unchecked()
    return RunnerProfile(
        runner=worker.kind,
        vllm_version=vllm.__version__,
        model=str(model_config.model),
        kv_cache_groups=groups,
        num_blocks=worker.usable_kv_blocks(),
        max_model_len=worker.max_model_len,
        max_num_seqs=int(cfg.scheduler_config.max_num_seqs),
        max_num_batched_tokens=int(cfg.scheduler_config.max_num_batched_tokens),
        max_prefill_tokens=vllm_facts.max_prefill_tokens(cfg.scheduler_config),
        num_lookahead_tokens=int(getattr(cfg, "num_lookahead_tokens", 0) or 0),
        num_speculative_steps=worker.num_speculative_steps,
        decode_query_len=worker.decode_query_len,
        max_encoder_len=worker.max_encoder_len,
        is_pooling_model=is_pooling,
        pooling_task=pooling_task,
        is_encoder_decoder=bool(model_config.is_encoder_decoder),
        decoder_start_token_id=_decoder_start_token_id(model_config),
        is_encoder_only=bool(getattr(cfg, "is_mm_encoder_only", False)),
        is_last_pp_rank=worker.is_last_pp_rank,
        vocab_size=int(model_config.get_vocab_size()),
        max_logprobs=_max_logprobs(model_config),
        null_block_writes=worker.null_block_writes,
        mamba_cache_mode=str(getattr(cfg.cache_config, "mamba_cache_mode", "none")),
        enable_prefix_caching=enable_caching,
        zeroes_new_blocks=bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False)),
        role=role_of_kv_role(getattr(getattr(cfg, "kv_transfer_config", None), "kv_role", None)),
        image_classes=image_classes,
        encoder_budget=encoder_budget,
        max_images_per_prompt=max_images,
        drafter=read_drafter(worker),
        warmup_draft_slots=warmup_draft_slots(cfg),
        draft_slots=vllm_facts.scheduler_draft_slots(getattr(cfg, "speculative_config", None)),
        pad_spec_decode=vllm_facts.pad_spec_decode_rule(getattr(cfg, "speculative_config", None)),
        caches_after_output=bool(getattr(cfg, "speculative_config", None))
        and vllm_facts.scheduler_caches_after_output(),
        **installed_facts(worker.kind, groups, enable_caching),
    )


def warmup_draft_slots(cfg: Any) -> int:
    """The draft slots per request vLLM's warmup keeps out of the token
    budget (:attr:`RunnerProfile.warmup_draft_slots`): the speculative
    config's ``max_num_new_slots_for_drafting`` where the installed warmup
    counts them (vLLM 0.34), else 0."""
    warm = vllm_facts.warmup_facts()
    spec = getattr(cfg, "speculative_config", None)
    if spec is None or not (warm and warm.caps_draft_slots):
        return 0
    return int(getattr(spec, "max_num_new_slots_for_drafting", 0) or 0)


def installed_facts(runner: str, groups: tuple[CacheSpec, ...], enable_caching: bool) -> dict[str, Any]:
    """The :class:`RunnerProfile` fields that follow the installed vLLM
    release (:mod:`stepwarm.vllm_facts`), for a ``runner`` ("v1"/"v2") with
    ``groups``: ``grammar_rows_per_position`` (V2 runners, where vLLM's
    warmup sends ``decode_query_len`` rows per request), ``warmup_greedy_pass``, ``top_k_top_p_with_drafts``,
    ``warmup_decodes`` (where the warmup was probed), ``mamba_align_rule`` and ``unsupported``. ``profile.model_copy(update=installed_facts(...))``
    brings a saved profile to the installed release."""
    warm = vllm_facts.warmup_facts()
    return {
        "grammar_rows_per_position": runner == "v2" and bool(warm and warm.bitmask_rows_per_request > 1),
        "warmup_greedy_pass": bool(warm and warm.greedy_pass),
        "mixed_warmup_drafts": bool(warm and warm.mixed_drafts),
        "top_k_top_p_with_drafts": vllm_facts.samples_top_k_top_p_with_drafts(),
        "mamba_align_rule": "0.26" if vllm_facts.scheduler_mamba_align_rule() == "0.26" else "0.29",
        **({"warmup_decodes": dict(warm.decode_steps)} if warm and warm.decode_steps else {}),
        "unsupported": unsupported(groups, enable_caching),
    }


def unsupported(groups: tuple[CacheSpec, ...], enable_caching: bool) -> str:
    """Why stepwarm cannot run with ``groups`` on the installed vLLM ("" if
    it can): a required ``SchedulerOutput`` / ``NewRequestData`` field it does
    not know, or a Mamba cache mode the installed ``MambaManager`` refuses
    with prefix caching (vLLM's reason)."""
    try:
        vllm_facts.check_step_fields()
    except vllm_facts.VllmFactsError as e:
        return str(e)
    if enable_caching:
        refused = vllm_facts.mamba_modes_refused_with_caching()
        for g in groups:
            if g.kind == "mamba" and g.mamba_cache_mode in refused:
                return (f"vLLM {vllm_facts.version()} refuses mamba_cache_mode="
                        f"{g.mamba_cache_mode!r} with prefix caching: "
                        f"{refused[g.mamba_cache_mode]}")
    return ""
