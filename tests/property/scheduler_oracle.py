"""vLLM's real ``Scheduler`` as the oracle for stepwarm's planner.

:func:`replay` drives ``vllm.v1.core.sched.scheduler.Scheduler`` (built on
CPU, one full-attention KV cache group, a sliding-window and a Mamba group
beside it where :class:`Config` says) through a request stream step by
step: requests arrive, ``schedule()`` decides, ``update_from_output`` takes
a ``ModelRunnerOutput`` of one sampled token per request whose prompt (or
resumption) is done (with an n-gram speculator, ``Config.num_spec_tokens``:
one plus the drafts that request accepts, then the drafts it proposes for
the next step through ``update_draft_token_ids``), aborts go through
``finish_requests``. Each step is cut
down to what a recording holds (which requests, tokens each, the prefix hit
of a new request, preempted and finished ids), given to stepwarm's
:class:`~stepwarm.plan.PlanBuilder` over the same profile, and stepwarm's step
must be the scheduler's ``SchedulerOutput``: ``num_scheduled_tokens``,
``num_computed_tokens`` (after rejected drafts), block ids (a new or resumed request's whole table, a
running one's ``new_block_ids``), finished and preempted ids.

Prompts are stepwarm's (``[0, 1, ..., prompt_len - 1]``: every prompt shares
a prefix with every other), each request's sampled tokens its own, so the
prefix cache holds what stepwarm's ledger assumes it holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from stepwarm.plan import PlanBuilder, PlannedRequest, PlannedStep
from stepwarm.profile import CacheSpec, RunnerProfile, tiny_profile
from stepwarm.plan.output import PLACEHOLDER_DRAFT
from stepwarm.vllm_facts import (max_prefill_tokens, model_runner_output,
                                  scheduler_caches_after_output, scheduler_mamba_align_rule,
                                  scheduler_pad_rule)

#: Sampled tokens are OUTPUT_BASE + the request's ordinal: in no prompt, and
#: no two requests' outputs alike.
OUTPUT_BASE = 1 << 20
_HASH_READY = False


class ConfigRefused(Exception):
    """The installed vLLM refuses the drawn runner (vLLM 0.26's hybrid
    coordinator takes no two equal attention groups: an EAGLE group of its
    own there), or cannot serve it (0.26 never schedules a prefill whose
    Mamba align block is wider than the token budget): the example is
    discarded."""


class Unmodelled(Exception):
    """A step stepwarm knowingly plans otherwise (docs/block-accounting.md):
    the example is discarded, its reason counted."""


@dataclass(frozen=True)
class Config:
    """The runner both sides plan for (tokens, blocks)."""

    block_size: int = 16  # tokens per block
    num_blocks: int = 64  # KVCacheConfig.num_blocks, the null block included
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 64  # tokens; small: chunked prefill
    max_model_len: int = 256  # tokens
    enable_caching: bool = True  # prefix caching
    #: An n-gram speculator's drafts a step (0: none); no lookahead slots.
    num_spec_tokens: int = 0
    #: Tokens: a second KV cache group, sliding-window attention of this
    #: window, beside the full-attention one (None: the full group alone).
    sliding_window: int | None = None
    #: A Mamba group's cache mode ("align" or "all") beside the attention
    #: ones (None: no Mamba group), its block the attention groups' size.
    mamba: str | None = None
    #: An EAGLE drafter (the zoo's tiny-llama-eagle head) instead of the
    #: n-gram speculator: ``num_spec_tokens`` drafts, as many lookahead slots
    #: the scheduler reserves, a prefix hit's last block dropped where it
    #: drops it.
    eagle: bool = False
    #: The drafter's layer in a full-attention group of its own (flagged
    #: ``is_eagle_group``, last) instead of the target's full-attention group.
    eagle_own_group: bool = False
    #: A draft model (the zoo's tiny-llama-draft) instead of the n-gram
    #: speculator: ``num_spec_tokens`` drafts every step, as many lookahead
    #: slots, no prefix-hit drop; its layer in the target's full-attention
    #: group (vLLM groups layers of one spec together).
    draft_model: bool = False
    #: An MTP layer (the zoo's tiny DeepSeek-V3 with its MTP layer as the
    #: target, ``method="mtp"``) instead of the n-gram speculator: the
    #: scheduler takes it as EAGLE-like (``use_eagle``), its layer in the
    #: target's full-attention group.
    mtp: bool = False
    #: ``SchedulerConfig.long_prefill_token_threshold`` (0: unset): the most
    #: tokens one prefill chunk takes; a Mamba block wider than it advances
    #: by sub-block chunks in align mode (vLLM 0.27 on).
    long_prefill: int = 0

    @property
    def drafter_method(self) -> str:
        """The model-based drafter's ``SpeculativeConfig.method`` ("" none)."""
        return ("eagle" if self.eagle else "draft_model" if self.draft_model
                else "mtp" if self.mtp else "")

    def vllm_groups(self) -> list[Any]:
        """vLLM's ``KVCacheSpec`` of each group."""
        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

        attn = dict(block_size=self.block_size, num_kv_heads=1, head_size=8,
                    dtype=torch.float16)
        groups: list[Any] = [FullAttentionSpec(**attn)]
        if self.sliding_window is not None:
            groups.append(SlidingWindowSpec(**attn, sliding_window=self.sliding_window))
        if self.mamba is not None:
            groups.append(MambaSpec(block_size=self.block_size, shapes=((8,),),
                                    dtypes=(torch.float16,), mamba_cache_mode=self.mamba))
        if self.eagle and self.eagle_own_group:
            groups.append(FullAttentionSpec(**attn))
        return groups

    def group_layers(self) -> list[list[str]]:
        """Each group's layer names: ``l<i>``, the drafter's ``d0`` with the
        target's full-attention layer or in its own group."""
        layers = [[f"l{i}"] for i in range(len(self.vllm_groups()))]
        if self.drafter_method:
            layers[-1 if self.eagle_own_group else 0] = (
                ["d0"] if self.eagle_own_group else ["l0", "d0"])
        return layers

    def groups(self) -> tuple[CacheSpec, ...]:
        """stepwarm's KV cache groups of this runner, read off vLLM's specs
        (``cache_spec_from_vllm``: per-release facts included)."""
        from stepwarm.probe import cache_spec_from_vllm

        return tuple(cache_spec_from_vllm(g) for g in self.vllm_groups())

    def profile(self, sched: Any = None) -> RunnerProfile:
        """stepwarm's profile of this runner (with an EAGLE drafter, its facts
        read off ``sched``, the :func:`build_scheduler` of this config, as
        the probe reads them off a worker)."""
        drafter, lookahead = None, 0
        if self.drafter_method:
            from stepwarm.drafter import Drafter, _eagle_groups, _hash_lookahead
            from stepwarm.vllm_facts import prefill_lookahead_tokens

            vc, kvc = sched.vllm_config, sched.kv_cache_config
            spec = vc.speculative_config
            lookahead = int(sched.num_lookahead_tokens)  # (0.26: the scheduler derives it)
            groups = tuple(i for i, g in enumerate(self.group_layers()) if "d0" in g)
            drafter = Drafter(
                method=self.drafter_method, num_speculative_tokens=self.num_spec_tokens,
                model=str(spec.draft_model_config.model), layers=("d0",),
                kv_cache_groups=groups, own_group=self.eagle_own_group,
                num_lookahead_tokens=lookahead, num_hash_lookahead_tokens=_hash_lookahead(vc),
                num_prefill_lookahead_tokens=prefill_lookahead_tokens(vc),
                eagle_groups=_eagle_groups(spec, kvc, _hash_lookahead(vc)))
        return tiny_profile().model_copy(update=dict(
            max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len, num_blocks=self.num_blocks,
            enable_prefix_caching=self.enable_caching, num_lookahead_tokens=lookahead,
            num_speculative_steps=self.num_spec_tokens, draft_slots=0, warmup_draft_slots=0,
            drafter=drafter,
            uncached_frees_append=False,
            kv_cache_groups=self.groups(),
            # as the probe reads it off the installed scheduler (an n-gram
            # speculator: static, no dynamic_sd_lookup)
            pad_spec_decode=scheduler_pad_rule() if self.num_spec_tokens else "",
            caches_after_output=bool(self.num_spec_tokens) and scheduler_caches_after_output(),
            mamba_align_rule="0.26" if scheduler_mamba_align_rule() == "0.26" else "0.29",
            # the scheduler's chunk cap, as the probe reads it (0.27: less a
            # draft model's slots)
            max_prefill_tokens=(max_prefill_tokens(sched.vllm_config.scheduler_config)
                                if sched is not None else 0),
            mamba_cache_mode=self.mamba or "none",
        ))


