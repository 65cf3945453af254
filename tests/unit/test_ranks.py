"""Which ranks agree (issue 23): the rule as plain data, the DP facts read off
vLLM's own ``ParallelConfig``, and the agreement itself over real gloo groups
of four local processes laid out as vLLM lays out DP=2 x TP=2."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from types import SimpleNamespace

import pytest

from stepwarm.ranks import Layout, RankGroup, agreeing_ranks, agreement_rule


@pytest.mark.parametrize(("layout", "expected"), [
    # One engine: its TP x PP grid.
    (Layout(tp_size=2), {0: [0, 1], 1: [0, 1]}),
    (Layout(pp_size=2), {0: [0, 1], 1: [0, 1]}),
    # Dense DP=2: two independent engines of one rank each.
    (Layout(dp_size=2), {0: [0], 1: [1]}),
    # DP=2 x TP=2 without coupling: each engine's two TP ranks.
    (Layout(dp_size=2, tp_size=2), {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}),
    # DP=2 + EP (coupled): every rank of both engines.
    (Layout(dp_size=2, dp_coupled=True), {0: [0, 1], 1: [0, 1]}),
    (Layout(dp_size=2, tp_size=2, dp_coupled=True), {r: [0, 1, 2, 3] for r in range(4)}),
    (Layout(dp_size=2, tp_size=2, pp_size=2, dp_coupled=True), {r: list(range(8)) for r in range(8)}),
    (Layout(dp_size=2, tp_size=2, pp_size=2), {0: [0, 1, 2, 3], 5: [4, 5, 6, 7], 7: [4, 5, 6, 7]}),
])
def test_agreeing_ranks(layout, expected):
    assert {r: agreeing_ranks(layout, r) for r in expected} == expected


def test_world_ranks_follow_vllms_dp_pp_tp_order():
    # initialize_model_parallel: arange(world).reshape(-1, dp, pp, pcp, tp).
    import torch

    layout = Layout(dp_size=2, tp_size=2, pp_size=3)
    grid = torch.arange(12).reshape(2, 3, 2)
    for dp in range(2):
        for pp in range(3):
            for tp in range(2):
                rank = layout.world_rank(dp, pp, tp)
                assert rank == int(grid[dp, pp, tp])
                assert layout.coords(rank) == (dp, pp, tp)


def test_rule_names_the_grid_and_why():
    assert agreement_rule(Layout(dp_size=2, tp_size=2, dp_coupled=True, why="expert parallel MoE")) == (
        "ranks agree across DP x TP x PP (2 x 2 x 1 = 4 ranks): expert parallel MoE")
    assert agreement_rule(Layout(dp_size=2, why="dense model")) == (
        "ranks agree within this engine's TP x PP (1 rank); its 2 DP ranks warm up "
        "independently: dense model")
    assert agreement_rule(Layout(tp_size=2)) == "ranks agree within this engine's TP x PP (2 ranks)"


def _config(moe: bool, **parallel):
    from vllm.config import ParallelConfig

    # The model config is read for is_moe only.
    return SimpleNamespace(parallel_config=ParallelConfig(**parallel),
                           model_config=SimpleNamespace(is_moe=moe))


@pytest.mark.parametrize(("moe", "parallel", "coupled", "ep", "why"), [
    (True, {"data_parallel_size": 2, "enable_expert_parallel": True}, True, True,
     "expert parallel MoE: each forward pass runs an all-to-all over the 2 ranks of the EP "
     "group, across the 2 DP ranks"),
    (True, {"data_parallel_size": 2, "tensor_parallel_size": 2, "enable_expert_parallel": True},
     True, True, "expert parallel MoE: each forward pass runs an all-to-all over the 4 ranks of "
     "the EP group, across the 2 DP ranks"),
    (True, {"data_parallel_size": 2}, True, False,
     "MoE without expert parallelism: vLLM shards the experts tensor-parallel over 2 ranks "
     "across the 2 DP ranks, so each forward pass meets them"),
    (False, {"data_parallel_size": 2, "enable_expert_parallel": True}, False, False,
     "dense model: vLLM runs its data parallel ranks as independent engines"),
    (True, {"tensor_parallel_size": 2, "enable_expert_parallel": True}, False, True,
     "one data parallel rank"),
])
def test_data_parallel_facts_off_vllms_parallel_config(moe, parallel, coupled, ep, why):
    from stepwarm.vllm_facts import data_parallel_facts

    facts = data_parallel_facts(_config(moe, **parallel))
    assert (facts.coupled, facts.expert_parallel, facts.why) == (coupled, ep, why)
    assert facts.dp_size == parallel.get("data_parallel_size", 1)


# --- the agreement over real gloo groups -----------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _member(rank: int, port: int, coupled: bool, results) -> None:
    import torch.distributed as dist

    from stepwarm import ranks as ranks_mod

    layout = Layout(dp_size=2, tp_size=2, dp_coupled=coupled)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=4)
    dp, pp, tp = layout.coords(rank)
    timeouts: list[str] = []
    group = RankGroup(rank=rank, tp_rank=tp, tp_size=2, dp_rank=dp, dp_size=2,
                      dp_coupled=coupled, timeout_s=4, on_timeout=timeouts.append)
    group.join([layout.world_rank(dp, pp, t) for t in range(2)], [rank],
               [layout.world_rank(d, pp, tp) for d in range(2)] if coupled else None)
    out: dict = {"rank": rank, "size": group.size, "index": group.index}
    out["failed"] = group.failed_ranks(rank == 3, "step 0")
    out["differing"] = group.differing_ranks("plan" + ("x" if rank == 2 else ""), "plans")
    out["union"] = group.union((1 << rank) | (1 << 61 if rank == 1 else 0), "busy segments")
    # Rank 3 stops answering: the others give up in bounded time.
    if rank == 3:
        time.sleep(15)
    else:
        t0 = time.monotonic()
        try:
            group.failed_ranks(False, "step 1")
            out["timeout"] = None
        except ranks_mod.RankTimeout as e:
            out["timeout"] = str(e)
        out["waited_s"] = time.monotonic() - t0
        out["on_timeout"] = timeouts
    results.put(out)


def _spawn(target, size: int, *args) -> dict[int, dict]:
    """Run ``target(rank, port, *args, results)`` in ``size`` processes; each
    puts one dict with its ``rank``."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args, results)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in range(size):
            out = results.get(timeout=120)
            got[out["rank"]] = out
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return got


