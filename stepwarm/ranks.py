"""RankGroup: keep every rank whose forward passes meet in lockstep.

Under tensor or pipeline parallelism each worker process runs the same plan,
and every ``execute_model`` takes part in collectives: a rank that skips or
fails a step the others run leaves them waiting in a collective forever. So
the hook, on every rank:

* agrees on the plans before the first step (a digest of each plan's steps;
  ranks that would run different steps fail together, before anything runs);
* after every step, synchronizes the device and agrees on which ranks failed
  it; a failure on any rank stops all of them at the same step;
* agrees on whether the time limit is reached before each scenario.

The agreement is a sum of one flag per rank over stepwarm's own gloo process
groups, with the members of vLLM's groups: first over the rank's tensor
parallel group, then over its pipeline parallel group, which covers the whole
TP x PP grid of one engine, then, where the data parallel ranks' forward
passes meet (:func:`stepwarm.vllm_facts.data_parallel_facts`: a MoE model
with DP > 1, its expert-parallel all-to-all or its experts sharded over DP),
over its data parallel group, which covers DP x TP x PP. Dense data parallel
engines warm up independently. :func:`agreeing_ranks` is the rule as plain
data. Each wait is bounded by
``timeout_s``. A rank whose peers do not answer in time is stuck beside a
peer that is blocked in a collective, which nothing in-process can release:
it logs why and ends its own process, and vLLM's executor (multiprocessing,
on one node or several, or Ray's), seeing a worker die, fails start-up on
every rank.

Nothing here reads the environment (``MASTER_ADDR``, ``RANK``, ...): the ranks
and groups come from vLLM's parallel state and the gloo groups are made over
the ``torch.distributed`` world vLLM's executor set up, so mp workers, Ray
actors and workers on other nodes are found the same way.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

logger = logging.getLogger("vllm.stepwarm")


#: stepwarm's own gloo groups, by member ranks (made once per process).
_GROUPS: dict[tuple[int, ...], Any] = {}

#: The least time joining a group may take (seconds), whatever ``timeout_s``.
#: Joining connects to each peer's gloo listener; on a loaded host a peer that
#: is alive and joining can answer late (two CPU DP engines on 2 cores: gloo's
#: connect refused for over 10 s, then connected). A short
#: ``STEPWARM_RANK_TIMEOUT_S`` bounds the agreements, not this.
JOIN_TIMEOUT_FLOOR_S = 120.0


def _own_group(ranks: list[int], timeout_s: float) -> Any:
    """A gloo process group of ``ranks`` for stepwarm's agreements alone.

    Not vLLM's ``cpu_group``: on the CPU worker the model's own collectives
    run there, and a rank that skipped a step would match its agreement
    against a peer's all-reduce. Only the members create it
    (``use_local_synchronization``), so data parallel engines do not wait
    for each other. None for a group of one.
    """
    key = tuple(sorted(ranks))
    if len(key) == 1:
        return None
    if key not in _GROUPS:
        import torch.distributed as dist

        _GROUPS[key] = dist.new_group(list(key), backend="gloo",
                                      timeout=timedelta(seconds=join_timeout_s(timeout_s)),
                                      use_local_synchronization=True)
    return _GROUPS[key]


def join_timeout_s(timeout_s: float) -> float:
    """How long joining stepwarm's group waits for its peers (seconds)."""
    return max(timeout_s, JOIN_TIMEOUT_FLOOR_S)


def _dp_group() -> Any:
    """vLLM's data parallel group coordinator, None where it has none."""
    try:
        from vllm.distributed.parallel_state import get_dp_group

        return get_dp_group()
    except Exception:  # noqa: BLE001 - not initialized, or a release without it
        return None


class RankTimeout(RuntimeError):
    """Peers did not reach an agreement point within ``timeout_s``."""


def _exit_process(message: str) -> None:  # pragma: no cover - ends the process
    logger.error("%s; ending this worker process so that start-up fails on every "
                 "rank instead of hanging", message)
    logging.shutdown()
    os._exit(1)


