"""vLLM 0.34's extensible KV cache backs only its null block once
``compile_or_warm_up_model`` returns (the engine commits the measured size
later): the plugin's steps must back the blocks their plan addresses first,
and leave the cache as vLLM left it. The cache itself needs CUDA's virtual
memory, so a stand-in with its ``commit`` contract (grow-only unless
``shrink``) records what the driver asks of it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stepwarm import vllm_facts
from stepwarm.plan import PlanBuilder, PlannedRequest
from stepwarm.profile import CacheSpec
from stepwarm.worker_view import WorkerView
from tests.helpers import make_profile


class Cache:
    """``ExtensibleKVCache.commit``'s contract: grow-only, ``shrink`` remaps a
    smaller prefix."""

    def __init__(self, committed: int = 1, committable: int = 40):
        self.num_committed_blocks = committed
        self.warmup_committable_blocks = committable
        self.calls: list[tuple[int, bool]] = []

    def commit(self, num_blocks: int, defragment: bool = False, shrink: bool = False) -> None:
        self.calls.append((num_blocks, shrink))
        if shrink or num_blocks > self.num_committed_blocks:
            self.num_committed_blocks = num_blocks


def _worker(cache):
    return WorkerView(SimpleNamespace(model_runner=SimpleNamespace(extensible_kv_cache=cache)))


def test_the_plans_blocks_are_backed_for_its_steps_and_given_back_after():
    cache = Cache()
    with _worker(cache).kv_blocks_backed(12):
        assert cache.num_committed_blocks == 12
    assert cache.calls == [(12, False), (1, True)] and cache.num_committed_blocks == 1


def test_given_back_when_a_step_raises():
    cache = Cache()
    with pytest.raises(RuntimeError), _worker(cache).kv_blocks_backed(5):
        raise RuntimeError("a step failed")
    assert cache.calls == [(5, False), (1, True)]


def test_nothing_asked_without_an_extensible_cache_or_when_backed_already():
    with _worker(None).kv_blocks_backed(12):  # vLLM <= 0.33, CPU: no such cache
        pass
    cache = Cache(committed=20)
    with _worker(cache).kv_blocks_backed(12):
        pass
    assert cache.calls == []


def test_a_plans_highest_block_id_is_what_it_must_back():
    p = make_profile(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),),
                     num_blocks=100)
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 9))
    b.add_request(PlannedRequest("_stepwarm_b_", 3))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 9, "_stepwarm_b_": 3})
    plan = b.build()
    ids = [i for st in plan.steps for r in st.scheduled for g in r.block_ids for i in g]
    assert sorted(ids) == [1, 2, 3, 4]  # 3 blocks of 4 for 9 tokens, 1 for 3
    assert plan.max_block_id == 4
    assert PlanBuilder(p).build().max_block_id == 0


def test_usable_blocks_are_what_vllms_warmup_may_commit():
    config = SimpleNamespace(num_blocks=100)
    runner = SimpleNamespace(kv_cache_config=config, extensible_kv_cache=Cache(committable=40))
    try:
        import vllm.v1.worker.extensible_kv_cache  # noqa: F401
    except ImportError:  # before vLLM 0.34: the config's blocks, all backed
        assert vllm_facts.usable_kv_blocks(runner, config) == 100
        return
    assert vllm_facts.usable_kv_blocks(runner, config) == 40
    runner.extensible_kv_cache = None
    assert vllm_facts.usable_kv_blocks(runner, config) == 100
