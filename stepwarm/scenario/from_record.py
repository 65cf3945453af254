"""``stepwarm scenario from-record``: a recording reduced to a small scenario
that reaches every kernel class the recording reached.

A recorded step reaches these classes (:func:`step_classes`), the ones
stepwarm's built-in scenarios and sweeps cover:

* its token count: within the CUDA-graph range (the header's
  ``cudagraph_sizes``), the graph size it pads to; past it (or on an eager
  engine), Triton's integer specialization of the count (1, a multiple of
  16, neither: :func:`~stepwarm.expressions.buckets`) times its power-of-two
  class (a ``tl.constexpr`` block of ``next_power_of_2(count)``);
* each sampler feature present (greedy, random, top-k, top-p, both,
  penalties, seeded, structured output) at the step's sampled-row count's
  Triton class, and whether the rows are 8 or more (vLLM's top-k / top-p
  switch from torch's sort to its own kernel there);
* logprobs and prompt logprobs: the power-of-two class of ``k + 1`` and its
  Triton class (``pow2_classes`` with ``triton_int``:
  :func:`~stepwarm.scenario.sweeps.pow2_class_values`);
* each draft count sent; a prefix hit; a prefill continuing a chunk;
* on a model with fused MoE layers (the header's ``moe``), an eager step's
  ``fused_moe_kernel`` variant: the tiles vLLM picks at that token count
  (the nearest tuned size, or ``get_default_config``'s tier) and whether
  tokens x top_k is a multiple of 16 (:func:`moe_class`).

The steps are taken smallest batch first (then fewest tokens), a step kept
when it reaches a class no kept step reached: each class at the smallest
batch that reaches it, and in that order in the scenario, so that each class
is first reached (and its variant compiled) in one segment only. Each kept
step becomes a segment: its requests declared, made ready (prefilled for the
decoders, a first part for a chunk's continuation, in chunks within the
recorded budget: :class:`ChunkRule`), the step itself, then finished. Encoder inputs are recorded but not reproduced (the segment's
comment says so).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stepwarm.scenario.recording import (MoeTuning, Recording, RecordedRequest, RecordedStep,
                                         SamplerClassModel)
from stepwarm.scenario.sweeps import next_power_of_2
from stepwarm.vllm_facts import MOE_DEFAULT_BLOCK_M, MOE_DEFAULT_TIERS, MOE_TUNED_GRID
from stepwarm.words import plural

#: Sampler rows from which vLLM's top-k / top-p run its own kernel, not torch's sort.
TOPK_KERNEL_ROWS = 8


def triton_kind(n: int) -> str:
    """Triton's specialization of an integer argument: ``1``, ``16x`` (divisible by 16) or ``n``."""
    return "1" if n == 1 else "16x" if n % 16 == 0 else "n"


