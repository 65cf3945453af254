"""Hypothesis strategies: KV cache configs vLLM accepts, and runner profiles.

:func:`kv_configs` draws a :class:`KVConfig`: 1-4 KV cache groups mixing full,
MLA, sliding window, chunked local, circular buffer, Mamba (cache mode
none/all/align, 0-3 speculative blocks), cross-attention and encoder-only
attention, any of them possibly a ``UniformTypeKVCacheSpecs``; block sizes
1-256 (powers of two and not); ``max_model_len``; ``num_lookahead_tokens``
0-8; ``max_encoder_len``; prefix caching on or off; ``num_blocks`` from tight
to ample.

Only combinations vLLM accepts are kept; :func:`why_invalid` names the reason
for each rejected one (recorded with ``hypothesis.event`` and rejected with
``assume``), so nothing is dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import assume, event
from hypothesis import strategies as st

from stepwarm import vllm_facts
from stepwarm.blocks import cdiv
from stepwarm.probe import cache_spec_from_vllm
from stepwarm.profile import CacheSpec, RunnerProfile

#: Kind -> the vLLM spec class the oracle builds for it.
SPEC_CLASS = {
    "full_attention": "FullAttentionSpec", "mla_attention": "MLAAttentionSpec",
    "sliding_window": "SlidingWindowSpec", "chunked_local_attention": "ChunkedLocalAttentionSpec",
    "circular_buffer": "CircularBufferSpec", "cross_attention": "CrossAttentionSpec",
    "encoder_only_attention": "EncoderOnlyAttentionSpec", "mamba": "MambaSpec",
}


def missing_kinds() -> dict[str, str]:
    """Kinds the installed vLLM has no spec class for -> why they are skipped
    (vLLM 0.26 has no ``CircularBufferSpec``)."""
    import vllm
    from vllm.v1 import kv_cache_interface

    return {
        kind: f"vLLM {vllm.__version__} has no {cls}"
        for kind, cls in SPEC_CLASS.items() if not hasattr(kv_cache_interface, cls)
    }


_MISSING = missing_kinds()
ATTENTION_KINDS = tuple(k for k in (
    "full_attention", "mla_attention", "sliding_window", "chunked_local_attention",
    "circular_buffer", "cross_attention", "encoder_only_attention",
) if k not in _MISSING)
#: Every kind the installed vLLM can build (strategies draw only these).
ALL_KINDS = ATTENTION_KINDS + ("mamba",)
#: vLLM spec classes the strategies build (by kind): FullAttentionSpec,
#: RSWASpec, MLAAttentionSpec, SlidingWindowSpec, SlidingWindowMLASpec,
#: ChunkedLocalAttentionSpec, CircularBufferSpec, CrossAttentionSpec,
#: EncoderOnlyAttentionSpec, MambaSpec (none/all/align), each also inside a
#: UniformTypeKVCacheSpecs.

#: Most requests live at once in a generated lifecycle.
MAX_LIVE = 4


@dataclass(frozen=True)
class KVConfig:
    """One generated KV cache configuration (what a runner profile and the
    oracle are both built from)."""

    specs: tuple[CacheSpec, ...]
    num_blocks: int
    max_model_len: int
    num_lookahead_tokens: int
    num_speculative_steps: int
    max_encoder_len: int
    enable_caching: bool
    #: A model-based drafter (:func:`drafter_configs`): its method ("" none),
    #: the groups holding its layers (flagged ``is_eagle_group``), the
    #: scheduler's ``use_eagle`` (last-block drop), ``num_prefill_lookahead``
    #: and ``num_hash_lookahead_tokens``.
    drafter_method: str = ""
    drafter_groups: tuple[int, ...] = ()
    use_eagle: bool = False
    prefill_lookahead: int = 0
    hash_lookahead: int = 0
    drafter_own_group: bool = False

    def oracle(self, num_blocks: int | None = None):
        """vLLM's ``KVCacheManager`` for this config (:class:`Oracle`)."""
        from tests.property.oracle import Oracle, vllm_spec

        return Oracle(tuple(vllm_spec(s) for s in self.specs),
                      self.num_blocks if num_blocks is None else num_blocks,
                      self.max_model_len, self.num_lookahead_tokens, self.enable_caching,
                      self.drafter_groups, self.use_eagle, self.prefill_lookahead,
                      self.hash_lookahead)

    def drafter(self):
        """The profile's :class:`~stepwarm.drafter.Drafter` (None: no drafter)."""
        from stepwarm.drafter import Drafter, eagle_groups
        from tests.property.oracle import vllm_spec

        if not self.drafter_method:
            return None
        return Drafter(
            method=self.drafter_method, num_speculative_tokens=self.num_speculative_steps,
            kv_cache_groups=self.drafter_groups,
            own_group=self.drafter_own_group,
            num_lookahead_tokens=self.num_lookahead_tokens,
            num_hash_lookahead_tokens=self.hash_lookahead,
            num_prefill_lookahead_tokens=self.prefill_lookahead,
            eagle_groups=eagle_groups([vllm_spec(s) for s in self.specs],
                                      set(self.drafter_groups), self.use_eagle),
        )

    @property
    def is_encoder_decoder(self) -> bool:
        return any(s.kind == "cross_attention" for s in self.specs)

    @property
    def mamba_align_block_size(self) -> int | None:
        """Block size prefill chunk ends must align to (the scheduler's Mamba
        align-mode rule), or None."""
        for s in self.specs:
            if s.kind == "mamba" and s.mamba_cache_mode == "align":
                return s.block_size
        return None

    def profile(self) -> RunnerProfile:
        """The runner profile stepwarm plans with for this config (specs read
        back through ``cache_spec_from_vllm``, so per-version facts such as
        which groups are zeroed come from the installed vLLM)."""
        from tests.property.oracle import vllm_spec

        return RunnerProfile(
            runner="v2",
            kv_cache_groups=tuple(cache_spec_from_vllm(vllm_spec(s)) for s in self.specs),
            num_blocks=self.num_blocks,
            max_model_len=self.max_model_len,
            max_num_seqs=1 << 10,
            max_num_batched_tokens=1 << 20,
            num_lookahead_tokens=self.num_lookahead_tokens,
            num_speculative_steps=self.num_speculative_steps,
            decode_query_len=1 + self.num_speculative_steps,
            max_encoder_len=self.max_encoder_len,
            is_encoder_decoder=self.is_encoder_decoder,
            vocab_size=64,
            enable_prefix_caching=self.enable_caching,
            uncached_frees_append=vllm_facts.uncached_frees_append(),
            zeroes_new_blocks=True,
            mamba_cache_mode=next(
                (s.mamba_cache_mode for s in self.specs if s.kind == "mamba"), "none"
            ),
            drafter=self.drafter(),
        )

    def ample_blocks(self) -> int:
        """Blocks for MAX_LIVE requests at max_model_len in every group, + null."""
        per = 0
        for s in self.specs:
            per += cdiv(self.max_model_len + self.num_lookahead_tokens, s.block_size)
            per += s.num_speculative_blocks + cdiv(self.max_encoder_len, s.block_size) + 1
        return MAX_LIVE * per + 1


