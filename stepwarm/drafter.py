"""The speculator's drafter, as a runner profile records it.

:class:`Drafter` is plain data (part of :class:`stepwarm.profile.RunnerProfile`);
:func:`read_drafter` reads it off a live worker
(:class:`~stepwarm.worker_view.WorkerView`). A model-based
drafter (EAGLE, EAGLE-3, MTP, a draft model) has attention layers of its own:
vLLM's ``LLMBaseProposer.load_model`` (V1; ``Speculator.load_model`` on V2)
names them as every attention layer the target does not have, and the KV
cache config puts them in KV cache groups beside the target's (vLLM 0.32: an
EAGLE head's or an MTP layer's layer joins the target's group of the same
spec; a draft model whose spec differs joins it in one
``UniformTypeKVCacheSpecs`` group). Block accounting needs nothing more than
those groups' specs, which the profile already has; the drafter record says
which groups hold drafter layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView


class Drafter(BaseModel):
    """The runner's speculator: vLLM's ``SpeculativeConfig`` and where the
    drafter's KV cache layers went.

    Token counts are in tokens; ``kv_cache_groups`` are indices into the
    profile's ``kv_cache_groups``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: ``SpeculativeConfig.method`` ("ngram", "eagle", "eagle3", "mtp",
    #: "draft_model", ...).
    method: str
    #: ``SpeculativeConfig.num_speculative_tokens``: drafts per request and step.
    num_speculative_tokens: int = Field(ge=0)
    #: The drafter's checkpoint (``draft_model_config.model``; the target's
    #: own directory for MTP; "" for ngram and other model-free methods).
    model: str = ""
    #: The drafter's attention layers (``LLMBaseProposer._draft_attn_layer_names``,
    #: V2 ``Speculator.draft_attn_layer_names``), sorted; empty for ngram.
    layers: tuple[str, ...] = ()
    #: The KV cache groups holding those layers (``LLMBaseProposer.kv_cache_gid``
    #: is the first).
    kv_cache_groups: tuple[int, ...] = ()
    #: Whether some such group holds drafter layers only (vLLM 0.32 merges
    #: them into the target's groups; a release that tags draft specs
    #: ``is_draft`` may not).
    own_group: bool = False
    #: ``VllmConfig.num_lookahead_tokens``: slots the scheduler reserves past
    #: the scheduled tokens for the drafts (``allocate_slots``).
    num_lookahead_tokens: int = Field(default=0, ge=0)
    #: Tokens past the computed ones that the scheduler hashes for prefix
    #: caching with a drafter (``num_hash_lookahead_tokens``, vLLM 0.33; 0
    #: where the installed vLLM has no such setting).
    num_hash_lookahead_tokens: int = Field(default=0, ge=0)
    #: ``VllmConfig.num_prefill_lookahead_tokens``: prefill tokens past the
    #: computed ones the drafter reads (EAGLE 1, multi-module MTP ``k``; 0
    #: for ngram); the KV cache manager does not cache the last ``this - 1``
    #: computed tokens.
    num_prefill_lookahead_tokens: int = Field(default=0, ge=0)
    #: KV cache groups whose prefix-cache hits drop their last block (the
    #: coordinator's EAGLE groups: those flagged ``is_eagle_group``, every
    #: group when none is, none when hash lookahead replaces the drop).
    eagle_groups: tuple[int, ...] = ()


def _hash_lookahead(cfg: Any) -> int:
    """``num_hash_lookahead_tokens`` wherever the installed vLLM keeps it
    (the vLLM config, its scheduler or cache config); 0 when it has none."""
    for holder in (cfg, getattr(cfg, "scheduler_config", None), getattr(cfg, "cache_config", None)):
        value = getattr(holder, "num_hash_lookahead_tokens", None)
        if isinstance(value, int):
            return value
    return 0


def eagle_groups(specs: list[Any], flagged: set[int], use_eagle: bool) -> tuple[int, ...]:
    """The groups whose managers drop a hit's last block (``use_eagle``), as
    the scheduler's coordinator settles them: the groups flagged
    ``is_eagle_group`` (every group when none is), and with several groups
    every group whose scheduler-side spec equals a flagged one's
    (``HybridKVCacheCoordinator`` gives one manager flag per equal spec).

    Args:
        specs: the groups' vLLM ``KVCacheSpec`` (a ``UniformTypeKVCacheSpecs``
            stands for its first layer's spec, as the scheduler has it).
        flagged: indices of the groups flagged ``is_eagle_group``.
        use_eagle: the scheduler's ``use_eagle`` (``use_eagle_block_drop()``,
            cleared by hash lookahead on vLLM 0.33).
    """
    if not use_eagle:
        return ()
    flagged = flagged or set(range(len(specs)))
    if len(specs) == 1:
        return tuple(sorted(flagged))
    # The scheduler's spec of a UniformTypeKVCacheSpecs group is its first
    # layer's (generate_scheduler_kv_cache_config, vllm/v1/core/kv_cache_utils.py,
    # every release); ``first_spec`` says so from vLLM 0.29 only.
    sched = [next(iter(s.kv_cache_specs.values())) if type(s).__name__ == "UniformTypeKVCacheSpecs"
             else s for s in specs]
    return tuple(i for i, s in enumerate(sched)
                 if i in flagged or any(s == sched[j] for j in flagged))


def _eagle_groups(spec: Any, kv_cache_config: Any, hash_lookahead: int) -> tuple[int, ...]:
    """:func:`eagle_groups` of a live runner's config (the scheduler's drop
    flag, :func:`stepwarm.vllm_facts.eagle_block_drop`, and the groups'
    ``is_eagle_group``)."""
    from stepwarm.vllm_facts import eagle_block_drop

    groups = kv_cache_config.kv_cache_groups
    return eagle_groups([g.kv_cache_spec for g in groups],
                        {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)},
                        eagle_block_drop(spec) and not hash_lookahead)


def read_drafter(worker: WorkerView) -> Drafter | None:
    """Read the runner's :class:`Drafter` (None: no speculator).

    Args:
        worker: a worker whose runner ran ``initialize_kv_cache`` (its
            ``KVCacheConfig`` is read).
    """
    from stepwarm.vllm_facts import prefill_lookahead_tokens

    cfg = worker.vllm_config
    kv_cache_config = worker.kv_cache_config
    spec = getattr(cfg, "speculative_config", None)
    if spec is None:
        return None
    layers = worker.draft_layer_names()
    groups = tuple(i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                   if layers & set(g.layer_names))
    draft_model = getattr(getattr(spec, "draft_model_config", None), "model", "") or ""
    return Drafter(
        method=str(spec.method),
        num_speculative_tokens=int(spec.num_speculative_tokens or 0),
        model=str(draft_model) if layers else "",
        layers=tuple(sorted(layers)),
        kv_cache_groups=groups,
        own_group=any(set(kv_cache_config.kv_cache_groups[i].layer_names) <= layers
                      for i in groups),
        num_lookahead_tokens=int(getattr(cfg, "num_lookahead_tokens", 0) or 0),
        num_hash_lookahead_tokens=_hash_lookahead(cfg),
        num_prefill_lookahead_tokens=prefill_lookahead_tokens(cfg),
        eagle_groups=_eagle_groups(spec, kv_cache_config, _hash_lookahead(cfg)),
    )