@dataclass(frozen=True)
class Arrival:
    """One request of a stream: added before step ``at``; aborted before step
    ``abort_at`` (None: runs to ``max_tokens``)."""

    at: int
    prompt_len: int
    max_tokens: int
    abort_at: int | None = None
    #: (drafts proposed, of them accepted) after each sampled step, cycled
    #: (the proposal capped at ``num_spec_tokens``, the acceptance at the
    #: drafts the scheduler sent); empty: none.
    drafts: tuple[tuple[int, int], ...] = ()


@dataclass
class StepRecord:
    """A scheduler step as a recording holds it, and what the scheduler sent."""

    index: int
    #: req_id -> num_scheduled_tokens
    tokens: dict[str, int]
    #: req_id -> num_computed_tokens before the step
    computed: dict[str, int]
    #: req_id -> block ids per group (whole table: new and resumed; else new_block_ids)
    blocks: dict[str, tuple[tuple[int, ...], ...]]
    new: set[str]
    resumed: set[str]
    finished: set[str]
    preempted: set[str]
    #: req_id -> draft tokens the runner accepted (requests sent drafts)
    accepted: dict[str, int] = field(default_factory=dict)
    #: req_id -> draft tokens sent (``scheduled_spec_decode_tokens``)
    drafts: dict[str, int] = field(default_factory=dict)
    #: requests sent placeholder drafts (-1: vLLM's pad_spec_decode)
    padded: set[str] = field(default_factory=set)