def _run(coupled: bool) -> dict[int, dict]:
    return _spawn(_member, 4, coupled)


def test_coupled_dp_ranks_agree_as_one_grid_and_time_out_in_bounded_time():
    got = _run(coupled=True)
    assert [got[r]["size"] for r in range(4)] == [4, 4, 4, 4]
    assert [got[r]["index"] for r in range(4)] == [0, 1, 2, 3]
    # A failure on DP rank 1's second TP rank stops all four.
    assert [got[r]["failed"] for r in range(4)] == [[3]] * 4
    assert [got[r]["differing"] for r in range(4)] == [[2]] * 4
    assert [got[r]["union"] for r in range(4)] == [0b1111 | 1 << 61] * 4
    for r in range(3):
        assert got[r]["timeout"] and "the other ranks did not reach step 1 within 4 s" in got[r]["timeout"]
        assert got[r]["on_timeout"] == [got[r]["timeout"]]
        assert got[r]["waited_s"] < 30


def test_independent_dp_engines_agree_within_each_engine_only():
    got = _run(coupled=False)
    assert [got[r]["size"] for r in range(4)] == [2, 2, 2, 2]
    assert [got[r]["index"] for r in range(4)] == [0, 1, 0, 1]
    # DP rank 0's engine never hears of DP rank 1's failure; DP rank 1's
    # engine sees its slot 1 fail.
    assert [got[r]["failed"] for r in range(4)] == [[], [], [1], [1]]
    assert [got[r]["differing"] for r in range(4)] == [[], [], [1], [1]]
    assert [got[r]["union"] for r in range(4)] == [0b11 | 1 << 61] * 2 + [0b1100] * 2
    # Rank 3 silent: only its engine peer (rank 2) waits; DP rank 0's engine
    # is not held.
    assert got[0]["timeout"] is None and got[1]["timeout"] is None
    assert got[0]["waited_s"] < 4
    assert "did not reach step 1 within 4 s" in got[2]["timeout"]


def _joiner(rank: int, port: int, late_s: float | None, floor_s: float, results) -> None:
    import torch.distributed as dist

    from stepwarm import ranks as ranks_mod

    ranks_mod.JOIN_TIMEOUT_FLOOR_S = floor_s
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    timeouts: list[str] = []
    group = RankGroup(rank=rank, tp_rank=rank, tp_size=2, timeout_s=1, on_timeout=timeouts.append)
    out: dict = {"rank": rank}
    if rank == 1:
        if late_s is None:  # never joins
            time.sleep(floor_s + 10)
            results.put(out)
            return
        time.sleep(late_s)
    t0 = time.monotonic()
    try:
        group.join([0, 1], [rank])
        out["failed"] = group.failed_ranks(rank == 1, "step 0")
    except ranks_mod.RankTimeout as e:
        out["timeout"], out["on_timeout"] = str(e), timeouts
    out["waited_s"] = time.monotonic() - t0
    results.put(out)


def _join(late_s: float | None, floor_s: float) -> dict[int, dict]:
    return _spawn(_joiner, 2, late_s, floor_s)


def test_a_peer_joining_later_than_the_rank_timeout_is_waited_for():
    # STEPWARM_RANK_TIMEOUT_S=1 bounds agreements; joining waits the floor.
    got = _join(late_s=3, floor_s=30)
    assert got[0]["failed"] == got[1]["failed"] == [1]
    assert 2 < got[0]["waited_s"] < 30


def test_a_peer_that_never_joins_ends_the_join_at_the_floor():
    got = _join(late_s=None, floor_s=4)
    message = got[0]["timeout"]
    assert message.startswith("stepwarm: rank 0 (tp 0/2, pp 0/1): the other ranks did not join "
                              "stepwarm's agreement group within 4 s ("), message
    assert "timeout" in message  # torch's own words after the type: the store wait's
    assert got[0]["on_timeout"] == [message]
    assert 3.5 < got[0]["waited_s"] < 15
