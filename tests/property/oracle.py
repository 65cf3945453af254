"""The oracle: vLLM's own ``KVCacheManager``, driven the way the scheduler does.

:class:`Oracle` builds a ``vllm.v1.core.kv_cache_manager.KVCacheManager`` over
a real ``KVCacheConfig`` and replays a request lifecycle through
``allocate_slots`` exactly as ``vllm/v1/core/sched/scheduler.py`` calls it
(``num_lookahead_tokens`` on every allocation, ``num_encoder_tokens`` only on
the allocation that schedules the encoder input, ``num_computed_tokens``
advanced and output tokens appended after each step, ``free`` on finish and
preemption). ``get_block_ids`` per group is the ground truth stepwarm's
:class:`~stepwarm.blocks.BlockLedger` must match.

Encoder-only attention groups are runner-only: vLLM's V1 runner appends them
to *its* ``KVCacheConfig`` after the scheduler's is built (V2 keeps them out of
the config altogether), and ``KVCacheSpecRegistry`` has no manager for
``EncoderOnlyAttentionSpec``. The scheduler therefore holds 0 blocks for them;
the oracle leaves them out of the manager and reports 0.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from stepwarm.probe import cache_spec_from_vllm
from stepwarm.profile import CacheSpec

_DTYPE = torch.float16
#: Sampled tokens are this + the request's ordinal (outside every prompt's 0..len-1).
OUTPUT_TOKEN = 1 << 20
_CACHE_HASH_READY = False


def vllm_spec(spec: CacheSpec, *, layers: int = 1) -> Any:
    """The ``KVCacheSpec`` a :class:`CacheSpec` stands for (``layers`` > 1 or
    ``spec.uniform_type``: a ``UniformTypeKVCacheSpecs`` of that many layers)."""
    from vllm.v1 import kv_cache_interface as k

    def one(head_size: int) -> Any:
        attn = dict(block_size=spec.block_size, num_kv_heads=1, head_size=head_size, dtype=_DTYPE)
        if spec.kind == "full_attention":
            if spec.vllm_class == "RSWASpec":
                return k.RSWASpec(**attn, rswa_window=64)
            return k.FullAttentionSpec(**attn)
        if spec.kind == "mla_attention":
            return k.MLAAttentionSpec(**attn)
        if spec.kind == "sliding_window":
            cls = k.SlidingWindowMLASpec if spec.vllm_class == "SlidingWindowMLASpec" else k.SlidingWindowSpec
            return cls(**attn, sliding_window=spec.sliding_window)
        if spec.kind == "chunked_local_attention":
            return k.ChunkedLocalAttentionSpec(**attn, attention_chunk_size=spec.attention_chunk_size)
        if spec.kind == "circular_buffer":  # vLLM 0.26 has none (strategies skip it)
            return k.CircularBufferSpec(**attn)
        if spec.kind == "cross_attention":
            return k.CrossAttentionSpec(**attn)
        if spec.kind == "encoder_only_attention":
            return k.EncoderOnlyAttentionSpec(**attn)
        if spec.kind == "mamba":
            return k.MambaSpec(
                block_size=spec.block_size,
                shapes=((head_size,),),
                dtypes=(_DTYPE,),
                mamba_cache_mode=spec.mamba_cache_mode,
                num_speculative_blocks=spec.num_speculative_blocks,
            )
        raise ValueError(spec.kind)

    if not spec.uniform_type and layers == 1:
        return one(8)
    n = max(layers, 2)
    return k.UniformTypeKVCacheSpecs(
        block_size=spec.block_size,
        kv_cache_specs={f"layer.{i}": one(8 * (i + 1)) for i in range(n)},
    )


def kv_cache_config(specs: tuple[Any, ...], num_blocks: int, eagle: frozenset[int] = frozenset()) -> Any:
    """A worker ``KVCacheConfig`` with one group per vLLM spec (groups in
    ``eagle`` flagged ``is_eagle_group``: they hold drafter layers)."""
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    class ZeroingKVCacheConfig(KVCacheConfig):
        """Zeroing on for every config (vLLM turns it on for Mamba and, in
        0.32, mixed-precision caches), so ``new_block_ids_to_zero`` is
        compared on every config."""

        @property
        def needs_kv_cache_zeroing(self) -> bool:
            return True

    # vLLM 0.34: a field set in __post_init__ (resolved across workers), not
    # a property: set it on the config itself
    is_field = "needs_kv_cache_zeroing" in {f.name for f in dataclasses.fields(KVCacheConfig)}
    config = (KVCacheConfig if is_field else ZeroingKVCacheConfig)(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(layer_names=[f"g{i}"], kv_cache_spec=s,
                             **({"is_eagle_group": True} if i in eagle else {}))
            for i, s in enumerate(specs)
        ],
    )
    if is_field:
        config.needs_kv_cache_zeroing = True
    return config


def scheduler_block_sizes(groups: list[Any], enable_caching: bool) -> tuple[int, int]:
    """``(scheduler_block_size, hash_block_size)`` as the engine resolves them
    (``vllm.v1.core.kv_cache_utils.resolve_kv_cache_block_sizes``)."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    cfg = SimpleNamespace(kv_cache_groups=groups)
    # cache_config.block_size: a hybrid engine's Mamba block size in align
    # mode is the cache config's block size (vLLM 0.26 compares the two).
    mamba = [g.kv_cache_spec.block_size for g in groups
             if type(g.kv_cache_spec).__name__ == "MambaSpec"]
    vcfg = SimpleNamespace(
        cache_config=SimpleNamespace(
            block_size=(mamba or [g.kv_cache_spec.block_size for g in groups] or [16])[0],
            enable_prefix_caching=enable_caching,
            prefix_match_unit=None,
        ),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=None,
    )
    return resolve_kv_cache_block_sizes(cfg, vcfg)


