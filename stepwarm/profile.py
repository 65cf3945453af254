"""RunnerProfile: the facts stepwarm plans with, read off a V1 or V2 runner.

A profile is plain data (JSON in/out) so that planning, block accounting and
``stepwarm check`` never need a running engine. :func:`read_profile` is the one
adapter that knows the attribute names of vLLM's V1 runner
(``vllm/v1/worker/gpu_model_runner.py``, also the CPU runner) and V2 runner
(``vllm/v1/worker/gpu/model_runner.py``); everything else reads the profile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stepwarm.drafter import Drafter, read_drafter
from stepwarm.settings import role_of_kv_role

#: The KV cache spec kinds stepwarm knows, named after vLLM's spec classes.
SpecKind = Literal[
    "full_attention",  # FullAttentionSpec (and SinkFullAttentionSpec, RSWASpec)
    "mla_attention",  # MLAAttentionSpec
    "sliding_window",  # SlidingWindowSpec (and SlidingWindowMLASpec)
    "chunked_local_attention",  # ChunkedLocalAttentionSpec
    "circular_buffer",  # CircularBufferSpec
    "mamba",  # MambaSpec
    "cross_attention",  # CrossAttentionSpec
    "encoder_only_attention",  # EncoderOnlyAttentionSpec
]


class CacheSpec(BaseModel):
    """One KV cache group's spec, as block accounting needs it.

    Mirrors the fields of ``vllm.v1.kv_cache_interface.KVCacheSpec`` subclasses
    that change how many blocks ``KVCacheManager.allocate_slots`` holds.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: SpecKind
    #: Tokens per block (``KVCacheSpec.block_size``).
    block_size: int = Field(gt=0)
    #: Tokens, for ``sliding_window`` (``SlidingWindowSpec.sliding_window``).
    sliding_window: int | None = Field(default=None, gt=0)
    #: Tokens, for ``chunked_local_attention``.
    attention_chunk_size: int | None = Field(default=None, gt=0)
    #: ``MambaSpec.mamba_cache_mode``: "none", "all" or "align".
    mamba_cache_mode: Literal["none", "all", "align"] = "none"
    #: Blocks, ``MambaSpec.num_speculative_blocks``.
    num_speculative_blocks: int = Field(default=0, ge=0)
    #: True when the group's spec is a ``UniformTypeKVCacheSpecs`` (this
    #: spec is its ``first_spec``).
    uniform_type: bool = False
    #: The vLLM class name, for reports only.
    vllm_class: str = ""
    #: Whether the scheduler's manager for this group records its new blocks
    #: for ``new_block_ids_to_zero`` (``SingleTypeKVCacheManager.
    #: _record_new_block_ids`` with zeroing on), as the installed vLLM decides
    #: it (0.32: every attention spec but circular buffers; 0.26: full and MLA
    #: attention only). None: stepwarm's default (full, MLA, sliding window,
    #: chunked local and cross-attention groups).
    zeroed: bool | None = None
    #: Whether the scheduler's manager for this group takes prefix-cache hits
    #: finer than its own block (``SingleTypeKVCacheManager.
    #: supports_fine_grained_hash_lookup``, vLLM 0.32: full, MLA and Mamba).
    #: None: the installed vLLM does not ask (0.26), or stepwarm's default
    #: (as 0.32).
    fine_grained_hits: bool | None = None
    #: Mamba ``align`` groups: whether the scheduler's ``MambaManager`` marks
    #: the state block at the prompt's checkpoint (``prompt_len - 1`` rounded
    #: down to the hash block, ``get_mamba_prefill_checkpoint_position``) as
    #: cached in *every* step whose cacheable prefix ends there, not only in
    #: the step that first caches it (vLLM 0.32). A hit ending on that state
    #: then waits for the next step. None: only newly cached states (0.26).
    checkpoint_recached: bool | None = None