def build_scheduler(cfg: Config) -> Any:
    """vLLM's ``Scheduler`` on CPU over the tiny Llama's config, one
    group per :meth:`Config.vllm_groups` (full attention, then a sliding
    window and a Mamba group where asked), ``cfg.block_size``-token blocks."""
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, SpeculativeConfig, VllmConfig)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from stepwarm.zoo import write_model

    target = "tiny-deepseek-v3-mtp" if cfg.mtp else "tiny-llama"
    mc = ModelConfig(model=str(write_model(target)), skip_tokenizer_init=True,
                     max_model_len=cfg.max_model_len)
    sc = SchedulerConfig(max_num_seqs=cfg.max_num_seqs,
                         max_num_batched_tokens=cfg.max_num_batched_tokens,
                         max_model_len=cfg.max_model_len, is_encoder_decoder=False,
                         enable_chunked_prefill=True,
                         **({"long_prefill_token_threshold": cfg.long_prefill}
                            if cfg.long_prefill else {}))
    cc = CacheConfig(block_size=cfg.block_size, enable_prefix_caching=cfg.enable_caching,
                     **({"mamba_cache_mode": cfg.mamba} if cfg.mamba else {}))
    cc.num_gpu_blocks = cfg.num_blocks
    spec = None
    if cfg.eagle:
        spec = SpeculativeConfig(method="eagle", model=str(write_model("tiny-llama-eagle") / "drafter"),
                                 num_speculative_tokens=cfg.num_spec_tokens,
                                 target_model_config=mc, target_parallel_config=ParallelConfig())
    elif cfg.draft_model:
        spec = SpeculativeConfig(method="draft_model",
                                 model=str(write_model("tiny-llama-draft") / "drafter"),
                                 num_speculative_tokens=cfg.num_spec_tokens,
                                 target_model_config=mc, target_parallel_config=ParallelConfig())
    elif cfg.mtp:
        spec = SpeculativeConfig(method="mtp", num_speculative_tokens=cfg.num_spec_tokens,
                                 target_model_config=mc, target_parallel_config=ParallelConfig())
    elif cfg.num_spec_tokens:
        spec = SpeculativeConfig(method="ngram", num_speculative_tokens=cfg.num_spec_tokens,
                                 prompt_lookup_max=2, prompt_lookup_min=1,
                                 target_model_config=mc, target_parallel_config=ParallelConfig())
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"), speculative_config=spec)
    if cfg.mtp:  # as on a GPU: vLLM's CPU platform turns chunked prefill and
        # prefix caching off for the MLA target, widens the budget and sets
        # 16-token blocks; the scheduler's rules are the same either way
        vc.scheduler_config.enable_chunked_prefill = True
        vc.scheduler_config.max_num_batched_tokens = cfg.max_num_batched_tokens
        if getattr(vc.scheduler_config, "max_num_scheduled_tokens", None) is not None:
            vc.scheduler_config.max_num_scheduled_tokens = cfg.max_num_batched_tokens
        vc.cache_config.enable_prefix_caching = cfg.enable_caching
        vc.cache_config.block_size = cfg.block_size
    own = cfg.eagle and cfg.eagle_own_group
    specs = cfg.vllm_groups()
    assert not own or eagle_group_flag(), "this release's KVCacheGroupSpec has no is_eagle_group"
    groups = [KVCacheGroupSpec(names, g, **({"is_eagle_group": True}
                                            if own and i == len(specs) - 1 else {}))
              for i, (names, g) in enumerate(zip(cfg.group_layers(), specs))]
    kvc = KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=cfg.block_size)