def why_invalid(specs: tuple[CacheSpec, ...], enable_caching: bool, max_encoder_len: int) -> str | None:
    """Why vLLM would not run this KV cache config, or None if it would."""
    kinds = [s.kind for s in specs]
    modes = {s.mamba_cache_mode for s in specs if s.kind == "mamba"}
    if kinds.count("encoder_only_attention") > 1:
        return "V1 runner supports one encoder-only attention spec"
    if "encoder_only_attention" in kinds and kinds[-1] != "encoder_only_attention":
        return "encoder-only group is appended last by the runner"
    if all(k == "encoder_only_attention" for k in kinds):
        return "no scheduler-managed group"
    if "cross_attention" in kinds and enable_caching:
        return "encoder-decoder models disable prefix caching"
    if "cross_attention" in kinds and max_encoder_len <= 0:
        return "encoder-decoder model without encoder length"
    if modes - {"none"} and not enable_caching:
        return "Mamba cache mode all/align needs prefix caching"
    if enable_caching and all(k in ("circular_buffer", "encoder_only_attention") for k in kinds):
        return "prefix caching needs a cacheable group"
    return None


def vllm_rejects(cfg: KVConfig) -> str | None:
    """The error vLLM's own ``KVCacheManager`` raises building this config
    (e.g. a group block size the prefix-cache hash size does not divide), or None."""
    try:
        o = cfg.oracle(16)
    except (AssertionError, ValueError) as e:
        return str(e).split(".")[0][:100]
    coordinator = o.manager.coordinator
    if getattr(coordinator, "enable_partial_hash_hits", False) and any(
            type(m).__name__ in ("SlidingWindowManager", "ChunkedLocalAttentionManager")
            and m.block_size != coordinator.hash_block_size
            for m in coordinator.single_type_managers):
        # vLLM 0.26 turns partial hash hits on beside a sliding-window group
        # its SlidingWindowManager cannot serve them for ("does not support
        # fine-grained (partial) cache hits"); 0.32 turns them off there.
        return "partial hash hits beside a sliding-window/local group (vLLM 0.26)"
    return None