class ImageClass(BaseModel):
    """One shape a multimodal model's processor resizes images to: one encoder
    batch shape, one number of placeholder tokens (see
    :mod:`stepwarm.encoder_inputs`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Side (pixels) of the smallest square dummy image the processor gives
    #: this shape.
    side: int = Field(gt=0)
    #: Encoder output tokens of one image (the placeholder's embeddings):
    #: what the encoder budget counts.
    tokens: int = Field(gt=0)
    #: Length (tokens) of the processor's one-image dummy prompt: the
    #: placeholders plus the processor's own markers.
    prompt_tokens: int = Field(gt=0)


class RunnerProfile(BaseModel):
    """Everything stepwarm plans with, read off one worker's model runner.

    Token counts are in tokens, ``num_blocks`` in blocks (block 0 is vLLM's
    null block, so ``num_blocks - 1`` are usable).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: "v1" (``GPUModelRunner`` in ``gpu_model_runner.py``, also on CPU) or
    #: "v2" (``vllm/v1/worker/gpu/model_runner.py``).
    runner: Literal["v1", "v2"]
    vllm_version: str = ""
    model: str = ""
    kv_cache_groups: tuple[CacheSpec, ...]
    num_blocks: int = Field(ge=0)
    max_model_len: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    max_num_batched_tokens: int = Field(gt=0)
    #: ``VllmConfig.num_lookahead_tokens``: slots reserved past the scheduled
    #: tokens for the speculator's drafts.
    num_lookahead_tokens: int = Field(default=0, ge=0)
    #: ``num_speculative_tokens`` (0: no speculator).
    num_speculative_steps: int = Field(default=0, ge=0)
    #: Tokens per request in a uniform decode step; derived as
    #: ``1 + num_speculative_steps`` when left out.
    decode_query_len: int = Field(default=1, gt=0)
    #: Encoder tokens per request for encoder-decoder models (0 otherwise).
    max_encoder_len: int = Field(default=0, ge=0)
    is_pooling_model: bool = False
    pooling_task: str | None = None
    is_encoder_decoder: bool = False
    #: Encoder-decoder models: the token every decoder prompt starts with
    #: (``BaseRenderer.get_dec_start_token_id``: ``decoder_start_token_id``,
    #: else ``bos_token_id``); vLLM's front end prepends it to a decoder prompt
    #: that does not start with it. None for other models.
    decoder_start_token_id: int | None = Field(default=None, ge=0)
    #: ``VllmConfig.is_mm_encoder_only``: vLLM's warmup runs no step.
    is_encoder_only: bool = False
    is_last_pp_rank: bool = True
    vocab_size: int = Field(gt=0)
    #: ``ModelConfig.max_logprobs``: the most ``logprobs`` / ``prompt_logprobs``
    #: a request may ask for (vLLM's -1, the whole vocabulary, is stored as
    #: ``vocab_size``).
    max_logprobs: int = Field(default=20, ge=0)
    #: V2 ``BlockTables.redirect_writes_to_null_block``: block 0 may be reused,
    #: so the ``num_blocks`` cap on the request count does not apply.
    null_block_writes: bool = False
    #: The Mamba cache mode of the cache config ("none" with no Mamba layers).
    mamba_cache_mode: str = "none"
    enable_prefix_caching: bool = False
    #: ``KVCacheConfig.needs_kv_cache_zeroing`` (Mamba layers, mixed-precision
    #: caches): the scheduler sends new attention blocks in
    #: ``SchedulerOutput.new_block_ids_to_zero`` and the worker zeroes them.
    zeroes_new_blocks: bool = False
    #: The worker's role in disaggregated serving: "prefill"
    #: (``kv_role = "kv_producer"``), "decode" (``"kv_consumer"``) or "both"
    #: (``"kv_both"`` or no KV transfer). Scenarios say which roles they are for.
    role: Literal["prefill", "decode", "both"] = "both"
    #: Image-size classes of a multimodal model's processor, smallest first
    #: (empty: no image input).
    image_classes: tuple[ImageClass, ...] = ()
    #: Encoder tokens one step may run (``MultiModalBudget.get_encoder_budget()``:
    #: the scheduler's encoder compute budget and encoder cache size, the
    #: smaller), for images and an encoder-decoder's encoder inputs alike
    #: (0: unknown, no limit applied).
    encoder_budget: int = Field(default=0, ge=0)
    #: ``mm_max_items_per_prompt["image"]``: images one prompt may carry.
    max_images_per_prompt: int = Field(default=0, ge=0)
    #: The speculator's drafter: method, drafts, its KV cache layers and
    #: groups, lookahead (None: no speculator, or a profile saved before
    #: stepwarm recorded it).
    drafter: Drafter | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_decode_query_len(cls, data: Any) -> Any:
        if isinstance(data, dict) and "decode_query_len" not in data:
            spec = data.get("num_speculative_steps", 0)
            if isinstance(spec, int) and spec >= 0:
                data = {**data, "decode_query_len": 1 + spec}
        return data

    @property
    def has_speculator(self) -> bool:
        """Whether a speculator is configured (``num_speculative_steps > 0``)."""
        return self.num_speculative_steps > 0

    @property
    def has_mamba_align(self) -> bool:
        """Whether any group is a Mamba group in ``align`` cache mode."""
        return any(
            g.kind == "mamba" and g.mamba_cache_mode == "align"
            for g in self.kv_cache_groups
        )

    def zeroes_group(self, group: int) -> bool:
        """Whether new blocks of KV cache group ``group`` are zeroed: with
        :attr:`zeroes_new_blocks`, attention groups but not circular buffers,
        Mamba or uniform-type groups (``SingleTypeKVCacheManager``'s
        ``_record_new_block_ids``)."""
        spec = self.kv_cache_groups[group]
        if not self.zeroes_new_blocks:
            return False
        if spec.zeroed is not None:
            return spec.zeroed
        return spec.kind not in ("mamba", "circular_buffer", "encoder_only_attention")

    @property
    def bitmask_width(self) -> int:
        """int32 words per request in a structured-output bitmask:
        ``ceil(vocab_size / 32)``."""
        return (self.vocab_size + 31) // 32

    def to_json(self) -> str:
        """The profile as indented JSON text."""
        return self.model_dump_json(indent=2) + "\n"

    def to_toml(self, header: str = "") -> str:
        """The profile as TOML text (``None`` fields left out: they are the
        defaults), optionally after ``header`` as comment lines."""

        def scalar(v: Any) -> str:
            return ("true" if v else "false") if isinstance(v, bool) else json.dumps(v)

        data = self.model_dump()
        tables = {k: data.pop(k) for k in ("kv_cache_groups", "image_classes")}
        drafter = data.pop("drafter")
        lines = [f"# {ln}" for ln in header.splitlines()]
        lines += [f"{k} = {scalar(v)}" for k, v in data.items() if v is not None]
        for name, rows in tables.items():
            for g in rows:
                lines += ["", f"[[{name}]]"]
                lines += [f"{k} = {scalar(v)}" for k, v in g.items() if v is not None]
        if drafter is not None:
            lines += ["", "[drafter]"] + [f"{k} = {scalar(v)}" for k, v in drafter.items()]
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the profile to ``path``: TOML if it ends in ``.toml``, else JSON."""
        path = Path(path)
        path.write_text(self.to_toml() if path.suffix == ".toml" else self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RunnerProfile:
        """Read a profile saved by :meth:`save` (``.toml``: TOML, else JSON).

        Raises:
            ProfileError: the file is missing, not JSON/TOML, or not a profile
                (the message names the file, the line where the parser gives
                one, and the field).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ProfileError(f"{path}: cannot read profile: not UTF-8 (byte "
                               f"{e.object[e.start]:#04x} at offset {e.start})") from None
        if path.suffix == ".toml":
            tomllib = _tomllib()

            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise ProfileError(f"{path}: not TOML: {e}") from None
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ProfileError(
                    f"{path}:{e.lineno}: not JSON: {e.msg} (column {e.colno})"
                ) from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ProfileError(
                f"{path}: field {loc!r}: {first['msg']} "
                f"({len(e.errors())} error(s) in all)"
            ) from None