def eagle_group_flag() -> bool:
    """Whether the installed ``KVCacheGroupSpec`` flags drafter groups
    (``is_eagle_group``)."""
    import dataclasses as dc

    from vllm.v1.kv_cache_interface import KVCacheGroupSpec

    return any(f.name == "is_eagle_group" for f in dc.fields(KVCacheGroupSpec))


def _hasher(cfg: Config, sched: Any) -> Any:
    """The request block hasher ``EngineCore`` builds: with a drafter's hash
    lookahead (vLLM 0.33 on) where the config has one."""
    if not cfg.enable_caching:
        return None
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    global _HASH_READY
    if not _HASH_READY:
        init_none_hash(sha256)
        _HASH_READY = True
    lookahead = getattr(sched.vllm_config, "num_hash_lookahead_tokens", 0) or 0
    return get_request_block_hasher(cfg.block_size, sha256,
                                    *([lookahead] if lookahead else []))


def _ids(blocks: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g) for g in blocks)


def record(out: Any, num_groups: int = 1) -> StepRecord:
    """What one ``SchedulerOutput`` sent, per request (no new block: an
    empty tuple for each of the ``num_groups`` KV cache groups)."""
    rec = StepRecord(0, dict(out.num_scheduled_tokens), {}, {}, set(), set(),
                     set(out.finished_req_ids), set(getattr(out, "preempted_req_ids", None) or ()))
    for nr in out.scheduled_new_reqs:
        rec.computed[nr.req_id] = nr.num_computed_tokens
        rec.blocks[nr.req_id] = _ids(nr.block_ids)
        rec.new.add(nr.req_id)
    c = out.scheduled_cached_reqs
    resumed = set(getattr(c, "resumed_req_ids", ()) or ())
    for i, rid in enumerate(c.req_ids):
        rec.computed[rid] = c.num_computed_tokens[i]
        nb = c.new_block_ids[i]
        rec.blocks[rid] = _ids(nb) if nb is not None else ((),) * num_groups
        if rid in resumed:
            rec.resumed.add(rid)
    for rid, spec in out.scheduled_spec_decode_tokens.items():
        rec.drafts[rid] = len(spec)
        if spec and all(t == PLACEHOLDER_DRAFT for t in spec):
            rec.padded.add(rid)
    return rec


def stepwarm_record(step: PlannedStep, num_groups: int = 1) -> StepRecord:
    """The same view of one of stepwarm's steps."""
    rec = StepRecord(step.index, {}, {}, {}, set(), set(), set(step.finished_req_ids),
                     set(step.preempted_req_ids))
    for r in step.scheduled:
        rec.tokens[r.req_id] = r.num_scheduled_tokens
        rec.computed[r.req_id] = r.num_computed_tokens
        rec.blocks[r.req_id] = r.block_ids if r.block_ids else ((),) * num_groups
        if r.new:
            rec.new.add(r.req_id)
        if r.resumed:
            rec.resumed.add(r.req_id)
        if r.spec_token_ids:
            rec.drafts[r.req_id] = len(r.spec_token_ids)
            if not r.num_drafts_verified:
                rec.padded.add(r.req_id)
    return rec