_block_sizes = st.one_of(
    st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256]),
    st.integers(1, 256),
)


def _num_blocks_vllm_accepts(draw, cfg: KVConfig) -> int:
    """A pool size for ``cfg`` (its ample count, or fewer), after assuming
    vLLM's own managers accept the config (the rejection recorded as an event)."""
    vllm_reason = vllm_rejects(cfg)
    if vllm_reason is not None:
        event(f"rejected config: vLLM: {vllm_reason}")
    assume(vllm_reason is None)
    ample = cfg.ample_blocks()
    return draw(st.one_of(st.just(ample), st.integers(2, ample)))


@st.composite
def cache_specs(draw, kind: str, block_size: int, mamba_mode: str, spec_blocks: int) -> CacheSpec:
    extra: dict = {}
    # Subclasses stepwarm reads as the same kind (vllm_class picks the class
    # the oracle builds). SinkFullAttentionSpec is left out: vLLM 0.32.0
    # cannot build its manager (SinkFullAttentionManager.__init__ rejects
    # the needs_kv_cache_zeroing argument get_manager_for_kv_cache_spec passes).
    if kind == "full_attention":
        extra["vllm_class"] = draw(st.sampled_from(["FullAttentionSpec", "RSWASpec"]))
    if kind == "sliding_window":
        extra["vllm_class"] = draw(st.sampled_from(["SlidingWindowSpec", "SlidingWindowMLASpec"]))
        extra["sliding_window"] = draw(st.integers(1, 512))
    elif kind == "chunked_local_attention":
        extra["attention_chunk_size"] = draw(st.integers(1, 512))
    elif kind == "mamba":
        extra["mamba_cache_mode"] = mamba_mode
        extra["num_speculative_blocks"] = spec_blocks
    uniform = kind != "encoder_only_attention" and draw(st.booleans())
    return CacheSpec(kind=kind, block_size=block_size, uniform_type=uniform, **extra)


