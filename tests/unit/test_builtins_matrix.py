"""Every built-in scenario on a grid of realistic runner profiles: it expands
(every step within the runner's limits, nothing left live) or is skipped
with a reason, never a hard error."""

from __future__ import annotations

import itertools

import pytest

from stepwarm.blocks import BlockLedger
from stepwarm.expressions import facts_of
from stepwarm.profile import CacheSpec, ImageClass, RunnerProfile
from stepwarm.scenario import ScenarioError, builtin_names, expand, load
from tests.helpers import make_profile

FULL16 = (CacheSpec(kind="full_attention", block_size=16),)
FULL128 = (CacheSpec(kind="full_attention", block_size=128),)
HYBRID = (CacheSpec(kind="full_attention", block_size=64),
          CacheSpec(kind="mamba", block_size=64, mamba_cache_mode="align"))
GROUPS = {"b16": FULL16, "b128": FULL128, "hybrid": HYBRID}
SPEC = {"nospec": {}, "spec2": dict(num_speculative_steps=2, decode_query_len=3,
                                   num_lookahead_tokens=2)}
NUM_BLOCKS = {"few": 40, "many": 100_000}
#: Image-size classes: one fixed shape (PaliGemma-like), three (Qwen2-VL-like).
IMAGE_CLASSES = {
    "one": (ImageClass(side=16, tokens=16, prompt_tokens=18),),
    "three": (ImageClass(side=16, tokens=4, prompt_tokens=6),
              ImageClass(side=112, tokens=16, prompt_tokens=18),
              ImageClass(side=224, tokens=64, prompt_tokens=66)),
}


def _fits(p: RunnerProfile) -> bool:
    """vLLM starts only if one request of max_model_len fits in the KV cache."""
    need = BlockLedger.for_profile(p).required(p.max_model_len)
    return sum(need) <= p.num_blocks - 1


def _grid() -> dict[str, RunnerProfile]:
    out: dict[str, RunnerProfile] = {}
    for seqs, mnbt, mml, (gname, groups), (sname, spec), (bname, nb) in itertools.product(
            (1, 2, 3, 8, 256), (16, 128, 512, 8192), (64, 512, 4096), GROUPS.items(),
            SPEC.items(), NUM_BLOCKS.items()):
        if mnbt < seqs:  # vLLM: max_num_batched_tokens >= max_num_seqs
            continue
        p = make_profile(
            runner="v1", kv_cache_groups=groups, num_blocks=nb, max_model_len=mml,
            max_num_seqs=seqs, max_num_batched_tokens=mnbt, vocab_size=1000,
            mamba_cache_mode="align" if gname == "hybrid" else "none",
            enable_prefix_caching=True, **spec)
        if _fits(p):
            out[f"s{seqs}-t{mnbt}-l{mml}-{gname}-{sname}-{bname}"] = p
    for (seqs, mnbt, mml), (bname, nb) in itertools.product(
            ((1, 16, 64), (2, 16, 512), (3, 128, 512), (8, 512, 4096), (256, 8192, 4096)),
            NUM_BLOCKS.items()):
        cands = {f"pooling-s{seqs}-t{mnbt}-l{mml}-{bname}": make_profile(
            runner="v1", kv_cache_groups=FULL16, num_blocks=nb, max_model_len=mml,
            max_num_seqs=seqs, max_num_batched_tokens=mnbt, vocab_size=1000,
            is_pooling_model=True, pooling_task="embed")}
        for enc in (16, 1500):
            if enc > mnbt:  # vLLM: the encoder input fits one step's budget
                continue
            cands[f"encdec{enc}-s{seqs}-t{mnbt}-l{mml}-{bname}"] = make_profile(
                runner="v1", num_blocks=nb, max_model_len=mml, max_num_seqs=seqs,
                max_num_batched_tokens=mnbt, vocab_size=1000, is_encoder_decoder=True,
                max_encoder_len=enc, kv_cache_groups=(
                    FULL16[0], CacheSpec(kind="cross_attention", block_size=16)))
        for cname, classes in IMAGE_CLASSES.items():
            if max(c.tokens for c in classes) > max(mnbt, 64):
                continue
            cands[f"mm-{cname}-s{seqs}-t{mnbt}-l{mml}-{bname}"] = make_profile(
                runner="v1", kv_cache_groups=FULL16, num_blocks=nb, max_model_len=mml,
                max_num_seqs=seqs, max_num_batched_tokens=mnbt, vocab_size=1000,
                image_classes=classes, max_images_per_prompt=2,
                # vLLM: the encoder budget holds at least the largest image
                encoder_budget=max(mnbt, max(c.tokens for c in classes)))
        out.update((k, p) for k, p in cands.items() if _fits(p))
    return out