def _fields(rec: StepRecord) -> dict[str, Any]:
    d = dataclasses.asdict(rec)
    d.pop("index")
    d.pop("accepted")  # the recording's input to stepwarm, not its output
    return d


#: Empty scheduler steps in a row, past the last arrival with requests
#: unfinished, after which the stream has stalled: vLLM's known stall
#: (:func:`stalls_on_mamba_align`: :class:`ConfigRefused`), else a failure.
STALLED_STEPS = 20


def stalls_on_mamba_align(cfg: Config, sched: Any) -> bool:
    """vLLM's stall of 0.26 - 0.34 (docs/findings.md): in Mamba align mode a
    prefill's budget, less a draft model's slots
    (``max_num_new_slots_for_drafting``; 0.26 takes them off
    ``max_num_scheduled_tokens``), is narrower than the block, so the
    block-aligned split floors every chunk before the prompt's end to 0."""
    spec = sched.vllm_config.speculative_config
    slots = getattr(spec, "max_num_new_slots_for_drafting", 0) if spec is not None else 0
    budget = min(sched.max_num_scheduled_tokens, cfg.max_num_batched_tokens - slots)
    return cfg.mamba == "align" and budget < cfg.block_size


@dataclass
class Replay:
    """One stream through both sides."""

    cfg: Config
    arrivals: list[Arrival]
    #: Scheduler steps after the last arrival before giving up.
    max_steps: int = 1000
    #: Block ids compared exactly; else up to renumbering (:meth:`compare`).
    exact: bool = True
    sched: Any = None
    builder: PlanBuilder | None = None
    pairs: list[tuple[StepRecord, StepRecord]] = field(default_factory=list)
    #: stepwarm's view of a request resumed and still recomputing.
    _resuming: set[str] = field(default_factory=set)
    _prompt: dict[str, int] = field(default_factory=dict)
    #: Requests some step has sent.
    _sent: set[str] = field(default_factory=set)
    #: Renumbering: vLLM block id -> stepwarm's, and back.
    _ours: dict[int, int] = field(default_factory=dict)
    _theirs: dict[int, int] = field(default_factory=dict)
    #: Steps whose block ids differed only by renumbering.
    renumbered: int = 0
    #: Per request: drafts proposed so far, and the acceptance of the last.
    _proposed: dict[str, int] = field(default_factory=dict)
    _will_accept: dict[str, int] = field(default_factory=dict)
    #: vLLM block id -> (its cache entry's hash, the step that made it).
    _cached_at: dict[int, tuple[Any, int]] = field(default_factory=dict)

    def run(self) -> list[tuple[StepRecord, StepRecord]]:
        """Every step, as (scheduler, stepwarm) records; stops when the
        scheduler has nothing left."""
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request, RequestStatus

        from stepwarm.compile import prompt_token_ids

        cfg = self.cfg
        if cfg.mamba == "align" and cfg.block_size > cfg.max_num_batched_tokens and \
                scheduler_mamba_align_rule() == "0.26":
            # 0.26 floors every chunk before the last block boundary to a
            # boundary the budget cannot reach: an empty chunk each step, the
            # request never scheduled (0.29 on advance sub-block there)
            raise ConfigRefused(f"vLLM 0.26's scheduler never schedules a prefill whose Mamba "
                                f"block ({cfg.block_size}) is wider than the token budget "
                                f"({cfg.max_num_batched_tokens})")
        try:
            self.sched = s = build_scheduler(cfg)
        except AssertionError as e:
            if "requires at least two attention groups" in str(e):
                raise ConfigRefused(str(e)) from e
            raise
        profile = cfg.profile(s)
        self.builder = PlanBuilder(profile, name="oracle")
        hasher = _hasher(cfg, s)
        num_groups = len(profile.kv_cache_groups)
        reqs = [(f"r{i}", a) for i, a in enumerate(self.arrivals)]
        last = max((a.at for a in self.arrivals), default=0)
        t = 0
        idle = 0  # empty steps in a row after the last arrival, requests unfinished
        while t <= last or s.has_unfinished_requests() or s.finished_req_ids:
            if t > last + self.max_steps:
                raise AssertionError(f"stream not done after {t} steps")
            if idle >= STALLED_STEPS:
                what = (f"vLLM's scheduler sent {idle} empty steps in a row with "
                        f"{len(s.waiting)} request(s) waiting (block {cfg.block_size}, "
                        f"max_num_batched_tokens {cfg.max_num_batched_tokens}, Mamba "
                        f"{cfg.mamba}, drafter "
                        f"{cfg.drafter_method or 'n-gram' if cfg.num_spec_tokens else 'none'})")
                if not stalls_on_mamba_align(cfg, s):
                    raise AssertionError(what + ": no known cause")
                raise ConfigRefused(what)
            for i, (rid, a) in enumerate(reqs):
                if a.at == t:
                    decl = PlannedRequest(rid, a.prompt_len, sampling="greedy")
                    self.builder.add_request(decl)
                    self._prompt[rid] = a.prompt_len
                    s.add_request(Request(
                        rid, prompt_token_ids(decl, profile),
                        SamplingParams(max_tokens=a.max_tokens, ignore_eos=True), None,
                        block_hasher=hasher))
                if a.abort_at == t and rid in s.requests:
                    s.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
            # what a preempted request's lookup finds before the step's
            # allocations (get_computed_blocks reads; log_stats is off)
            ahead = {r.request_id: s.kv_cache_manager.get_computed_blocks(r)[1]
                     for r in s.waiting if r.status == RequestStatus.PREEMPTED}
            # and the blocks a new or preempted request's lookup finds there
            # (per group)
            found = {r.request_id: _ids(s.kv_cache_manager.get_computed_blocks(r)[0]
                                        .get_block_ids())
                     for r in s.waiting
                     if r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)}
            out = s.schedule()
            idle = idle + 1 if (t > last and not out.total_num_scheduled_tokens
                                and not out.finished_req_ids) else 0
            theirs = record(out, num_groups)
            theirs.index = t
            # a request aborted before any step sent it: the runner never
            # saw it, and no recording names it
            theirs.finished &= self._sent
            # vLLM 0.34 sends a resumed request again as a new one
            # (NewRequestData): a resumption all the same
            again = theirs.new & self._sent
            theirs.new -= again
            theirs.resumed |= again
            self.check_modelled(theirs, ahead, found)
            self.check_unique_hits(theirs)
            self._sent.update(theirs.new)
            sampled = self.sample(out, theirs)
            mine = stepwarm_record(self.plan_step(theirs), num_groups)
            self.pairs.append((theirs, mine))
            self.compare(theirs, mine)
            s.update_from_output(out, model_runner_output(list(out.num_scheduled_tokens),
                                                          sampled))
            self.propose(out, reqs)
            t += 1
        return self.pairs

    def sample(self, out: Any, rec: StepRecord) -> list[list[int]]:
        """The runner's sampled tokens, a list per scheduled request: none
        while its prompt (or resumption) is not done, else one plus the
        drafts it accepts (its stream's pattern, at most the drafts sent),
        recorded in ``rec.accepted``."""
        sampled = []
        for rid in out.num_scheduled_tokens:
            req = self.sched.requests[rid]
            if req.num_computed_tokens < req.num_tokens:
                sampled.append([])
                continue
            sent = len(out.scheduled_spec_decode_tokens.get(rid, ()))
            # placeholder drafts (pad_spec_decode): the rejection sampler
            # accepts none
            a = 0 if rid in rec.padded else min(self._will_accept.get(rid, 0), sent)
            if sent and rid not in rec.padded:
                # the drafts the output keeps: a stop at max_tokens drops those
                # accepted past it (STEPWARM_RECORD records what the output
                # kept: update_from_output's new_token_ids)
                left = req.sampling_params.max_tokens - req.num_output_tokens
                rec.accepted[rid] = max(0, min(a, left - 1))
            sampled.append([OUTPUT_BASE + int(rid[1:])] * (1 + a))
        return sampled

    def propose(self, out: Any, reqs: list[tuple[str, Arrival]]) -> None:
        """The speculator's drafts for the next step
        (``update_draft_token_ids``): each request of the step still running
        proposes its pattern's next count, at most ``num_spec_tokens``."""
        k = self.cfg.num_spec_tokens
        if not k:
            return
        from vllm.v1.outputs import DraftTokenIds

        ids, drafts = [], []
        for rid in out.num_scheduled_tokens:
            pattern = reqs[int(rid[1:])][1].drafts
            if not pattern or rid not in self.sched.requests:
                continue
            j = self._proposed.get(rid, 0)
            self._proposed[rid] = j + 1
            d, a = pattern[j % len(pattern)]
            self._will_accept[rid] = a
            ids.append(rid)
            drafts.append([OUTPUT_BASE + int(rid[1:])] * min(d, k))
        self.sched.update_draft_token_ids(DraftTokenIds(ids, drafts))

    def check_unique_hits(self, rec: StepRecord) -> None:
        """Raise :class:`Unmodelled` for a prefix hit on a block whose
        content two blocks cached in one step hold: vLLM returns the one
        cached first, and which was first follows the order of the
        allocations within that step (running requests first, then the waiting
        queue); stepwarm allocates a step's rows prefills first, then
        decodes, then resumptions (docs/block-accounting.md)."""
        pool = self.sched.kv_cache_manager.block_pool
        bs, when = self.cfg.block_size, self._cached_at
        for rid in rec.new | rec.resumed:
            for b in rec.blocks[rid][0][:rec.computed[rid] // bs]:
                h = pool.blocks[b].block_hash
                steps = [when[x.block_id][1] for x in pool.blocks
                         if x.block_hash is not None and x.block_hash == h and
                         x.block_id in when]
                if len(steps) > len(set(steps)):
                    raise Unmodelled("a hit among duplicate cache entries of one step")
        # the cache entries made in this step (a request's hash objects are
        # its own: an entry made again by another request is a new object)
        for x in pool.blocks:
            if x.block_hash is None:
                when.pop(x.block_id, None)
            elif when.get(x.block_id, (None,))[0] is not x.block_hash:
                when[x.block_id] = (x.block_hash, rec.index)

    def check_modelled(self, rec: StepRecord, ahead: dict[str, int],
                       found: dict[str, tuple[tuple[int, ...], ...]]) -> None:
        """Raise :class:`Unmodelled` for a new request whose prefix hit reads a
        block another request of the same step took from the pool or made a
        cache entry, and for a resumed request whose hit is not the one it
        had before the step (``ahead``: an earlier row of the step evicted a
        block of it), or a new or resumed request whose hit blocks are not those a
        lookup before the step finds (``found``: an earlier row evicted a
        copy): vLLM's scheduler looks each waiting request up right before
        its allocation, stepwarm takes a hit before the step's allocations
        (docs/block-accounting.md)."""
        if rec.padded and self.cfg.mamba == "align":
            # PlanBuilder._pad_drafts: vLLM drops the padding where its Mamba
            # block-aligned split clips the row; stepwarm sends it unpadded
            raise Unmodelled("placeholder drafts beside a Mamba align group")
        for rid in rec.resumed:
            if rid in ahead and rec.computed[rid] != ahead[rid]:
                raise Unmodelled("a resumed request's hit evicted by an earlier row")
            assert self.builder is not None
            if rec.computed[rid] and not self.builder.ledger.looks_up_resumed:
                # BlockLedger.lookup: full, MLA and sliding-window groups only
                raise Unmodelled("a resumed request's prefix hit stepwarm does not look up")
        bs = self.cfg.block_size
        touched: set[int] = set()
        for rid, n in rec.tokens.items():
            c = rec.computed[rid]
            if rid in rec.new or rid in rec.resumed:
                table = rec.blocks[rid][0]
                hit = c // bs
                if rid in rec.new and hit and touched.intersection(table[:hit]):
                    raise Unmodelled("a hit on a block cached in the same step")
            else:
                table = tuple(self.sched.kv_cache_manager.get_block_ids(rid)[0])
                hit = c // bs
            # blocks filled in this step, and those taken from the pool
            touched.update(table[hit:])
        for rid in rec.new | rec.resumed:
            n = rec.computed[rid] // bs
            if n and rid in found and [g[:n] for g in rec.blocks[rid]] != \
                    [g[:n] for g in found[rid]]:
                # two cached copies of a block: an earlier row evicted the one
                # the lookup before the step finds, and vLLM hits the other
                what = "new" if rid in rec.new else "resumed"
                raise Unmodelled(f"a {what} request's hit on a copy an earlier row evicted")

    def compare(self, theirs: StepRecord, mine: StepRecord) -> None:
        """``mine`` is ``theirs``. Unless :attr:`exact`, block ids up to
        renumbering: a block taken from the pool may be any free block (it
        binds the two ids from then on), a prefix-hit block (within a new or
        resumed request's computed tokens) must be the one its id is bound
        to: which positions share a block is compared, not the ids."""
        a, b = _fields(theirs), _fields(mine)
        if self.exact:
            assert a == b, self.explain(theirs, mine)
            return
        self.renumbered += a != b
        a.pop("blocks")
        b.pop("blocks")
        assert a == b, self.explain(theirs, mine)
        assert theirs.blocks.keys() == mine.blocks.keys(), self.explain(theirs, mine)
        bs = self.cfg.block_size
        for rid, groups in theirs.blocks.items():
            ours = mine.blocks[rid]
            assert [len(g) for g in groups] == [len(g) for g in ours], self.explain(theirs, mine)
            whole = rid in theirs.new or rid in theirs.resumed
            hit = theirs.computed[rid] // bs if whole else 0
            for g, o in zip(groups, ours):
                for pos, (t, m) in enumerate(zip(g, o)):
                    if not t or not m:  # the null block (a sliding window's skipped blocks)
                        assert t == m, self.explain(theirs, mine)
                        continue
                    if pos < hit:
                        assert self._ours.get(t) == m, self.explain(theirs, mine)
                        continue
                    self._theirs.pop(self._ours.pop(t, -1), None)
                    self._ours.pop(self._theirs.pop(m, -1), None)
                    self._ours[t], self._theirs[m] = m, t

    def plan_step(self, rec: StepRecord) -> PlannedStep:
        """stepwarm's step for what the recording holds of ``rec``."""
        b = self.builder
        assert b is not None
        prefill: dict[str, int] = {}
        decode: dict[str, int] = {}
        resume: dict[str, int] = {}
        for rid, n in rec.tokens.items():
            if rid in rec.padded:  # stepwarm pads the one token itself
                n -= rec.drafts[rid]
            if rid in rec.new:
                if rec.computed[rid]:
                    b.set_computed(rid, rec.computed[rid])
                prefill[rid] = n
            elif rid in rec.resumed or rid in self._resuming:
                resume[rid] = n
            elif b.num_computed_tokens(rid) < self._prompt[rid]:
                prefill[rid] = n
            else:
                decode[rid] = n - 1
        finish = tuple(sorted(rec.finished))
        # still recomputing prompt + outputs after this step
        still = {rid for rid, n in resume.items() if rec.computed[rid] + n < b.num_tokens(rid)}
        step = b.step("custom", f"step {rec.index}", prefill=prefill, decode=decode,
                      resume=resume, finish=finish, preempt=tuple(sorted(rec.preempted)),
                      accepted=rec.accepted)
        self._resuming = (self._resuming | still) - (set(resume) - still) - rec.finished
        return step

    def explain(self, theirs: StepRecord, mine: StepRecord) -> str:
        lines = [f"step {theirs.index} differs ({self.cfg}):"]
        a, b = _fields(theirs), _fields(mine)
        for k in a:
            if a[k] != b[k]:
                lines.append(f"  {k}: vLLM {a[k]} stepwarm {b[k]}")
        lines.append("  stream: " + repr(self.arrivals))
        return "\n".join(lines)


def replay(cfg: Config, arrivals: list[Arrival], *, exact: bool = True) -> Replay:
    """Run ``arrivals`` through vLLM's scheduler and stepwarm; raise
    AssertionError at the first step that differs (block ids up to
    renumbering unless ``exact``)."""
    r = Replay(cfg, arrivals, exact=exact)
    r.run()
    return r