@st.composite
def kv_configs(draw, kinds: tuple[str, ...] = ALL_KINDS, max_model_len: int = 1024,
               block_sizes: st.SearchStrategy[int] = _block_sizes,
               caching: bool | None = None, mixed_block_sizes: bool = False,
               min_model_len: int = 2) -> KVConfig:
    """A KV cache config vLLM accepts (see the module docstring).

    Args:
        caching: prefix caching forced on/off (None: drawn).
        mixed_block_sizes: every group draws its own block size (else one
            shared size half the time).
        min_model_len, max_model_len: the range ``max_model_len`` is drawn from.
    """
    kinds = tuple(k for k in kinds if k not in _MISSING)
    n = draw(st.integers(1, 4))
    group_kinds = draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n))
    if "encoder_only_attention" in group_kinds:  # one, appended last (runner-only)
        group_kinds = [k for k in group_kinds if k != "encoder_only_attention"]
        group_kinds.append("encoder_only_attention")
    mamba_mode = draw(st.sampled_from(["none", "all", "align"]))
    spec_blocks = draw(st.integers(0, 3))
    enable_caching = mamba_mode != "none" or (
        draw(st.booleans()) if caching is None else caching)
    if "cross_attention" in group_kinds:
        enable_caching = False
        mamba_mode = "none"
    # Mamba groups share the cache config's block size (align mode chunking).
    mamba_bs = draw(block_sizes)
    # One block size for every group (hybrid models unify page sizes; prefix
    # caching with Mamba outside align mode needs it), or one per group.
    shared_bs = not mixed_block_sizes and draw(st.booleans())
    specs = []
    for kind in group_kinds:
        bs = mamba_bs if kind == "mamba" or shared_bs else draw(block_sizes)
        specs.append(draw(cache_specs(kind, bs, mamba_mode, spec_blocks)))
    specs_t = tuple(specs)
    max_encoder_len = draw(st.integers(1, 600)) if "cross_attention" in group_kinds else 0
    reason = why_invalid(specs_t, enable_caching, max_encoder_len)
    if reason is not None:
        event(f"rejected config: {reason}")
    assume(reason is None)
    cfg = KVConfig(
        specs=specs_t,
        num_blocks=0,
        max_model_len=draw(st.integers(min_model_len, max_model_len)),
        num_lookahead_tokens=draw(st.integers(0, 8)),
        num_speculative_steps=draw(st.integers(0, 4)),
        max_encoder_len=max_encoder_len,
        enable_caching=enable_caching,
    )
    num_blocks = _num_blocks_vllm_accepts(draw, cfg)
    for s in specs_t:
        event(f"kind: {s.kind}" + (f"/{s.mamba_cache_mode}" if s.kind == "mamba" else "")
              + (f"/{s.vllm_class}" if s.vllm_class else "")
              + ("/uniform" if s.uniform_type else ""))
    return KVConfig(**{**cfg.__dict__, "num_blocks": num_blocks})


@st.composite
def mixed_block_size_configs(draw) -> KVConfig:
    """A config with prefix caching and groups of different block sizes
    (1-8 tokens, so that prompts of a few dozen tokens span several LCMs):
    where a prefix hit must agree with vLLM's ``HybridKVCacheCoordinator``
    on which prompt prefix is cached (a multiple of the groups' LCM) and
    which blocks a hit takes. Hybrid Mamba models are such configs."""
    cfg = draw(kv_configs(
        kinds=tuple(k for k in ("full_attention", "mla_attention", "sliding_window", "mamba",
                                "circular_buffer", "encoder_only_attention") if k in ALL_KINDS),
        max_model_len=64, block_sizes=st.sampled_from([1, 2, 4, 8, 3, 6]),
        caching=True, mixed_block_sizes=True, min_model_len=24))
    mixed = cfg.enable_caching and len(
        {s.block_size for s in cfg.specs if s.kind != "encoder_only_attention"}) > 1
    if not mixed:
        event("rejected config: caching off or one block size")
    assume(mixed)
    return cfg


@st.composite
def prefix_hit_configs(draw) -> KVConfig:
    """A config with prefix caching on, small block sizes (1, 2 or 4 tokens,
    shared or per group) and ``max_model_len`` 16-48, so that earlier
    requests' prompts fill cached blocks and later requests hit them in many
    lifecycles (with block sizes up to 256, few lifecycles have a hit)."""
    return draw(kv_configs(
        kinds=tuple(k for k in ALL_KINDS if k != "cross_attention"),
        max_model_len=48, block_sizes=st.sampled_from([1, 2, 4]), caching=True,
        min_model_len=16))


#: Target kinds beside a drafter: the attention kinds whose caching rules
#: do not read EAGLE's drop (sliding window's ``reachable_block_mask`` and
#: Mamba's checkpoint do: not modelled, not drawn).
DRAFTER_TARGET_KINDS = ("full_attention", "mla_attention")


