"""RunnerProfile: the facts stepwarm plans with, as plain data.

A profile is plain data (JSON / TOML in and out; no vLLM import) so that
planning, block accounting and ``stepwarm check`` never need a running
engine. :func:`stepwarm.probe.read_profile` reads one off a live V1 or V2
runner; everything else reads the profile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from stepwarm.drafter import Drafter
from stepwarm.files import FileTooLarge, NotUtf8, read_text_capped

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


#: Largest profile file read (bytes); ``stepwarm profile`` writes a few kB.
MAX_PROFILE_BYTES = 1 << 20

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
    #: then waits for the next step. False / None: only newly cached states
    #: (0.26 - 0.31, 0.33; probed by behaviour, ``vllm_facts.checkpoint_recached``).
    checkpoint_recached: bool | None = None

    @model_validator(mode="after")
    def _window_given(self) -> CacheSpec:
        """A windowed kind carries its window (a profile written by hand could
        leave it out, and planning would fail on None)."""
        need = {"sliding_window": "sliding_window",
                "chunked_local_attention": "attention_chunk_size"}.get(self.kind)
        if need and getattr(self, need) is None:
            raise ValueError(f"a {self.kind} group needs {need} (tokens, > 0)")
        return self


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


#: vLLM 0.27 - 0.33's ``warmup_kernels`` decode steps (``RunnerProfile.
#: warmup_decodes``' default): every request, then [0, 1] and [0], each with
#: and without drafts under a speculator.
WARMUP_DECODES_0_32: dict[str, tuple[str, ...]] = {
    "plain1": ("all:N",),
    "plain2": ("all:N", "all:N", "0:N"),
    "plain3": ("all:N", "0,1:NN", "0:N"),
    "plain4": ("all:N", "0,1:NN", "0:N"),
    "spec1": ("all:S", "all:N"),
    "spec2": ("all:S", "0,1:SN", "all:N", "0:S", "0:N"),
    "spec3": ("all:S", "0,1:SN", "0,1:NN", "0:S", "0:N"),
    "spec4": ("all:S", "0,1:SN", "0,1:NN", "0:S", "0:N"),
}


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
    kv_cache_groups: tuple[CacheSpec, ...] = Field(min_length=1)
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
    #: With prefix caching off, ``BlockPool.free_blocks`` appends freed blocks
    #: to the free queue's tail (vLLM 0.27) instead of prepending them
    #: (:func:`stepwarm.vllm_facts.uncached_frees_append`).
    uncached_frees_append: bool = False
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
    #: Whether a ``GrammarOutput`` carries ``decode_query_len`` bitmask rows
    #: per structured-output request (vLLM 0.33: ``warmup_kernels`` and the V2
    #: ``StructuredOutputsWorker``'s ``mask_stride``) instead of one (<= 0.32).
    #: Read off the installed vLLM's warmup (:mod:`stepwarm.vllm_facts`).
    grammar_rows_per_position: bool = False
    #: Whether vLLM's ``warmup_kernels`` runs its sequence a second time with
    #: ``SamplingParams(temperature=0)`` under a speculator (vLLM 0.33), so
    #: ``default`` does too.
    warmup_greedy_pass: bool = False
    #: Draft slots per request that vLLM's warmup keeps free of the token
    #: budget when it caps its requests (vLLM 0.34: ``_cap_num_warmup_reqs``,
    #: ``max_num_new_slots_for_drafting``: 1 for a draft model, else 0);
    #: 0 where the installed release does not count them.
    warmup_draft_slots: int = Field(default=0, ge=0)
    #: Slots per scheduled request that vLLM's scheduler keeps out of
    #: ``max_num_batched_tokens`` for the drafter
    #: (:func:`stepwarm.vllm_facts.scheduler_draft_slots`: 1 for a draft
    #: model, else 0): a step's tokens plus this per request stay within the
    #: budget. The fact ``draft_slots``.
    draft_slots: int = Field(default=0, ge=0)
    #: How the installed scheduler pads a waiting request with one token left
    #: (a prefix hit leaving one prompt token, a resumption) to ``1 +
    #: num_speculative_steps`` tokens with placeholder drafts (``-1``) so that
    #: a decode step stays uniform (``pad_spec_decode`` in
    #: ``Scheduler.schedule``; :func:`stepwarm.vllm_facts.pad_spec_decode_rule`):
    #: "" never (no speculator, dynamic speculative decoding); "0.26" beside a
    #: scheduled running request when none of those is a prefill chunk, and
    #: a padded row past ``max_model_len`` (or the token budget) is not sent
    #: (vLLM 0.26 - 0.28); "0.29" the same, padding only where the sampled
    #: token still fits ``max_model_len`` (0.29); "0.30" also with no running
    #: request scheduled where the request has a prefix hit
    #: (``num_computed_tokens > 0``; 0.30 on).
    pad_spec_decode: Literal["", "0.26", "0.29", "0.30"] = ""
    #: Whether ``Scheduler.update_from_output`` caches a request's blocks up
    #: to its computed tokens after each output, with a speculator (vLLM 0.33
    #: on; :func:`stepwarm.vllm_facts.scheduler_caches_after_output`): a
    #: block filled by accepted drafts is a prefix-cache entry before the
    #: request's next step, so a resumption after preemption hits it.
    caches_after_output: bool = False
    #: Which prefill chunk ends vLLM's scheduler puts on a Mamba block
    #: boundary in ``align`` mode
    #: (:func:`stepwarm.vllm_facts.scheduler_mamba_align_rule`): "0.29" each
    #: before the prefill's end (vLLM 0.27 on); "0.26" only those before the
    #: request's last block boundary (vLLM 0.26: a chunk may end inside the
    #: last partial block).
    mamba_align_rule: Literal["0.26", "0.29"] = "0.29"
    #: The most tokens one prefill chunk may take (the scheduler's
    #: ``max_prefill_tokens`` in ``_mamba_block_aligned_split``:
    #: ``max_num_scheduled_tokens``, less ``long_prefill_token_threshold``
    #: where set; :func:`stepwarm.vllm_facts.max_prefill_tokens`); a Mamba
    #: block wider than it advances by sub-block chunks in ``align`` mode.
    #: 0: ``max_num_batched_tokens``.
    max_prefill_tokens: int = Field(default=0, ge=0)
    #: Whether ``run_mixed_prefill_decode_warmup``'s decode request verifies a
    #: full set of drafts (``decode_query_len`` tokens) and its prefill tokens
    #: are split across requests of at most ``max_model_len - 1`` (vLLM 0.34),
    #: instead of one decode token beside one prefill request.
    mixed_warmup_drafts: bool = False
    #: The decode steps of one ``warmup_kernels`` pass, as the installed
    #: vLLM's warmup sends them (:func:`stepwarm.vllm_facts.decode_steps`):
    #: ``"spec<n>"`` / ``"plain<n>"`` (with / without a speculator, ``n``
    #: requests, 1..4; more than 4 use ``n = 4``) -> step codes such as
    #: ``"all:S"`` or ``"0,1:SN"``. Default: vLLM 0.27 - 0.33's sequence.
    warmup_decodes: dict[str, tuple[str, ...]] = Field(
        default_factory=lambda: dict(WARMUP_DECODES_0_32))
    #: Whether top-k / top-p requests can be sampled on this runner with a
    #: speculator (:func:`stepwarm.vllm_facts.samples_top_k_top_p_with_drafts`:
    #: not on vLLM's CPU build); the need ``spec_top_k_top_p``.
    top_k_top_p_with_drafts: bool = True
    #: Why stepwarm cannot run on this runner at all, checked before any step
    #: (a step-data field it cannot fill, a cache mode vLLM refuses); "" when
    #: it can.
    unsupported: str = ""

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

    def warmup_decode_steps(self, num_reqs: int) -> tuple[str, ...]:
        """:attr:`warmup_decodes` for a pass of ``num_reqs`` requests on
        this runner (with or without its speculator)."""
        key = f"{'spec' if self.has_speculator else 'plain'}{min(max(num_reqs, 1), 4)}"
        return self.warmup_decodes.get(key, WARMUP_DECODES_0_32[key])

    @property
    def grammar_rows_per_request(self) -> int:
        """``GrammarOutput.grammar_bitmask`` rows per structured-output
        request: ``decode_query_len`` where :attr:`grammar_rows_per_position`,
        else 1."""
        return self.decode_query_len if self.grammar_rows_per_position else 1

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
        decodes = data.pop("warmup_decodes")
        lines = [f"# {ln}" for ln in header.splitlines()]
        lines += [f"{k} = {scalar(v)}" for k, v in data.items() if v is not None]
        lines += ["", "[warmup_decodes]"] + [f"{k} = {scalar(list(v))}" for k, v in decodes.items()]
        for name, rows in tables.items():
            for g in rows:
                lines += ["", f"[[{name}]]"]
                lines += [f"{k} = {scalar(v)}" for k, v in g.items() if v is not None]
        if drafter is not None:
            lines += ["", "[drafter]"] + [f"{k} = {scalar(v)}" for k, v in drafter.items()]
        return "\n".join(lines) + "\n"

    def save(self, path: str | Path) -> None:
        """Write the profile to ``path``: TOML if it ends in ``.toml``, else JSON."""
        from stepwarm.output_path import write_atomic

        path = Path(path)  # whole or not at all; a link or /dev/stdout written through
        write_atomic(path, self.to_toml() if path.suffix == ".toml" else self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> RunnerProfile:
        """Read a profile saved by :meth:`save` (``.toml``: TOML, else JSON),
        or the one a ``stepwarm run --json`` report holds.

        Raises:
            ProfileError: the file is missing, not JSON/TOML, or not a profile
                (the message names the file, the line where the parser gives
                one, and the field).
        """
        path = Path(path)
        try:
            text = read_text_capped(path, MAX_PROFILE_BYTES)
        except OSError as e:
            raise ProfileError(f"{path}: cannot read profile: {e.strerror}") from None
        except FileTooLarge:
            raise ProfileError(f"{path}: cannot read profile: more than {MAX_PROFILE_BYTES} "
                               "bytes (a saved profile is a few kB)") from None
        except NotUtf8 as e:
            raise ProfileError(f"{path}: cannot read profile: not UTF-8 (byte "
                               f"{e.byte:#04x} at offset {e.offset})") from None
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
        allowed = "allowed: a runner profile as `stepwarm profile -o FILE` writes it"
        if isinstance(data, dict) and {"configurations", "ratios"} <= set(data):
            raise ProfileError(f"{path}: a `stepwarm bench --json` report, not a runner "
                               f"profile (it holds no profile: save one with `stepwarm "
                               f"profile -o FILE`); {allowed}")
        if isinstance(data, dict) and ({"mode", "requests", "startup_compiles"} <= set(data)
                                       or {"baseline", "stepwarm"} & set(data)
                                       and all(isinstance(v, dict) and "requests" in v
                                               for v in data.values())):
            raise ProfileError(f"{path}: a `stepwarm coverage --json` report, not a runner "
                               f"profile (it holds no profile: save one with `stepwarm "
                               f"profile -o FILE`); {allowed}")
        if isinstance(data, dict) and ({"steps", "requests", "sequence"} & set(data)
                                       and "runner" not in data):
            raise ProfileError(f"{path}: a scenario file, not a runner profile (check it "
                               f"with `stepwarm check {path}`); {allowed}")
        if isinstance(data, dict) and "profile" in data and "startup_s" in data:
            # `stepwarm run --json`'s report holds the runner's profile
            if not isinstance(data["profile"], dict):
                raise ProfileError(f"{path}: a `stepwarm run --json` report whose engine did "
                                   f"not start (its profile is null); {allowed}")
            data = data["profile"]
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            # one error a field, as the CLI says several (``error: `` each),
            # what is allowed said once, after the last
            raise ProfileError("\nerror: ".join(_field_errors(e, path)) + f"; {allowed}") \
                from None


def _field_errors(e: ValidationError, path: Path) -> list[str]:
    """Every field pydantic refused, a line each, unknown keys first with the
    known key they were probably meant to be (at most 20, then how many more)."""
    import difflib

    errors = sorted(e.errors(), key=lambda x: x["type"] != "extra_forbidden")
    # a list too short because an item of it was refused: the item's error says it
    # (the second fresh trial: block_size 0 also gave "at least 1 item")
    errors = [x for x in errors if not (x["type"] == "too_short" and any(
        len(y["loc"]) > len(x["loc"]) and tuple(y["loc"][:len(x["loc"])]) == tuple(x["loc"])
        for y in errors))]
    lines = []
    meant: set[tuple] = set()  # keys a did-you-mean names: their "missing" goes unsaid
    for err in errors:
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "missing" and tuple(err["loc"]) in meant:
            continue
        if err["type"] == "extra_forbidden":
            model: Any = RunnerProfile
            for part in err["loc"][:-1]:  # the nested model the key sits in, where one is
                field = getattr(model, "model_fields", {}).get(part)
                model = getattr(field, "annotation", None) if field else None
            known = list(getattr(model, "model_fields", {}) or [])
            close = difflib.get_close_matches(str(err["loc"][-1]), known, n=1)
            meant.update((*err["loc"][:-1], c) for c in close)
            lines.append(f"{path}: field {loc!r}: unknown key"
                         + (f" (did you mean {close[0]!r}?)" if close else ""))
        else:
            lines.append(f"{path}: field {loc!r}: {err['msg'].removeprefix('Value error, ')}")
    if len(lines) > 20:
        lines = lines[:20] + [f"{path}: {len(lines) - 20} more error(s) not shown"]
    return lines


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
    tomllib = _tomllib()

    # beside this module, not importlib.resources: a folder named stepwarm
    # in the working directory (a clone) would be read as the package's
    text = (Path(__file__).with_name("profiles") / "tiny-llama.toml").read_text(encoding="utf-8")
    return RunnerProfile.model_validate(tomllib.loads(text))


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names file and field."""