@dataclass(frozen=True)
class Row:
    """A recorded request of a step, with its sampler class."""

    req: RecordedRequest
    sampler: SamplerClassModel | None

    @property
    def decoding(self) -> bool:
        return self.req.computed >= self.req.prompt and not self.req.resumed

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens the row computes: its scheduled tokens, less the
        placeholder drafts vLLM's scheduler pads a waiting request with one
        token left with (``pad_spec_decode``: the scenario's planner pads
        such a row itself)."""
        r = self.req
        if r.drafts and not self.decoding and r.computed + r.scheduled - r.drafts == r.prompt:
            return r.scheduled - r.drafts
        return r.scheduled

    @property
    def samples(self) -> bool:
        """Whether the step samples a token for it (a decode, or a prefill's last chunk)."""
        return self.decoding or self.req.computed + self.req.scheduled >= self.req.prompt


def moe_class(n: int, moe: MoeTuning) -> tuple:
    """The ``fused_moe_kernel`` variant class of an eager step of ``n``
    tokens, as vLLM 0.26-0.34 launch it (``fused_experts_impl``,
    ``_prepare_expert_assignment``, ``moe_align_block_size``,
    ``invoke_fused_moe_triton_kernel``): its tiles (the tuned size nearest
    ``n``, the first in the file on a tie; with no tuned file
    ``get_default_config``'s tier and whether it groups M blocks; where the
    deployment's tuned sizes are unknown, both by :data:`MOE_TUNED_GRID`),
    the naive block assignment (n x top_k x 4 <= the experts aligned for),
    and Triton's specialization of the two i32 arguments that change with
    ``n``: ``num_valid_tokens`` (n x top_k) and ``EM`` (the padded sorted
    length, from ``BLOCK_SIZE_M``): a multiple of 16, or 1. Where top_k is
    unknown (0), n's own factor of two up to 16 stands for both."""
    def nearest(grid: Sequence[int]) -> int:
        return min(grid, key=lambda g: abs(g - n))  # the first on a tie, as vLLM's min()

    def tier() -> tuple:
        first = next((t for t in MOE_DEFAULT_TIERS if n <= t), None)
        return (first if first is not None else f">{MOE_DEFAULT_TIERS[-1]}",
                moe.experts > 0 and n // moe.experts > 128)

    default_bm = next((bm for bound, bm in MOE_DEFAULT_BLOCK_M if n <= bound), 128)
    if moe.tuned_sizes:
        size = nearest(moe.tuned_sizes)
        tiles: tuple = ("tuned", size)
        bms = moe.tuned_block_m or []
        bm = bms[moe.tuned_sizes.index(size)] if len(bms) == len(moe.tuned_sizes) else default_bm
    elif moe.tuned_sizes is None:
        tiles, bm = ("grid", nearest(MOE_TUNED_GRID), *tier()), default_bm
    else:
        tiles, bm = ("default", *tier()), default_bm
    if not moe.top_k:
        return ("moe", *tiles, min(n & -n, 16))
    valid = n * moe.top_k
    experts = moe.align_experts or moe.experts
    naive = experts > 0 and valid * 4 <= experts
    if naive:
        em = valid * bm
    else:
        em = valid + experts * (bm - 1)
        if valid < experts:
            em = min(valid * bm, em)
        if n < bm:
            em = min(em, valid * bm)
    return ("moe", *tiles, naive, _i32_class(valid), _i32_class(em))


def _i32_class(v: int) -> str:
    """Triton's specialization of an i32 argument: 1, a multiple of 16, neither."""
    return "1" if v == 1 else "16" if v % 16 == 0 else "n"


def step_classes(step: RecordedStep, rows: list[Row], graph_sizes: list[int],
                 moe: MoeTuning | None = None) -> set[tuple]:
    """The kernel classes a recorded step reaches (see the module's docstring)."""
    n = step.tokens
    out: set[tuple] = set()
    graphed = [g for g in graph_sizes if g >= n]
    out.add(("graph", graphed[0]) if graphed else ("eager", triton_kind(n), next_power_of_2(n)))
    if moe is not None and not graphed:
        out.add(moe_class(n, moe))
    sampled = [r for r in rows if r.samples and r.sampler is not None and r.sampler.kind != "pool"]
    if sampled:
        size = (triton_kind(len(sampled)), len(sampled) >= TOPK_KERNEL_ROWS)
        for r in sampled:
            s = r.sampler
            assert s is not None
            feats = [s.kind] + [f for f in ("penalties", "seeded", "structured") if getattr(s, f)]
            out.update(("sampler", f, *size) for f in feats)
            if s.logprobs is not None:
                out.add(_logprob_class("logprobs", s.logprobs))
    for r in rows:
        if r.req.new and r.sampler is not None and r.sampler.prompt_logprobs is not None:
            out.add(_logprob_class("prompt_logprobs", r.sampler.prompt_logprobs))
        if r.req.drafts:
            out.add(("drafts", r.req.drafts))
        if r.req.new and r.req.hit_blocks:
            out.add(("prefix_hit",))
        if not r.decoding and not r.req.new and r.req.computed:
            out.add(("chunk_continued",))
    return out


def _logprob_class(what: str, k: int) -> tuple:
    if k < 0:
        return (what, "vocab")
    return (what, next_power_of_2(k + 1), triton_kind(k + 1))


def rows_of(rec: Recording, session: int, step: RecordedStep) -> list[Row]:
    return [Row(r, rec.samplers.get((session, r.r))) for r in step.reqs]


@dataclass
class Reduction:
    """The kept steps, each with the classes it was kept for, and what every
    recorded step was covered by."""

    kept: list[tuple[int, int, RecordedStep, set[tuple]]] = field(default_factory=list)
    #: kept step index (in ``kept``) -> the recorded step numbers it stands for
    stands_for: dict[int, list[int]] = field(default_factory=dict)
    classes: int = 0


def reduce_steps(rec: Recording) -> Reduction:
    """Keep each recorded step that reaches a class no smaller kept step
    reached, smallest batch (then fewest tokens, then earliest) first."""
    graphs, moe = rec.header.cudagraph_sizes, rec.header.moe
    scored = [(line, sess, st, step_classes(st, rows_of(rec, sess, st), graphs, moe))
              for line, sess, st in rec.steps]
    order = sorted(range(len(scored)), key=lambda i: (scored[i][2].batch, scored[i][2].tokens, i))
    red = Reduction()
    reached: dict[tuple, int] = {}
    for i in order:
        line, sess, st, classes = scored[i]
        new = classes - set(reached)
        if new:
            for c in new:
                reached[c] = len(red.kept)
            red.kept.append((line, sess, st, new))
    for line, sess, st, classes in scored:
        last = max(reached[c] for c in classes)  # the segment by which all are reached
        red.stands_for.setdefault(last, []).append(st.step)
    for st in moe_fill(rec, set(reached)):
        new = step_classes(st, [], graphs, moe) - set(reached)
        for c in new:
            reached[c] = len(red.kept)
        red.kept.append((0, FILLED, st, new))
    red.classes = len(reached)
    return red


#: The session number of a step :func:`moe_fill` adds (no recorded session).
FILLED = -1


def moe_fill(rec: Recording, reached: set[tuple]) -> list[RecordedStep]:
    """Prefill steps for the fused MoE classes (:func:`moe_class`) between the
    CUDA-graph range and the largest eager step recorded that no recorded step
    reached, each at the smallest token count that reaches it: a recording
    samples eager prefill sizes, and the next traffic from the same
    distribution lands between them (on a Qwen3-30B-A3B shape, a 751-token
    prompt compiled two ``fused_moe_kernel`` variants that a recording of
    1,070-10,110-token steps never reached). Each step is a batch of fresh
    prompts no longer than the longest chunk any request was sent in one
    step (so they fit the engine's ``max_model_len`` and its
    ``long_prefill_token_threshold``), greedy."""
    moe, graphs = rec.header.moe, rec.header.cudagraph_sizes
    if moe is None or not rec.steps:
        return []
    lo = max(graphs) + 1 if graphs else 1
    eager = [st.tokens for _, _, st in rec.steps if st.tokens >= lo]
    if not eager:
        return []
    longest = max(r.scheduled for _, _, st in rec.steps for r in st.reqs)
    out: list[RecordedStep] = []
    seen = set(reached)
    for n in range(lo, max(eager) + 1):
        c = moe_class(n, moe)
        if c in seen:
            continue
        seen.add(c)
        k = -(-n // longest)
        prompts = [n // k + (1 if i < n % k else 0) for i in range(k)]
        out.append(RecordedStep(step=len(out), batch=k, tokens=n, finished=0, preempted=0, reqs=[
            RecordedRequest(r=i, scheduled=p, computed=0, prompt=p, new=True)
            for i, p in enumerate(prompts)]))
    return out


def sampling_of(s: SamplerClassModel | None) -> tuple[str, bool]:
    """A sampler class as the scenario's ``sampling`` value (TOML text) and
    whether the request has structured output."""
    if s is None or s.kind == "pool":  # a pooling request: no sampling
        return '"greedy"', False
    fields: dict[str, Any] = {}
    if s.kind == "greedy":
        fields["temperature"] = 0.0
    if s.kind in ("top_k", "top_k_top_p"):
        fields["top_k"] = 5
    if s.kind in ("top_p", "top_k_top_p"):
        fields["top_p"] = 0.9
    if s.penalties:
        fields["presence_penalty"] = 0.5
        fields["repetition_penalty"] = 1.1
    if s.seeded:
        fields["seed"] = 0
    if s.logprobs is not None:
        fields["logprobs"] = s.logprobs
    if s.prompt_logprobs is not None:
        fields["prompt_logprobs"] = s.prompt_logprobs
    if list(fields) == ["temperature"]:
        return '"greedy"', s.structured
    if not fields:
        return '"random"', s.structured
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items()) + " }", \
        s.structured


class _Segment:
    """The TOML of one kept step: requests, then steps."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.requests: list[str] = []
        self.steps: list[str] = []
        self.names: list[str] = []
        self.counts: dict[str, int] = {}  # each name's count
        self.notes: list[str] = []

    def request(self, prompt: int, count: int, row: Row) -> str:
        name = f"{self.prefix}_{len(self.names)}"
        sampling, structured = sampling_of(row.sampler)
        text = f"[requests.{name}]\nprompt = {prompt}\n"
        if count > 1:
            text += f"count = {count}\n"
        if row.sampler is not None and row.sampler.kind == "pool":
            text += 'kind = "pool"\n'
        else:
            text += f"sampling = {sampling}\n"
        if structured:
            text += "structured_output = true\n"
        self.requests.append(text)
        self.names.append(name)
        self.counts[name] = count
        return name

    def step(self, kind: str, comment: str = "", **fields: Any) -> None:
        text = (f"# {comment}\n" if comment else "") + f"[[steps]]\nkind = \"{kind}\"\n"
        for k, v in fields.items():
            text += f"{k} = {json.dumps(v)}\n"
        self.steps.append(text)


T = TypeVar("T")


def _group(rows: list[T], key: Callable[[T], Any]) -> list[tuple[Any, list[T]]]:
    """``rows`` grouped by ``key``, in the order each key first shows."""
    groups: dict[Any, list[T]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return list(groups.items())


def _sampler_key(r: Row) -> str:
    return r.sampler.model_dump_json() if r.sampler is not None else ""


@dataclass(frozen=True)
class ChunkRule:
    """How the ready part of a continued prefill (the tokens the recorded
    step found computed) is sent, read off the recording: no step above the
    header's ``max_num_batched_tokens``, no chunk a request longer than the
    longest prompt chunk the scheduler sent (its ``long_prefill_token_threshold``,
    which the header does not hold), and every chunk that does not end the
    ready part on a multiple of the recorded chunk ends' common divisor (on a
    Mamba align runner the scheduler ends chunks on its block: the divisor is
    a multiple of it)."""

    budget: int
    longest: int
    align: int = 1

    @classmethod
    def of(cls, rec: Recording) -> ChunkRule:
        ends, longest = [], 1
        for _, sess, st in rec.steps:
            for r in rows_of(rec, sess, st):
                if r.decoding:
                    continue
                longest = max(longest, r.prompt_tokens)
                if r.req.computed:
                    ends.append(r.req.computed)
                if r.req.computed + r.req.scheduled < r.req.prompt:
                    ends.append(r.req.computed + r.req.scheduled)
        return cls(rec.header.max_num_batched_tokens, longest, math.gcd(*ends) if ends else 1)

    def chunks(self, computed: int, requests: int) -> tuple[int, int, int, bool]:
        """``(chunk, repeat, rest, each)``: ``repeat`` chunks of ``chunk``
        tokens a request, then one of ``rest`` (0: none), that make
        ``computed``; ``each``: one request a step, where the requests'
        aligned chunks together do not fit the budget (an unaligned chunk
        only where even one request's aligned chunk does not)."""
        per = 1
        for n in (max(requests, 1), 1):
            per = max(1, min(self.budget // n, self.longest, computed))
            chunk = per // self.align * self.align
            if chunk:
                return chunk, computed // chunk, computed % chunk, n < requests
        return per, computed // per, computed % per, requests > 1


#: A recording's chunk rule where none is given (a budget no chunk reaches).
NO_CHUNK_LIMIT = ChunkRule(1 << 62, 1 << 62)


def segment(step: RecordedStep, rows: list[Row], block_size: int, line: int,
            stands_for: list[int], what: str = "",
            prefix: str = "s", rule: ChunkRule = NO_CHUNK_LIMIT) -> tuple[_Segment, set[str]]:
    """The scenario text for one kept step, and the ``needs`` it adds.

    The recorded step is sent as one step of the same requests and tokens
    (its token count, sampled rows and drafts as recorded). Where the format
    has no such step, the nearest one with the same token count is sent and
    the difference is reached in a step of its own (the segment's notes say
    which): prefix hits beside fresh prefills are sent as fresh prefills, then
    as a ``prefix_hit`` of their own; middle chunks of several lengths as last
    chunks."""
    seg = _Segment(f"{prefix}{step.step}")
    needs: set[str] = set()
    decoders = [r for r in rows if r.decoding]
    prefills = [r for r in rows if not r.decoding]
    # Decoders: prompt 1, prefilled in a step before.
    dec_names: dict[int, list[str]] = {}
    for (_, drafts), group in _group(decoders, lambda r: (_sampler_key(r), r.req.drafts)):
        dec_names.setdefault(drafts, []).append(seg.request(1, len(group), group[0]))
    drafts = sorted(d for d in dec_names if d)
    hits = [r for r in prefills if r.req.new and r.req.hit_blocks]
    hit_cached = {r.req.hit_blocks * block_size for r in hits}
    # Hits go as one step's `cached` when every prefill is a hit of one size.
    as_hits = bool(hits) and len(hits) == len(prefills) and len(hit_cached) == 1
    if hits and not as_hits:
        seg.notes.append("prefix hits beside other prefills sent as fresh prefills of the "
                         "recorded tokens, then as a prefix_hit step of their own")
    fresh = prefills if not as_hits else []
    middle = [r for r in fresh if r.req.computed + r.req.scheduled < r.req.prompt]
    sizes = {r.req.scheduled for r in middle}
    # One step sends one chunk length.
    tokens = sizes.pop() if middle and len(middle) == len(fresh) and len(sizes) == 1 else None
    if middle and tokens is None:
        seg.notes.append("middle chunks written as last chunks (the prompt ends with the "
                         "recorded chunk): one step sends one chunk length")
    pre_names: list[str] = []
    continued: list[tuple[int, str]] = []
    for _, group in _group(fresh, lambda r: (_sampler_key(r), r in hits, r.req.computed,
                                             r.req.scheduled, r.req.prompt)):
        r0 = group[0].req
        computed = 0 if group[0] in hits else r0.computed
        prompt = r0.prompt if tokens is not None else computed + group[0].prompt_tokens
        name = seg.request(max(prompt, 1), len(group), group[0])
        pre_names.append(name)
        if computed:
            continued.append((computed, name))
    if as_hits:
        for _, group in _group(hits, lambda r: (_sampler_key(r), r.req.prompt, r.req.scheduled)):
            r0 = group[0].req
            pre_names.append(seg.request(r0.computed + group[0].prompt_tokens, len(group),
                                         group[0]))
    if any(r.sampler is not None and r.sampler.structured for r in rows):
        needs.add("structured_output")
    if drafts:
        needs.add("speculator")
    if as_hits:  # the recording's engine cached prefixes; one that does not sends no hit
        needs.add("prefix_caching")
    if any(r.req.encoder_inputs for r in rows):
        seg.notes.append("encoder inputs were recorded here; not reproduced")
    # Ready: the decoders prefilled, the continued chunks' first parts computed.
    all_dec = [n for names in dec_names.values() for n in names]
    if all_dec:
        seg.step("prefill", "the decoders' prompts", requests=all_dec)
    for computed, group_names in _group(continued, lambda c: c[0]):
        names = [n for _, n in group_names]
        chunk, repeat, rest, each = rule.chunks(computed, sum(seg.counts[n] for n in names))
        one_each: dict[str, Any] = {"each": True} if each else {}
        said = f"the first {computed} tokens of a chunked prefill"
        if repeat == 1 and not rest:
            seg.step("prefill", said, requests=names, tokens=computed, **one_each)
            continue
        said += f", in chunks within max_num_batched_tokens {rule.budget}"
        seg.step("chunked_prefill", said, requests=names, tokens=chunk,
                 **({"repeat": repeat} if repeat > 1 else {}), **one_each)
        if rest:
            seg.step("chunked_prefill", requests=names, tokens=rest, **one_each)
    # The step itself.
    what = what or (f"recorded step {step.step} (line {line}): batch {step.batch}, "
                    f"{plural(step.tokens, 'token')}; stands for recorded "
                    f"{'step' if len(stands_for) == 1 else 'steps'} {_ranges(stands_for)}")
    extra: dict[str, Any] = {} if tokens is None else {"tokens": tokens}
    if as_hits:
        extra["cached"] = hit_cached.pop()
    if len(drafts) > 1 and pre_names:
        seg.notes.append(f"draft counts {drafts} beside prefills sent as {drafts[-1]} each")
    if pre_names and all_dec:
        seg.step("mixed_prefill_decode", what, prefill=pre_names, decode=all_dec, **extra,
                 **({"spec_tokens": drafts[-1]} if drafts else {}))
    elif pre_names:
        seg.step("prefix_hit" if as_hits else "prefill", what, requests=pre_names, **extra)
    elif not drafts:
        seg.step("decode", what, requests=all_dec)
    elif len(drafts) == 1 and 0 not in dec_names:
        seg.step("spec_decode", what, requests=all_dec, spec_tokens=drafts[0])
    else:
        fields: dict[str, Any] = {"spec": dec_names[drafts[-1]], "spec_tokens": drafts[-1]}
        if len(drafts) > 1:
            fields.update(partial=dec_names[drafts[0]], partial_tokens=drafts[0])
        if 0 in dec_names:
            fields["non_spec"] = dec_names[0]
        if len(drafts) > 2:
            seg.notes.append(f"draft counts {drafts[1:-1]} sent as {drafts[0]}")
            fields["partial"] = [n for d in drafts[:-1] for n in dec_names[d]]
        seg.step("mixed_decode", what, **fields)
    if hits and not as_hits:
        # the step's requests end first: the hits on their own must not run
        # beside a batch that was already full (max_num_seqs)
        seg.step("finish", requests=seg.names)
        before = len(seg.names)
        hit_names = []
        for _, group in _group(hits, lambda r: (_sampler_key(r), r.req.prompt)):
            r0 = group[0].req
            hit_names.append((r0.hit_blocks * block_size,
                              seg.request(r0.computed + group[0].prompt_tokens, len(group),
                                          group[0])))
        for cached, group_names in _group(hit_names, lambda h: h[0]):
            seg.step("prefix_hit", "the same step's prefix hits, on their own",
                     requests=[n for _, n in group_names], cached=cached)
        seg.step("finish", requests=seg.names[before:])
        return seg, needs
    seg.step("finish", requests=seg.names)
    return seg, needs


def _ranges(numbers: list[int]) -> str:
    """``0-3, 7, 9-10``."""
    runs: list[list[int]] = []
    for n in sorted(set(numbers)):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def _class_text(c: tuple) -> str:
    head, *rest = c
    if head == "graph":
        return f"CUDA-graph size {rest[0]}"
    if head == "eager":
        return f"eager tokens (Triton {rest[0]}, pow2 {rest[1]})"
    if head == "sampler":
        return f"sampler {rest[0]} at rows (Triton {rest[1]}{', >= 8' if rest[2] else ''})"
    if head in ("logprobs", "prompt_logprobs"):
        return f"{head} " + ("vocab" if rest[0] == "vocab" else f"block {rest[0]} (k+1 Triton {rest[1]})")
    if head == "drafts":
        return f"{rest[0]} draft(s)"
    if head == "moe":
        return _moe_class_text(rest)
    return head.replace("_", " ")


def _moe_class_text(rest: list) -> str:
    kind, *tiles = rest
    if kind == "tuned":
        where, tiles = f"tuned size {tiles[0]}", tiles[1:]
    else:
        size = ""
        if kind == "grid":
            size, tiles = f"size {tiles[0]} of the usual grid, ", tiles[1:]
        bound, grouped, *tiles = tiles
        where = (size + f"default tiles for {'<= ' if isinstance(bound, int) else ''}{bound} "
                 "tokens" + (", grouped" if grouped else ""))
    if len(tiles) == 1:
        return f"fused MoE at {where}, tokens divisible by {tiles[0]}"
    naive, valid, em = tiles
    words = {"1": "1", "16": "a multiple of 16", "n": "neither 1 nor a multiple of 16"}
    return (f"fused MoE at {where}{', naive blocks' if naive else ''}: tokens x top_k "
            f"{words[valid]}, padded length {words[em]}")


def scenario_text(rec: Recording, source: str) -> str:
    """The scenario TOML for a checked recording."""
    red = reduce_steps(rec)
    h = rec.header
    rule = ChunkRule.of(rec)
    segs, needs = [], set()
    for k, (line, sess, st, classes) in enumerate(red.kept):
        filled = "" if sess != FILLED else (
            f"not recorded: {plural(st.tokens, 'token')} in {plural(st.batch, 'prompt')}, a "
            "fused MoE class between the recorded eager sizes")
        # step numbers restart with each session (a server restarted onto the
        # same file): a later session's names carry its number
        prefix = "fill" if filled else "s" if sess <= 0 else f"s{sess}-"
        seg, n = segment(st, rows_of(rec, sess, st), h.block_size, line,
                         red.stands_for.get(k, []), filled, prefix, rule)
        segs.append((seg, classes))
        needs |= n
    kinds = Counter("prefill" if any(not r.decoding for r in rows_of(rec, s, st)) else "decode"
                    for _, s, st in rec.steps)
    out = [
        f"# Written by `stepwarm scenario from-record {source}`: {len(rec.steps)} recorded "
        f"steps ({kinds['prefill']} with prefills, {kinds['decode']} decodes only) reduced to "
        f"{len(segs)} segment(s)",
        f"# reaching the {red.classes} kernel classes the recording reached, each at the "
        "smallest batch that reached it, smallest first.",
        f"# Recorded on vLLM {h.vllm} ({h.runner} runner), {h.model.architecture} "
        f"(config_hash {h.model.config_hash}), block_size {h.block_size}, max_num_seqs "
        f"{h.max_num_seqs}, max_num_batched_tokens {h.max_num_batched_tokens}, "
        f"num_spec_tokens {h.num_spec_tokens}, CUDA graphs {h.cudagraph_sizes or 'none'}.",
        *(f"# The recording reached its cap (STEPWARM_RECORD_MAX_MB) at line {line}, before "
          f"step {at}: the traffic after it is not in this scenario." for line, at in rec.capped),
        "# Plain TOML: edit freely (scenarios/README.md); check it with `stepwarm check FILE`.",
        f'description = "from the recording {source}: {red.classes} kernel classes in '
        f'{len(segs)} segments"',
    ]
    if needs:
        out.append("needs = [" + ", ".join(f'"{n}"' for n in sorted(needs)) + "]")
    for k, (seg, classes) in enumerate(segs):
        out.append("")
        out.append(f"# --- segment {k + 1}: " + "; ".join(sorted(_class_text(c) for c in classes)))
        for note in seg.notes:
            out.append(f"# note: {note}")
        out.extend(seg.requests)
        out.extend(seg.steps)
    return "\n".join(out).rstrip() + "\n"


def write_scenario(record: Any, output: Any, model: str | None = None,
                   more_errors: Sequence[str] = ()) -> str:
    """Check ``record`` (against the installed vLLM's release and, with
    ``model``, that model's ``config.json``), reduce it, check the scenario's
    format and write it to ``output``.

    Args:
        more_errors: the caller's own (an unwritable ``output``), said with
            the recording's and the model's: every fault at once.

    Returns:
        One line saying what was written.

    Raises:
        RecordError: a bad recording, a ``model`` without ``config.json``,
            ``more_errors``, each naming the file (all of them, one a line),
            or ``output`` cannot be written.
    """
    import importlib.util
    from pathlib import Path

    from stepwarm.scenario.errors import ScenarioError
    from stepwarm.scenario.load import loads
    from stepwarm.scenario.recording import RecordError, load_recording, read_recording_text

    errors = list(more_errors)
    try:
        read_recording_text(record)  # missing, empty, binary: refused before vLLM is imported
        readable = True
    except RecordError as e:
        errors.append(str(e))
        readable = False
    config = None
    if model is not None:
        from stepwarm.zoo import resolve

        path, _ = resolve(model)
        try:
            if not Path(path or model).is_dir():
                from stepwarm.model_dir import check_model_dir

                check_model_dir(Path(model))  # raises: no such directory, nor a zoo model ...
            config = json.loads(Path(path or model, "config.json").read_text())
        except (OSError, ValueError) as e:  # ModelDirError is a ValueError
            errors.append(str(e) if str(e).startswith(f"--model {model}:")
                          else f"--model {model}: no readable config.json ({e})")
    rec = None
    if readable:
        version = None
        if importlib.util.find_spec("vllm") is not None:
            from stepwarm import vllm_facts

            version = vllm_facts.version()
        try:
            rec = load_recording(record, vllm_version=version, model_config=config)
        except RecordError as e:
            errors.extend(str(e).split("\n"))  # each fault its own "error:" line
    if errors or rec is None:
        raise RecordError("\nerror: ".join(errors))
    text = scenario_text(rec, Path(record).name)
    try:  # the format's own check: a fault here is stepwarm's, not the recording's
        loaded = loads(text, str(output), Path(output).stem)
    except ScenarioError as e:
        raise RuntimeError(f"stepwarm wrote a scenario its format refuses: {e}") from e
    try:
        from stepwarm.output_path import write_atomic

        write_atomic(Path(output), text)
    except OSError as e:
        raise RecordError(f"{output}: cannot write: {e.strerror or e}") from None
    n = len(loaded.model.steps)
    capped = "".join(f"; the recording reached its cap before step {at} (line {line}): the "
                     "traffic after it is not in the scenario (STEPWARM_RECORD_MAX_MB)"
                     for line, at in rec.capped)
    return (f"wrote {output}: {len(rec.steps)} recorded steps -> {n} scenario steps "
            f"({reduce_steps(rec).classes} kernel classes){capped}")