PROFILES = _grid()


def test_grid_is_big_and_varied():
    assert len(PROFILES) > 300
    assert any(p.num_blocks == 40 for p in PROFILES.values())
    assert any(p.is_pooling_model for p in PROFILES.values())
    assert any(p.is_encoder_decoder for p in PROFILES.values())
    assert sum(bool(p.image_classes) for p in PROFILES.values()) > 10


@pytest.mark.parametrize("name", builtin_names())
def test_builtin_expands_or_skips_on_every_profile(name):
    sc = load(name)
    errors, ran, skipped = [], 0, 0
    for pname, p in PROFILES.items():
        try:
            plan = expand(sc, p)
        except ScenarioError as e:
            errors.append(f"{pname}: {e}")
            continue
        if plan.skipped:
            skipped += 1
            assert plan.skipped.strip() and not plan.steps, (pname, plan.skipped)
            continue
        ran += 1
        assert plan.steps, pname
        # Mamba align: every prefill chunk but the last ends on a Mamba block
        # boundary, unless the block exceeds the token budget
        # (Scheduler._mamba_block_aligned_split)
        align = [g.block_size for g in p.kv_cache_groups
                 if g.kind == "mamba" and g.mamba_cache_mode == "align"
                 and g.block_size <= p.max_num_batched_tokens]
        for st in plan.steps:
            for r in st.scheduled:
                if r.samples or r.spec_token_ids:
                    continue  # a decode, or the chunk that finishes the prefill
                end = r.num_computed_tokens + r.num_scheduled_tokens
                assert all(end % bs == 0 for bs in align), (pname, st.label, r.req_id, end)
                assert end % facts_of(p)["prefill_chunk_align"] == 0, (pname, st.label)
        live: set[str] = set()
        running: set[str] = set()  # vLLM's running queue: at most max_num_seqs
        held: dict[str, int] = {}  # blocks each live request holds
        for st in plan.steps:
            assert len(st.scheduled) <= p.max_num_seqs, (pname, st.label)
            assert st.total_num_scheduled_tokens <= p.max_num_batched_tokens, (pname, st.label)
            live |= {r.req_id for r in st.scheduled}
            live -= st.finished_req_ids
            running |= {r.req_id for r in st.scheduled}
            running -= st.finished_req_ids | st.preempted_req_ids
            assert len(running) <= p.max_num_seqs, (pname, st.label, sorted(running))
            for rid in st.finished_req_ids | st.preempted_req_ids:
                held.pop(rid, None)
            held.update((rid, sum(counts)) for rid, counts in st.held_blocks)
            assert sum(held.values()) <= p.num_blocks - 1, (pname, st.label)
        assert not live, (pname, sorted(live))
    assert not errors, f"{len(errors)} error(s), e.g.:\n" + "\n".join(errors[:15])
    assert ran, f"{name} never expands on the grid"


def test_chunking_builtins_chunk_on_mamba_align_profiles():
    """The built-ins that chunk a prefill still do so, on block boundaries,
    on a hybrid runner whose Mamba block fits the token budget."""
    p = PROFILES["s8-t512-l4096-hybrid-nospec-many"]
    assert facts_of(p)["prefill_chunk_align"] == 64
    for name in ("chunked-prefill", "mamba-align", "preempt-resume", "prefix-hit"):
        plan = expand(load(name), p)
        assert not plan.skipped, (name, plan.skipped)
        ends = [r.num_computed_tokens + r.num_scheduled_tokens
                for st in plan.steps for r in st.scheduled if not r.samples]
        assert ends and all(e % 64 == 0 for e in ends), (name, ends)