@st.composite
def drafter_configs(draw, methods: tuple[str, ...] = ("eagle", "mtp", "draft_model"),
                    hash_lookahead: bool | None = None) -> KVConfig:
    """A target's groups (full / MLA attention, block sizes 1-8, prefix
    caching on 3 times in 4, ``max_model_len`` 16-48) and a model-based
    drafter's: its layers in a group of their own (vLLM 0.33 tags them
    ``is_draft``; a drafter spec differing from the target's) or in one of
    the target's (vLLM 0.32's EAGLE head, MTP layer), that group flagged
    ``is_eagle_group``; ``k`` = 1-3 drafts, ``num_lookahead_tokens`` = ``k``.

    - ``eagle``: ``num_prefill_lookahead`` 1, the scheduler's last-block drop
      on (``use_eagle``);
    - ``mtp`` (multi-module MTP): ``num_prefill_lookahead`` ``k``, so the
      last ``k - 1`` computed tokens are not cached;
    - ``draft_model``: neither (no drop, nothing flagged).

    Where the installed ``KVCacheManager`` takes no ``num_prefill_lookahead``
    (:func:`stepwarm.vllm_facts.manager_takes_prefill_lookahead`, vLLM 0.26 /
    0.27), ``eagle`` and ``mtp`` draw none (the drop only).

    Where the installed vLLM hashes lookahead tokens
    (:func:`stepwarm.vllm_facts.hash_lookahead_tokens_hashed`, vLLM 0.33),
    ``num_hash_lookahead_tokens`` = ``num_prefill_lookahead`` half the time
    (``hash_lookahead``: forced), which clears the drop as the scheduler does.
    """
    from stepwarm import vllm_facts

    base = draw(kv_configs(kinds=DRAFTER_TARGET_KINDS, max_model_len=48,
                           block_sizes=st.sampled_from([1, 2, 4, 8]),
                           caching=draw(st.sampled_from([True, True, True, False])),
                           min_model_len=16))
    assume(len(base.specs) < 4)
    method = draw(st.sampled_from(methods), label="drafter method")
    k = draw(st.integers(2 if method == "mtp" else 1, 3), label="drafts")
    specs = list(base.specs)
    own = False
    if method != "draft_model" and draw(st.booleans(), label="drafter in a group of its own"):
        bs = draw(st.sampled_from(sorted({s.block_size for s in specs} | {1, 2, 4})))
        kind = draw(st.sampled_from(DRAFTER_TARGET_KINDS))
        specs.append(draw(cache_specs(kind, bs, "none", 0)))
        groups: tuple[int, ...] = (len(specs) - 1,)
        own = True
    elif method != "draft_model":
        groups = (draw(st.integers(0, len(specs) - 1), label="drafter's group"),)
    else:
        groups = ()
    # vLLM 0.26 / 0.27's KVCacheManager takes no num_prefill_lookahead (their
    # scheduler keeps no re-prefillable tail): none is drawn there.
    prefill = ({"eagle": 1, "mtp": k, "draft_model": 0}[method]
               if vllm_facts.manager_takes_prefill_lookahead() else 0)
    hashed = 0
    if prefill and base.enable_caching and vllm_facts.hash_lookahead_tokens_hashed():
        on = draw(st.booleans(), label="hash lookahead") if hash_lookahead is None else hash_lookahead
        hashed = prefill if on else 0
    elif hash_lookahead:
        event("rejected config: the installed vLLM hashes no lookahead tokens")
        assume(False)
    cfg = KVConfig(
        specs=tuple(specs), num_blocks=0, max_model_len=base.max_model_len,
        num_lookahead_tokens=k, num_speculative_steps=k, max_encoder_len=0,
        enable_caching=base.enable_caching, drafter_method=method, drafter_groups=groups,
        use_eagle=method != "draft_model" and not hashed, prefill_lookahead=prefill,
        hash_lookahead=hashed, drafter_own_group=own,
    )
    num_blocks = _num_blocks_vllm_accepts(draw, cfg)
    event(f"drafter: {method}" + (" own group" if own else "")
          + (f" hash lookahead {hashed}" if hashed else "")
          + (" caching" if cfg.enable_caching else ""))
    return KVConfig(**{**cfg.__dict__, "num_blocks": num_blocks})