@dataclass
class _Req:
    request: Any
    encoder_len: int
    #: Encoder input still to be scheduled (first allocation after admission
    #: or resumption).
    encoder_pending: bool = True
    #: A prefix-cache hit found by :meth:`Oracle.lookup`, for the next
    #: allocation: (blocks, tokens).
    hit: tuple[Any, int] | None = None


@dataclass
class Oracle:
    """vLLM's ``KVCacheManager`` for one KV cache config.

    Args:
        worker_specs: the worker's group specs (``UniformTypeKVCacheSpecs``
            allowed), in group order; encoder-only groups are runner-only.
        num_blocks: ``KVCacheConfig.num_blocks``.
        max_model_len, num_lookahead_tokens: as the scheduler has them.
        enable_caching: prefix caching (requests then carry a block hasher).
        drafter_groups: worker groups holding drafter layers (flagged
            ``is_eagle_group``, as vLLM's KV cache planning flags them).
        use_eagle: the scheduler's ``use_eagle`` (EAGLE's last-block drop;
            vLLM 0.33 clears it when hash lookahead is on).
        prefill_lookahead: ``num_prefill_lookahead`` (EAGLE 1, multi-module
            MTP ``k``).
        hash_lookahead: ``num_hash_lookahead_tokens`` (vLLM 0.33; the
            request block hasher gets it too).
    """

    worker_specs: tuple[Any, ...]
    num_blocks: int
    max_model_len: int
    num_lookahead_tokens: int = 0
    enable_caching: bool = False
    drafter_groups: tuple[int, ...] = ()
    use_eagle: bool = False
    prefill_lookahead: int = 0
    hash_lookahead: int = 0
    manager: Any = field(init=False, repr=False)
    _reqs: dict[str, _Req] = field(default_factory=dict, init=False, repr=False)
    #: Every state-changing call, for :meth:`clone`.
    _log: list[tuple[str, tuple]] = field(default_factory=list, init=False, repr=False)
    #: req_id -> its ordinal (its sampled tokens are OUTPUT_TOKEN + it).
    _ordinals: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
        from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec

        #: worker group index -> scheduler group index (None: runner-only).
        self.group_map: list[int | None] = []
        sched_specs = []
        for s in self.worker_specs:
            first = getattr(s, "first_spec", s)
            if isinstance(first, EncoderOnlyAttentionSpec):
                self.group_map.append(None)
            else:
                self.group_map.append(len(sched_specs))
                sched_specs.append(s)
        eagle = frozenset(self.group_map[g] for g in self.drafter_groups
                          if self.group_map[g] is not None)
        worker_cfg = kv_cache_config(tuple(sched_specs), self.num_blocks, eagle)
        # What the engine core hands the scheduler (UniformTypeKVCacheSpecs
        # replaced by their first spec).
        self.sched_config = generate_scheduler_kv_cache_config([worker_cfg])
        sbs, hbs = scheduler_block_sizes(self.sched_config.kv_cache_groups, self.enable_caching)
        self.scheduler_block_size, self.hash_block_size = sbs, hbs
        self.manager = KVCacheManager(
            kv_cache_config=self.sched_config,
            max_model_len=self.max_model_len,
            scheduler_block_size=sbs,
            hash_block_size=hbs,
            enable_caching=self.enable_caching,
            **self._drafter_kwargs(),
        )
        self._hasher = None
        if self.enable_caching:
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

            global _CACHE_HASH_READY
            if not _CACHE_HASH_READY:
                init_none_hash(sha256)
                _CACHE_HASH_READY = True
            self._hasher = get_request_block_hasher(
                hbs, sha256, *((self.hash_lookahead,) if self.hash_lookahead else ()))

    def _drafter_kwargs(self) -> dict[str, Any]:
        """The drafter's ``KVCacheManager`` arguments, only those set (a
        release without one is never drawn a drafter that needs it)."""
        kw: dict[str, Any] = {}
        if self.use_eagle:
            kw["use_eagle"] = True
        if self.prefill_lookahead:
            kw["num_prefill_lookahead"] = self.prefill_lookahead
        if self.hash_lookahead:
            kw["num_hash_lookahead_tokens"] = self.hash_lookahead
        return kw

    def clone(self) -> Oracle:
        """A fresh oracle brought to this one's state by replaying its calls
        (``deepcopy`` recurses through the pool's linked free list)."""
        twin = Oracle(self.worker_specs, self.num_blocks, self.max_model_len,
                      self.num_lookahead_tokens, self.enable_caching, self.drafter_groups,
                      self.use_eagle, self.prefill_lookahead, self.hash_lookahead)
        for name, args in self._log:
            getattr(twin, name)(*args)
        return twin

    @property
    def stepwarm_specs(self) -> tuple[CacheSpec, ...]:
        """The worker specs as stepwarm reads them (``cache_spec_from_vllm``)."""
        return tuple(cache_spec_from_vllm(s) for s in self.worker_specs)

    # -- lifecycle -----------------------------------------------------------
    def add(self, req_id: str, prompt_len: int, encoder_len: int = 0) -> None:
        """Admit a waiting request (prompt ``[0, 1, ...]`` like stepwarm's)."""
        self._log.append(('add', (req_id, prompt_len, encoder_len,)))
        from vllm import SamplingParams
        from vllm.v1.request import Request

        mm = []
        if encoder_len:
            from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

            mm = [MultiModalFeatureSpec(data=None, modality="audio", identifier=f"{req_id}enc",
                                        mm_position=PlaceholderRange(offset=0, length=encoder_len))]
        req = Request(req_id, list(range(prompt_len)), SamplingParams(max_tokens=1 << 20), None,
                      mm_features=mm, block_hasher=self._hasher)
        self._reqs[req_id] = _Req(req, encoder_len)

    def new_step(self) -> None:
        """``KVCacheManager.new_step_starts()``, as ``Scheduler.schedule``
        calls it first thing every step."""
        self._log.append(('new_step', ()))
        self.manager.new_step_starts()

    def lookup(self, req_id: str) -> int:
        """``get_computed_blocks`` for a waiting request, as the scheduler
        calls it before the request's first allocation: the hit is kept for
        the next :meth:`schedule`. Returns the hit length (tokens)."""
        r = self._reqs[req_id]
        found = self.manager.get_computed_blocks(r.request)
        self._log.append(('lookup', (req_id,)))
        blocks, n = found[0], found[1]
        r.hit = (blocks, n) if n else None
        return n

    def hit_still_found(self, req_id: str) -> bool:
        """Whether ``get_computed_blocks`` called now finds the same hit (length
        and blocks per group) that :meth:`lookup` kept. The scheduler looks a
        waiting request up right before its own ``allocate_slots``, after the
        requests scheduled before it in the step; an allocation between the
        two may have evicted a cached block the hit read."""
        r = self._reqs[req_id]
        if not r.hit:
            return True
        found = self.manager.get_computed_blocks(r.request)
        blocks, n = r.hit
        ids = lambda bs: [[b.block_id for b in g] for g in bs.blocks]  # noqa: E731
        return found[1] == n and ids(found[0]) == ids(blocks)

    def copy_pending(self, req_id: str) -> bool:
        """Whether a manager holds a partial prefix-cache block of
        ``req_id`` that it copies on write at the request's next allocation
        (``_partial_hit_reqs``: a sub-block hit, or a Mamba ``align``
        request that keyed its own partial prompt tail). That allocation
        reserves one block more per such group; stepwarm does not model
        copy-on-write copies."""
        return any(req_id in getattr(m, "_partial_hit_reqs", ())
                   for m in self.manager.coordinator.single_type_managers)

    def untrimmed_hit(self, req_id: str) -> bool:
        """Whether the hit :meth:`lookup` found holds more blocks in some
        group than its length covers. vLLM 0.26's
        ``HybridKVCacheCoordinator.find_longest_cache_hit`` trims only the
        first full-attention group to the reconciled hit length, so a second
        full-attention-type group (MLA beside full attention, say) keeps the
        blocks of its own longer hit; 0.32 trims every one."""
        r = self._reqs[req_id]
        if not r.hit:
            return False
        blocks, n = r.hit
        managers = self.manager.coordinator.single_type_managers
        return any(len(group) > -(-n // m.block_size)
                   for group, m in zip(blocks.blocks, managers)
                   if type(m).__name__ != "MambaManager")

    def drop_hit(self, req_id: str) -> None:
        """Forget a looked-up hit (the scheduler would not use it)."""
        self._log.append(('drop_hit', (req_id,)))
        self._reqs[req_id].hit = None

    def schedule(self, req_id: str, num_new_tokens: int) -> tuple[list[int], ...] | None:
        """``allocate_slots`` for ``num_new_tokens`` tokens of ``req_id``, as the
        scheduler calls it (with the hit :meth:`lookup` found, if any; the
        request's ``num_computed_tokens`` then starts after the hit). Returns
        the new block ids per *worker* group (the scheduler's
        ``new_block_ids``), or None when the pool refused."""
        self._log.append(('schedule', (req_id, num_new_tokens,)))
        r = self._reqs[req_id]
        enc = r.encoder_len if r.encoder_pending else 0
        hit_blocks, hit_len = r.hit if r.hit else (None, 0)
        got = self.manager.allocate_slots(
            r.request, num_new_tokens,
            num_new_computed_tokens=hit_len,
            new_computed_blocks=hit_blocks,
            num_lookahead_tokens=self.num_lookahead_tokens,
            num_encoder_tokens=enc,
        )
        if got is None:
            return None
        r.request.num_computed_tokens += hit_len
        r.hit = None
        r.encoder_pending = False
        from vllm.v1.request import RequestStatus

        r.request.status = RequestStatus.RUNNING
        ids = got.get_block_ids() if got.blocks else tuple([] for _ in self.sched_config.kv_cache_groups)
        return self._to_worker(ids)

    def advance(self, req_id: str, num_scheduled: int, num_new_outputs: int) -> None:
        """After the step: ``num_computed_tokens += num_scheduled`` and
        ``num_new_outputs`` sampled tokens appended (all drafts accepted)."""
        self._log.append(('advance', (req_id, num_scheduled, num_new_outputs,)))
        req = self._reqs[req_id].request
        req.num_computed_tokens += num_scheduled
        if num_new_outputs:
            # A token no prompt holds and no other request samples: output
            # blocks never match a prompt's, nor another request's (a
            # resumed request's lookup reads its own; stepwarm keys them so).
            tok = OUTPUT_TOKEN + self._ordinals.setdefault(req_id, len(self._ordinals))
            req.append_output_token_ids([tok] * num_new_outputs)

    def finish(self, req_id: str) -> None:
        """``KVCacheManager.free`` of a finished request."""
        self._log.append(('finish', (req_id,)))
        r = self._reqs.pop(req_id)
        self.manager.free(r.request)

    def fail_to_fit(self, req_id: str) -> None:
        """What stays of an ``allocate_slots`` call that finds the pool short
        for a running request: its ``remove_skipped_blocks`` (blocks its
        groups no longer need go back to the pool), which comes first."""
        self._log.append(('fail_to_fit', (req_id,)))
        req = self._reqs[req_id].request
        self.manager.coordinator.remove_skipped_blocks(
            req_id, req.num_computed_tokens, num_prompt_tokens=req.num_prompt_tokens)

    def preempt(self, req_id: str) -> None:
        """The scheduler's ``_preempt_request``: free, reset progress."""
        self._log.append(('preempt', (req_id,)))
        from vllm.v1.request import RequestStatus

        r = self._reqs[req_id]
        self.manager.free(r.request)
        r.request.status = RequestStatus.PREEMPTED
        r.request.num_computed_tokens = 0
        r.encoder_pending = True

    # -- reads ---------------------------------------------------------------
    def block_ids(self, req_id: str) -> tuple[list[int], ...]:
        """``get_block_ids(req_id)`` per worker group (null blocks included)."""
        return self._to_worker(self.manager.get_block_ids(req_id))

    def held_counts(self, req_id: str) -> tuple[int, ...]:
        """Block table length per worker group."""
        return tuple(len(ids) for ids in self.block_ids(req_id))

    def num_free(self) -> int:
        """Free blocks in the pool (cached-but-unreferenced ones included)."""
        return self.manager.block_pool.get_num_free_blocks()

    def end_step(self) -> int:
        """What the scheduler does once a step is scheduled with the
        copy-on-write copies of partial-block prefix caching (vLLM's
        ``take_kv_cache_block_copies``, then ``_free_cow_retained_blocks``
        with no step in flight): the retained endpoints go back to the pool.
        stepwarm sends no ``kv_cache_block_copies``, so a step with copies
        is one whose ids it does not model. Returns the number of copies."""
        self._log.append(("end_step", ()))
        take = getattr(self.manager, "take_kv_cache_block_copies", None)
        if take is None:
            return 0
        copies, retained = take()
        if retained:
            self.manager.block_pool.free_blocks(retained)
        return len(copies)

    def hit_alignment(self) -> int:
        """Tokens prefix-cache hits are aligned to: the coordinator's
        ``_cache_hit_alignment_tokens`` (hybrid), else the one manager's
        ``scheduler_block_size`` (its block size)."""
        coordinator = self.manager.coordinator
        aligned = getattr(coordinator, "_cache_hit_alignment_tokens", None)
        if aligned is not None:
            return aligned
        (size,) = {m.scheduler_block_size for m in coordinator.single_type_managers}
        return size

    def partial_tail_entries(self) -> bool:
        """Whether vLLM may also key a block by a prompt tail inside it
        (``_cache_partial_tail_block`` of ``FullAttentionManager`` and its
        subclasses, and of ``MambaManager``): prefix caching on and some such
        group's block size is not the hash block size. stepwarm does not
        record those entries (a block holding one goes to the back of vLLM's
        free queue on free, to the front of stepwarm's)."""
        if not self.enable_caching:
            return False
        return any(
            m.block_size != self.hash_block_size
            and (hasattr(m, "_cache_partial_tail_block") or type(m).__name__ == "MambaManager")
            for m in self.manager.coordinator.single_type_managers)

    def take_new_block_ids(self) -> list[int]:
        """``KVCacheManager.take_new_block_ids()``: what the scheduler puts
        in ``new_block_ids_to_zero`` for the step (drained)."""
        self._log.append(('take_new_block_ids', ()))
        return list(self.manager.take_new_block_ids())

    def _to_worker(self, ids: tuple[list[int], ...]) -> tuple[list[int], ...]:
        return tuple([] if g is None else list(ids[g]) for g in self.group_map)


def lcm(*xs: int) -> int:
    return math.lcm(*xs)