@dataclass(frozen=True)
class Layout:
    """The parallel sizes of a set of data parallel engines, laid out as vLLM
    lays out world ranks (``initialize_model_parallel``: ``[DP, PP, TP]``,
    TP fastest; prefill/decode context parallelism of size 1).

    Attributes:
        dp_size, tp_size, pp_size: vLLM's sizes.
        dp_coupled: the DP ranks' forward passes meet
            (:class:`stepwarm.vllm_facts.DataParallelFacts` ``coupled``).
        why: why they do or do not, one phrase.
    """

    dp_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    dp_coupled: bool = False
    why: str = ""

    def world_rank(self, dp: int, pp: int, tp: int) -> int:
        """The world rank of DP rank ``dp``'s worker at (``pp``, ``tp``)."""
        return (dp * self.pp_size + pp) * self.tp_size + tp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of world rank ``rank``."""
        engine = self.tp_size * self.pp_size
        return rank // engine, rank % engine // self.tp_size, rank % self.tp_size


def agreeing_ranks(layout: Layout, rank: int) -> list[int]:
    """The world ranks that agree with world rank ``rank`` on plans and step
    outcomes, sorted: its engine's TP x PP grid, and with ``dp_coupled`` the
    same grid of every DP rank (DP x TP x PP)."""
    dp, _, _ = layout.coords(rank)
    dps = range(layout.dp_size) if layout.dp_coupled else (dp,)
    return sorted(layout.world_rank(d, p, t) for d in dps
                  for p in range(layout.pp_size) for t in range(layout.tp_size))


def agreement_rule(layout: Layout) -> str:
    """The rule that applies to ``layout``, and why, one line for the log."""
    engine = layout.tp_size * layout.pp_size
    if layout.dp_size > 1 and layout.dp_coupled:
        n = layout.dp_size * engine
        return (f"ranks agree across DP x TP x PP ({layout.dp_size} x {layout.tp_size} x "
                f"{layout.pp_size} = {n} ranks): {layout.why}")
    rule = f"ranks agree within this engine's TP x PP ({engine} rank{'s' * (engine > 1)})"
    if layout.dp_size > 1:
        rule += f"; its {layout.dp_size} DP ranks warm up independently"
    return f"{rule}: {layout.why}" if layout.why else rule


@dataclass
class RankGroup:
    """The ranks of one engine that run a plan together.

    A single-process engine is ``RankGroup()`` (rank 0 of 1): every
    agreement is local and free.

    Attributes:
        rank: this worker's rank in vLLM's world group.
        tp_rank, tp_size, pp_rank, pp_size: its place in the TP x PP grid.
        dp_rank, dp_size: its engine's data parallel rank and vLLM's DP size.
        dp_coupled: the DP ranks agree too (DP x TP x PP), see :class:`Layout`.
        rule: the rule that applies and why (:func:`agreement_rule`).
        timeout_s: seconds to wait at an agreement point (seconds).
    """

    rank: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    timeout_s: float = 300.0
    dp_rank: int = 0
    dp_size: int = 1
    dp_coupled: bool = False
    rule: str = ""
    #: (tp group, pp group, dp group): stepwarm's own torch ``ProcessGroup``s
    #: (gloo), None for a group of one (the dp group: None unless coupled).
    _groups: tuple[Any, ...] | None = field(default=None, repr=False)
    #: Called when a wait times out; ends the process by default.
    on_timeout: Callable[[str], None] = field(default=_exit_process, repr=False)

    @property
    def size(self) -> int:
        """Ranks in the group (``tp_size * pp_size``, times ``dp_size`` when
        ``dp_coupled``)."""
        return self.tp_size * self.pp_size * (self.dp_size if self.dp_coupled else 1)

    @property
    def index(self) -> int:
        """This rank's slot in the grid (``pp_rank * tp_size + tp_rank``, plus
        ``dp_rank * tp_size * pp_size`` when ``dp_coupled``)."""
        dp = self.dp_rank if self.dp_coupled else 0
        return (dp * self.pp_size + self.pp_rank) * self.tp_size + self.tp_rank

    @property
    def grid(self) -> str:
        """``DP x TP x PP`` when the DP ranks agree too, else ``TP x PP``."""
        return "DP x TP x PP" if self.dp_coupled else "TP x PP"

    @property
    def label(self) -> str:
        """``rank R (tp T/TS, pp P/PS)`` (``(dp D/DS, tp ...`` with DP > 1),
        for log lines and reports."""
        dp = f"dp {self.dp_rank}/{self.dp_size}, " if self.dp_size > 1 else ""
        return (f"rank {self.rank} ({dp}tp {self.tp_rank}/{self.tp_size}, "
                f"pp {self.pp_rank}/{self.pp_size})")

    @property
    def layout(self) -> Layout:
        """The parallel sizes as plain data (the rule of :func:`agreeing_ranks`)."""
        return Layout(self.dp_size, self.tp_size, self.pp_size, self.dp_coupled)

    @classmethod
    def of_worker(cls, worker: WorkerView, timeout_s: float = 300.0) -> RankGroup:
        """The group of the worker's engine, read off vLLM's parallel state
        (``get_tp_group()``, ``get_pp_group()``, ``get_dp_group()``,
        ``get_world_group()``) and, for the DP ranks, off the worker's
        ``vllm_config`` (:func:`stepwarm.vllm_facts.data_parallel_facts`).

        Returns ``RankGroup()`` when vLLM's distributed state is not set up.
        """
        try:
            from vllm.distributed.parallel_state import (
                get_pp_group,
                get_tp_group,
                get_world_group,
            )

            tp, pp, world = get_tp_group(), get_pp_group(), get_world_group()
        except Exception:  # noqa: BLE001 - no distributed state: one rank
            return cls(timeout_s=timeout_s)
        dp = _dp_group()
        dp_rank, dp_size = (int(dp.rank_in_group), int(dp.world_size)) if dp else (0, 1)
        why, coupled = "", False
        config = getattr(worker, "vllm_config", None)
        if dp_size > 1 and config is not None:
            from stepwarm.vllm_facts import data_parallel_facts

            facts = data_parallel_facts(config)
            why, coupled = facts.why, facts.coupled
        group = cls(
            rank=int(world.rank), tp_rank=int(tp.rank_in_group), tp_size=int(tp.world_size),
            pp_rank=int(pp.rank_in_group), pp_size=int(pp.world_size), timeout_s=timeout_s,
            dp_rank=dp_rank, dp_size=dp_size, dp_coupled=coupled,
        )
        group.rule = agreement_rule(Layout(dp_size, group.tp_size, group.pp_size, coupled, why))
        if group.size > 1:
            group.join(list(tp.ranks), list(pp.ranks), list(dp.ranks) if coupled and dp else None)
        return group

    def join(self, tp_ranks: list[int], pp_ranks: list[int],
             dp_ranks: list[int] | None = None) -> None:
        """Make (or find) stepwarm's gloo groups of these world ranks, the
        agreements' route: TP, then PP, then DP where it is coupled. Every
        member must call this; each join waits :func:`join_timeout_s`.

        Raises:
            RankTimeout: a peer did not join in time (after ``on_timeout``).
        """
        try:
            self._groups = (_own_group(tp_ranks, self.timeout_s), _own_group(pp_ranks, self.timeout_s),
                            _own_group(dp_ranks, self.timeout_s) if dp_ranks else None)
        except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError on timeout
            message = (f"stepwarm: {self.label}: the other ranks did not join stepwarm's "
                       f"agreement group within {join_timeout_s(self.timeout_s):g} s "
                       f"({type(e).__name__}: {e})")
            self.on_timeout(message)
            raise RankTimeout(message) from e

    def _gather(self, value: int, what: str) -> list[int]:
        """Every rank's ``value``, indexed by grid slot (sum of one-hot vectors,
        over the TP group, then the PP group, then the DP group)."""
        if self.size == 1 or self._groups is None:
            return [value]
        import torch
        import torch.distributed as dist

        values = torch.zeros(self.size, dtype=torch.int64)
        values[self.index] = value
        for group in self._groups:
            if group is None:
                continue
            try:
                work = dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group,
                                       async_op=True)
                work.wait(timeout=timedelta(seconds=self.timeout_s))
            except Exception as e:  # noqa: BLE001 - gloo raises RuntimeError on timeout
                message = (f"stepwarm: {self.label}: the other ranks did not reach {what} "
                           f"within {self.timeout_s:g} s ({type(e).__name__}: {e})")
                self.on_timeout(message)
                raise RankTimeout(message) from e
        return values.tolist()

    def failed_ranks(self, failed: bool, what: str) -> list[int]:
        """Grid slots of the ranks that report ``failed`` at ``what`` (all
        ranks must call this at the same point)."""
        if self.size == 1:
            return [self.index] if failed else []
        flags = self._gather(int(failed), what)
        return [i for i, f in enumerate(flags) if f]

    def union(self, mask: int, what: str) -> int:
        """The bitwise OR of every rank's ``mask`` (at most 62 bits; all ranks
        must call this at the same point)."""
        if self.size == 1:
            return mask
        out = 0
        for m in self._gather(mask, what):
            out |= m
        return out

    def differing_ranks(self, text: str, what: str) -> list[int]:
        """Grid slots whose ``text`` differs from slot 0's (compared by a
        60-bit SHA-256 digest)."""
        if self.size == 1:
            return []
        digest = int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)
        digests = self._gather(digest, what)
        return [i for i, d in enumerate(digests) if d != digests[0]]