def _tomllib() -> Any:
    """``tomllib`` (Python >= 3.11), or ``tomli`` before it."""
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return tomllib


def tiny_profile() -> RunnerProfile:
    """The runner profile of the embedded tiny Llama under stepwarm's default
    engine arguments on the CPU build (``stepwarm profile`` output, packaged as
    ``stepwarm/profiles/tiny-llama.toml``), so ``check`` and ``show`` need no
    engine."""
    from importlib import resources

    tomllib = _tomllib()

    text = (resources.files("stepwarm") / "profiles" / "tiny-llama.toml").read_text(encoding="utf-8")
    return RunnerProfile.model_validate(tomllib.loads(text))


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names file and field."""


# --------------------------------------------------------------------------
# Adapter: vLLM objects -> profile. The only code here that touches vLLM.

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
        zeroed=_records_new_block_ids(spec),
        fine_grained_hits=_fine_grained_hits(spec),
        checkpoint_recached=_checkpoint_recached() if kind == "mamba" else None,
    )


def _checkpoint_recached() -> bool | None:
    """Whether the installed vLLM's ``MambaManager`` re-marks the prompt
    checkpoint's state as cached in every step that ends there: vLLM 0.32
    keys Mamba checkpoints by ``get_mamba_prefill_checkpoint_position``
    (``_cache_partial_tail_block`` then re-registers the block each such
    step); 0.26 has no such function and marks new states only."""
    try:
        from vllm.v1 import kv_cache_interface
    except Exception:
        return None
    return True if hasattr(kv_cache_interface, "get_mamba_prefill_checkpoint_position") else None


def _fine_grained_hits(spec: Any) -> bool | None:
    """``supports_fine_grained_hash_lookup`` of the installed vLLM's manager
    class for ``spec`` (vLLM 0.32), or None when that vLLM has no such
    attribute (0.26: partial hash hits do not ask the other managers) or no
    manager for the spec."""
    try:
        from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

        manager = KVCacheSpecRegistry.get_manager_class(spec, None)
    except Exception:  # vLLM 0.26 has no registry (and no such check)
        return None
    flag = getattr(manager, "supports_fine_grained_hash_lookup", None)
    return None if flag is None else bool(flag)


def _records_new_block_ids(spec: Any) -> bool | None:
    """Whether the installed vLLM's scheduler manager for ``spec`` (a
    scheduler-side spec: a uniform-type group's first layer spec) records new
    block ids for zeroing when the config needs zeroing: builds the manager
    (``get_manager_for_kv_cache_spec`` over a 2-block ``BlockPool``) and reads
    its ``_record_new_block_ids``. None when the installed vLLM cannot build
    it that way (no manager for the spec, another signature)."""
    try:
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.single_type_kv_cache_manager import get_manager_for_kv_cache_spec

        manager = get_manager_for_kv_cache_spec(
            spec, max_in_flight_tokens=1, max_model_len=spec.block_size,
            block_pool=BlockPool(2, False, spec.block_size), enable_caching=False,
            kv_cache_group_id=0, scheduler_block_size=spec.block_size,
            needs_kv_cache_zeroing=True,
        )
    except Exception:
        return None
    flag = getattr(manager, "_record_new_block_ids", None)
    return None if flag is None else bool(flag)


def runner_of(worker: Any) -> Any:
    """The model runner behind a vLLM worker (``worker.model_runner``)."""
    return getattr(worker, "model_runner", worker)


def runner_kind(runner: Any) -> Literal["v1", "v2"]:
    """"v2" for ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, else "v1"."""
    v2 = any(c.__module__ == "vllm.v1.worker.gpu.model_runner" for c in type(runner).__mro__)
    return "v2" if v2 else "v1"


def _is_last_pp_rank(runner: Any) -> bool:
    if hasattr(runner, "is_last_pp_rank"):
        return bool(runner.is_last_pp_rank)
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return bool(get_pp_group().is_last_rank)
    except Exception:  # pragma: no cover - no distributed state at all
        return True


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


def read_profile(worker: Any) -> RunnerProfile:
    """Read a :class:`RunnerProfile` off a live vLLM worker (or model runner).

    Works for the V1 runner (``num_spec_tokens``, ``uniform_decode_query_len``,
    ``max_encoder_len``) and the V2 runner (``num_speculative_steps``,
    ``decode_query_len``, ``model_state.max_encoder_len``).

    Raises:
        ProfileError: the runner has no KV cache config yet (call after
            ``initialize_from_config``) or uses a spec stepwarm does not know.
    """
    import vllm

    runner = runner_of(worker)
    kind = runner_kind(runner)
    cfg = runner.vllm_config
    kv_cache_config = getattr(runner, "kv_cache_config", None)
    if kv_cache_config is None:
        raise ProfileError("the runner has no kv_cache_config yet: profile it "
                           "after the KV cache is initialized")
    if kind == "v2":
        num_spec = int(runner.num_speculative_steps)
        decode_query_len = int(runner.decode_query_len)
        max_encoder_len = int(getattr(runner.model_state, "max_encoder_len", 0) or 0)
        block_tables = getattr(runner, "block_tables", None)
        null_block_writes = bool(
            block_tables is not None
            and getattr(block_tables, "redirect_writes_to_null_block", False)
        )
    else:
        num_spec = int(getattr(runner, "num_spec_tokens", 0))
        decode_query_len = int(getattr(runner, "uniform_decode_query_len", 1 + num_spec))
        max_encoder_len = int(getattr(runner, "max_encoder_len", 0) or 0)
        null_block_writes = False
    model_config = cfg.model_config
    from stepwarm.encoder_inputs import read_image_classes

    image_classes, encoder_budget, max_images = read_image_classes(runner)
    is_pooling = bool(runner.is_pooling_model)
    pooling_task = None
    if is_pooling:
        try:
            pooling_task = model_config.get_pooling_task(runner.get_supported_tasks())
        except Exception:
            pooling_task = None
    return RunnerProfile(
        runner=kind,
        vllm_version=vllm.__version__,
        model=str(model_config.model),
        kv_cache_groups=tuple(
            cache_spec_from_vllm(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups
        ),
        num_blocks=int(kv_cache_config.num_blocks),
        max_model_len=int(runner.max_model_len),
        max_num_seqs=int(cfg.scheduler_config.max_num_seqs),
        max_num_batched_tokens=int(cfg.scheduler_config.max_num_batched_tokens),
        num_lookahead_tokens=int(getattr(cfg, "num_lookahead_tokens", 0) or 0),
        num_speculative_steps=num_spec,
        decode_query_len=decode_query_len,
        max_encoder_len=max_encoder_len,
        is_pooling_model=is_pooling,
        pooling_task=pooling_task,
        is_encoder_decoder=bool(model_config.is_encoder_decoder),
        decoder_start_token_id=_decoder_start_token_id(model_config),
        is_encoder_only=bool(getattr(cfg, "is_mm_encoder_only", False)),
        is_last_pp_rank=_is_last_pp_rank(runner),
        vocab_size=int(model_config.get_vocab_size()),
        max_logprobs=_max_logprobs(model_config),
        null_block_writes=null_block_writes,
        mamba_cache_mode=str(getattr(cfg.cache_config, "mamba_cache_mode", "none")),
        enable_prefix_caching=bool(cfg.cache_config.enable_prefix_caching),
        zeroes_new_blocks=bool(getattr(kv_cache_config, "needs_kv_cache_zeroing", False)),
        role=role_of_kv_role(getattr(getattr(cfg, "kv_transfer_config", None), "kv_role", None)),
        image_classes=image_classes,
        encoder_budget=encoder_budget,
        max_images_per_prompt=max_images,
        drafter=read_drafter(runner, kv_cache_config),
    )
