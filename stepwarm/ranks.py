"""RankGroup: keep every tensor / pipeline parallel rank of one engine in lockstep.

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
parallel group, then over its pipeline parallel group, which covers the whole TP x PP grid of one engine (data
parallel engines warm up independently). Each wait is bounded by
``timeout_s``. A rank whose peers do not answer in time is stuck beside a
peer that is blocked in a collective, which nothing in-process can release:
it logs why and ends its own process, and vLLM's multiprocessing executor,
seeing a worker die, fails start-up on every rank.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

logger = logging.getLogger("vllm.stepwarm")


#: stepwarm's own gloo groups, by member ranks (made once per process).
_GROUPS: dict[tuple[int, ...], Any] = {}


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
                                      timeout=timedelta(seconds=timeout_s),
                                      use_local_synchronization=True)
    return _GROUPS[key]


class RankTimeout(RuntimeError):
    """Peers did not reach an agreement point within ``timeout_s``."""


def _exit_process(message: str) -> None:  # pragma: no cover - ends the process
    logger.error("%s; ending this worker process so that start-up fails on every "
                 "rank instead of hanging", message)
    logging.shutdown()
    os._exit(1)


@dataclass
class RankGroup:
    """The ranks of one engine that run a plan together.

    A single-process engine is ``RankGroup()`` (rank 0 of 1): every
    agreement is local and free.

    Attributes:
        rank: this worker's rank in vLLM's world group.
        tp_rank, tp_size, pp_rank, pp_size: its place in the TP x PP grid.
        timeout_s: seconds to wait at an agreement point (seconds).
    """

    rank: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    timeout_s: float = 300.0
    #: (tp group, pp group): stepwarm's own torch ``ProcessGroup``s (gloo),
    #: None for a group of one.
    _groups: tuple[Any, Any] | None = field(default=None, repr=False)
    #: Called when a wait times out; ends the process by default.
    on_timeout: Callable[[str], None] = field(default=_exit_process, repr=False)

    @property
    def size(self) -> int:
        """Ranks in the group (``tp_size * pp_size``)."""
        return self.tp_size * self.pp_size

    @property
    def index(self) -> int:
        """This rank's slot in the TP x PP grid (``pp_rank * tp_size + tp_rank``)."""
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def label(self) -> str:
        """``rank R (tp T/TS, pp P/PS)``, for log lines and reports."""
        return (f"rank {self.rank} (tp {self.tp_rank}/{self.tp_size}, "
                f"pp {self.pp_rank}/{self.pp_size})")

    @classmethod
    def of_worker(cls, worker: Any, timeout_s: float = 300.0) -> RankGroup:
        """The group of the worker's engine, read off vLLM's parallel state
        (``get_tp_group()``, ``get_pp_group()``, ``get_world_group()``).

        Returns ``RankGroup()`` when vLLM's distributed state is not set up.
        """
        del worker  # the parallel state is process-wide in vLLM
        try:
            from vllm.distributed.parallel_state import (
                get_pp_group,
                get_tp_group,
                get_world_group,
            )

            tp, pp, world = get_tp_group(), get_pp_group(), get_world_group()
        except Exception:  # noqa: BLE001 - no distributed state: one rank
            return cls(timeout_s=timeout_s)
        group = cls(
            rank=int(world.rank), tp_rank=int(tp.rank_in_group), tp_size=int(tp.world_size),
            pp_rank=int(pp.rank_in_group), pp_size=int(pp.world_size), timeout_s=timeout_s,
        )
        if group.size > 1:
            group._groups = (_own_group(tp.ranks, timeout_s), _own_group(pp.ranks, timeout_s))
        return group

    def _gather(self, value: int, what: str) -> list[int]:
        """Every rank's ``value``, indexed by grid slot (sum of one-hot vectors,
        over the TP group and then the PP group)."""
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

    def differing_ranks(self, text: str, what: str) -> list[int]:
        """Grid slots whose ``text`` differs from slot 0's (compared by a
        60-bit SHA-256 digest)."""
        if self.size == 1:
            return []
        digest = int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)
        digests = self._gather(digest, what)
        return [i for i, d in enumerate(digests) if d != digests[0]]
