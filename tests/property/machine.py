"""The lifecycle state machine every block-accounting property runs on.

:class:`Lifecycle` drives stepwarm's :class:`~stepwarm.plan.PlanBuilder` (and
through it :class:`~stepwarm.blocks.BlockLedger`) and the oracle
(:class:`~tests.property.oracle.Oracle`, vLLM's ``KVCacheManager``) side by
side. Rules: add a request; schedule a step in which every declared request
independently gets one action the scheduler could give it (skip, a prefill
chunk, a decode of ``1`` or ``1 + k`` tokens, finish, preempt, resume). The
subclasses in ``test_*.py`` each check one property as an ``@invariant``.

A step stepwarm refuses for lack of blocks (``PlanError`` on ``blocks``) is
not sent to the oracle; any other ``PlanError`` fails the test (the machine
only generates steps the scheduler can produce).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

from hypothesis import assume, event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest, PlannedStep
from tests.property.oracle import Oracle
from tests.property.strategies import MAX_LIVE, KVConfig, kv_configs


@dataclass
class Snapshot:
    """Block state of one request around a step."""

    stepwarm: tuple[int, ...] | None
    oracle: tuple[int, ...] | None


class Lifecycle(RuleBasedStateMachine):
    """Plan steps with stepwarm and replay them on vLLM's KVCacheManager."""

    #: Strategy for the config; subclasses narrow it (the mutation test).
    configs = kv_configs()

    def __init__(self) -> None:
        super().__init__()
        self.cfg: KVConfig | None = None
        self.builder: PlanBuilder | None = None
        self.oracle: Oracle | None = None
        self.next_id = 0
        self.state: dict[str, str] = {}  # waiting/running/preempted/finished
        self.prompt: dict[str, int] = {}
        self.computed: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.encoder: dict[str, int] = {}
        #: The last step and the oracle's view of it.
        self.last_step: PlannedStep | None = None
        self.last_refused = False
        self.before: dict[str, Snapshot] = {}
        self.oracle_new: dict[str, tuple[list[int], ...]] = {}
        self.live_before: set[str] = set()
        self.known_before: set[str] = set()
        #: Prefix hits taken this step (req -> tokens).
        self.hits: dict[str, int] = {}
        #: The oracle's new_block_ids_to_zero for the last step.
        self.oracle_zero: list[int] = []
        self.oracle_refused = False
        #: stepwarm's ledger before this step's first hit.
        self.pre_hit = None
        #: vLLM's copy-on-write copies in the last step / ever (stepwarm
        #: sends none: its ids then differ from vLLM's).
        self.copies = 0
        self.cow_seen = False
        #: Each running request's place in the scheduler's running queue (the
        #: order it entered it; a resumed one enters it again, at the end).
        self.queued: dict[str, int] = {}
        self.enqueued = itertools.count()

    # -- setup -----------------------------------------------------------
    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        cfg = data.draw(type(self).configs, label="config")
        self.cfg = cfg
        self.profile = cfg.profile()
        self.builder = PlanBuilder(self.profile, name="property")
        self.oracle = cfg.oracle()
        # Hits align where vLLM's managers align them.
        if cfg.enable_caching:
            assert self.builder.ledger.cache_alignment == self.oracle.hit_alignment(), (
                f"stepwarm aligns hits to {self.builder.ledger.cache_alignment} tokens, "
                f"vLLM's coordinator to {self.oracle.hit_alignment()}")
        # stepwarm reads the same vLLM specs through its adapter.
        assert self.oracle.stepwarm_specs == self.profile.kv_cache_groups
        assert tuple(s.model_copy(update={"vllm_class": "", "zeroed": None, "fine_grained_hits": None,
                                           "checkpoint_recached": None})
                     for s in self.profile.kv_cache_groups) == tuple(
            s.model_copy(update={"vllm_class": ""}) for s in cfg.specs)

    # -- helpers ---------------------------------------------------------
    def live(self) -> list[str]:
        """Requests holding blocks (running: sent and not finished/preempted)."""
        return [r for r, s in self.state.items() if s == "running"]

    def _align(self, rid: str, start: int, end: int, prefill_end: int, total: int) -> int:
        """The scheduler's Mamba align-mode rule: a chunk that ends before
        the prefill end ends on a block boundary."""
        bs = self.cfg.mamba_align_block_size
        if bs is None or end >= prefill_end or end == total:
            return end
        aligned = end // bs * bs
        return aligned if aligned > start else -1

    def _chunk(self, data: st.DataObject, rid: str, left: int, prefill_end: int) -> int | None:
        start = self.computed[rid]
        total = start + left
        n = data.draw(st.one_of(st.just(left), st.integers(1, left)), label=f"{rid} chunk")
        end = self._align(rid, start, start + n, prefill_end, total)
        if end <= start:
            end = total  # no aligned end inside the chunk: take the rest
        return end - start

    def _lookup(self, data: st.DataObject, rid: str) -> None:
        """A waiting request's prefix-cache lookup (``get_computed_blocks``),
        taken by stepwarm as a ``prefix_hit`` of the same length. Every
        request's prompt is ``0, 1, ...``, so earlier requests' cached prompt
        blocks hit. Hits that are not a whole number of blocks of every group
        (vLLM 0.32's partial-block hits) are not a stepwarm step: dropped."""
        if self.computed[rid] or not data.draw(st.booleans(), label=f"{rid} lookup"):
            return
        try:
            n = self.oracle.lookup(rid)
        except AssertionError as e:
            # vLLM's own limits (e.g. chunked local attention with another
            # block size: "KV cache groups with different block sizes are
            # not compatible with chunked local attention now").
            event(f"prefix lookup unsupported by vLLM: {str(e)[:60]}")
            self.oracle.drop_hit(rid)
            return
        if not n:
            return
        if self.oracle.untrimmed_hit(rid):
            # A vLLM 0.26 bug (fixed in 0.32): not a hit the scheduler
            # should make, and not one stepwarm models.
            event("prefix hit: vLLM left a group's hit blocks untrimmed, not taken")
            self.oracle.drop_hit(rid)
            return
        if any(s.kind == "chunked_local_attention" for s in self.cfg.specs):
            # vLLM's ChunkedLocalAttentionManager nulls the blocks before the
            # chunk of the *lookup's* max length, not of the hit: not modelled.
            event("prefix hit: chunked local attention, not taken")
            self.oracle.drop_hit(rid)
            return
        if any(n % s.block_size for s in self.cfg.specs):
            event("prefix hit: partial block, not taken")
            self.oracle.drop_hit(rid)
            return
        if self.pre_hit is None:
            self.pre_hit = copy.deepcopy(self.builder.ledger)
        try:
            self.builder.set_computed(rid, n)
        except PlanError as e:
            assert e.field == "blocks", e
            event("prefix hit: refused for blocks")
            self.oracle.drop_hit(rid)
            return
        event("prefix hit")
        self.hits[rid] = n
        self.computed[rid] = n

    def _resume_lookup(self, rid: str, num_tokens: int) -> None:
        """A preempted request's lookup as the scheduler makes it when it
        resumes one (``num_computed_tokens == 0`` -> ``get_computed_blocks``,
        never skipped), and stepwarm's planner takes it by itself
        (:meth:`PlanBuilder.resume_lookup`): both must find the same hit.
        Where stepwarm's rule does not apply (groups other than full or MLA
        attention, a drafter: ``BlockLedger.looks_up_resumed``), neither side
        takes one (the machine's rule before issue 41)."""
        ledger = self.builder.ledger
        if not ledger.looks_up_resumed:
            return
        try:
            n = self.oracle.lookup(rid)
        except AssertionError as e:
            event(f"prefix lookup unsupported by vLLM: {str(e)[:60]}")
            assume(False)
        mine = ledger.lookup(rid, self.prompt[rid], num_tokens)
        if n != mine and any(n % s.block_size for s in self.cfg.specs):
            # vLLM 0.32's partial-block hits (not a stepwarm hit)
            event("resume lookup: partial block, example discarded")
            assume(False)
        assert n == mine, f"resume lookup of {rid}: vLLM finds {n} tokens, stepwarm {mine}"
        if n:
            event("resume lookup: hit")
            self.hits[rid] = n
            self.computed[rid] = n

    # -- rules -----------------------------------------------------------
    # No preconditions: a disabled rule makes hypothesis retry and give up
    # on the example; a rule with nothing to do returns instead.
    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        cfg = self.cfg
        if sum(s != "finished" for s in self.state.values()) >= MAX_LIVE:
            return
        rid = f"r{self.next_id}"
        self.next_id += 1
        # The engine refuses prompts of max_model_len tokens or more here (a
        # prompt must leave room for one sampled token).
        top = cfg.max_model_len - 1
        prompt = data.draw(st.one_of(st.integers(1, min(8, top)), st.integers(1, top)),
                           label="prompt_len")
        enc = 0
        if cfg.is_encoder_decoder:
            enc = data.draw(st.one_of(st.just(cfg.max_encoder_len),
                                      st.integers(0, cfg.max_encoder_len)), label="encoder_len")
        self.builder.add_request(PlannedRequest(rid, prompt, encoder_len=enc))
        self.oracle.add(rid, prompt, enc)
        self.state[rid], self.prompt[rid], self.computed[rid] = "waiting", prompt, 0
        self.outputs[rid], self.encoder[rid] = 0, enc

    @rule(data=st.data())
    def schedule_step(self, data: st.DataObject) -> None:
        cfg = self.cfg
        if all(s == "finished" for s in self.state.values()):
            return
        prefill: dict[str, int] = {}
        decode: dict[str, int] = {}
        resume: dict[str, int] = {}
        finish: list[str] = []
        preempt: list[str] = []
        for rid, state in list(self.state.items()):
            if state == "finished":
                continue
            num_tokens = self.prompt[rid] + self.outputs[rid]
            computed, outputs = self.computed[rid], self.outputs[rid]
            capped = num_tokens >= cfg.max_model_len  # finished by length
            options = ["skip"]
            if state == "waiting":
                options.append("prefill")
            elif state == "running":
                options.append("finish")
                if not capped:
                    options.append("preempt")
                    if outputs and computed < num_tokens - 1:
                        options.append("resume")  # a chunked resumption continues
                    elif computed < self.prompt[rid]:
                        options.append("prefill")
                    else:
                        options.append("decode")
            elif state == "preempted":
                options += ["resume", "finish"]
            action = data.draw(st.sampled_from(options), label=f"{rid} action")
            if action == "prefill":
                if state == "waiting" and cfg.enable_caching:
                    self._lookup(data, rid)
                left = self.prompt[rid] - self.computed[rid]
                prefill[rid] = self._chunk(data, rid, left, self.prompt[rid])
            elif action == "resume":
                if state == "preempted" and cfg.enable_caching:
                    self._resume_lookup(rid, num_tokens)
                left = num_tokens - self.computed[rid]
                resume[rid] = self._chunk(data, rid, left, max(self.prompt[rid], num_tokens - 1))
            elif action == "decode":
                # The scheduler never schedules past max_model_len - 1.
                room = cfg.max_model_len - 1 - (self.computed[rid] + 1)
                k = data.draw(st.integers(0, max(0, min(cfg.num_speculative_steps, room))),
                              label=f"{rid} drafts")
                decode[rid] = k
            elif action == "finish":
                finish.append(rid)
            elif action == "preempt":
                preempt.append(rid)
        if not (prefill or decode or resume or finish or preempt):
            self._undo_hits()
            return
        self._run_step(prefill, decode, resume, tuple(finish), tuple(preempt))
        self.hits, self.pre_hit = {}, None

    def _undo_hits(self) -> None:
        """Hits whose step did not happen: both sides forget them (stepwarm's
        ledger as it was before the first of them)."""
        for rid in self.hits:
            self.oracle.drop_hit(rid)
            self.builder._requests[rid].num_computed_tokens = 0
            self.computed[rid] = 0
        if self.pre_hit is not None:
            self.builder.ledger = self.pre_hit
        self.hits, self.pre_hit = {}, None

    def _run_step(self, prefill, decode, resume, finish, preempt) -> None:
        b, o = self.builder, self.oracle
        self.live_before = set(self.live())
        #: Requests the runner knows (sent, not finished) before the step.
        self.known_before = {r for r, st_ in self.state.items() if st_ in ("running", "preempted")}
        # A refused step leaves the ledger as before this step's hits.
        base = self.pre_hit if self.pre_hit is not None else b.ledger
        ledger_before = (base.num_free, {r: base.held(r) for r in base.live_requests()})
        self.before = {}
        for rid in list(prefill) + list(decode) + list(resume):
            sw = b.ledger.held_counts(rid) if rid in b.ledger.live_requests() else None
            orc = o.held_counts(rid) if self.state[rid] == "running" else None
            self.before[rid] = Snapshot(sw, orc)
        note(f"step prefill={prefill} decode={decode} resume={resume} "
             f"finish={finish} preempt={preempt}")
        try:
            step = b.step("custom", "property", prefill=prefill, decode=decode,
                          resume=resume, finish=finish, preempt=preempt)
        except PlanError as e:
            assert e.field == "blocks", f"stepwarm refused a step the scheduler makes: {e}"
            event("step refused: out of blocks")
            self.last_step, self.last_refused, self.refusal = None, True, str(e)
            self.refused_ledger_before = ledger_before
            self.oracle_refused = self._oracle_refuses(prefill, decode, resume, finish, preempt)
            self._undo_hits()
            return
        self.last_step, self.last_refused = step, False
        o.new_step()
        for rid in finish:
            o.finish(rid)
            self.state[rid] = "finished"
        pending = self._preempt_order(preempt)
        self.oracle_new = {}
        for row in self._in_schedule_order(list(step.scheduled), lambda r: r.req_id):
            rid, n = row.req_id, row.num_scheduled_tokens
            if self.state[rid] != "running":  # the running loop is over
                self._preempted_itself(o, pending)
            self._assume_hit_in_order(o, rid)
            cow = o.copy_pending(rid)
            got = o.schedule(rid, n)
            while got is None and pending and self.state[rid] == "running":
                self._preempt_all(o, pending[:1])  # the scheduler preempts, and tries again
                del pending[:1]
                got = o.schedule(rid, n)
            if got is None and cow:
                # vLLM reserved a copy-on-write target stepwarm does not model.
                event("vLLM refused for a copy-on-write block: example discarded")
                assume(False)
            assert got is not None, (
                f"vLLM's KVCacheManager refused {rid} ({n} tokens) that stepwarm's "
                f"ledger found room for ({o.num_free()} free)"
            )
            self.oracle_new[rid] = got
            if rid in decode:
                outs = n
            else:
                left = self.prompt[rid] + self.outputs[rid] - self.computed[rid]
                outs = 1 if n == left else 0
            o.advance(rid, n, outs)
            self.computed[rid] += n
            self.outputs[rid] += outs
            if self.state[rid] != "running":
                self.queued[rid] = next(self.enqueued)
            self.state[rid] = "running"
        self._preempted_itself(o, pending)
        self.oracle_zero = o.take_new_block_ids()
        self.copies = o.end_step()
        if self.copies:
            event("vLLM copy-on-write copies (partial-block caching): ids not modelled")
            self.cow_seen = True
        event(f"step: {len(step.scheduled)} scheduled")

    def _preempt_order(self, preempt: tuple[str, ...]) -> list[str]:
        """The step's preempted requests in the order vLLM's running loop
        preempts them: the running queue's last first."""
        return sorted(preempt, key=lambda r: self.queued.get(r, 0), reverse=True)

    def _preempted_itself(self, o: Oracle, rids: list[str], *, track: bool = True) -> None:
        """The preempted requests left when the running loop is over: the
        last of them tried to fit (its skipped blocks went back to the
        pool), preempted the others, then itself."""
        if rids:
            o.fail_to_fit(rids[-1])
        self._preempt_all(o, rids, track=track)

    def _preempt_all(self, o: Oracle, rids: list[str], *, track: bool = True) -> None:
        """Preempt ``rids`` in vLLM's manager (their blocks freed, last block
        first); ``track``: the machine's state too. Empties ``rids``."""
        for rid in rids:
            o.preempt(rid)
            if track:
                self.state[rid], self.computed[rid] = "preempted", 0
        rids.clear()

    def _in_schedule_order(self, rows: list, req_id: Callable[[Any], str]) -> list:
        """``rows`` in the order vLLM's ``schedule()`` calls
        ``allocate_slots``: the running queue's, each request where it
        entered the queue, then the others (waiting: resumed, then new) as
        they come."""
        def key(i: int) -> tuple[int, int]:
            rid = req_id(rows[i])
            return (0, self.queued[rid]) if self.state[rid] == "running" else (1, i)

        return [rows[i] for i in sorted(range(len(rows)), key=key)]

    def _assume_hit_in_order(self, o: Oracle, rid: str) -> None:
        """The scheduler looks a waiting request up right before allocating
        it, after the rows before it in the step; the machine looked it up
        when it drew the step. If an allocation in between evicted a cached
        block the hit read, the scheduler would have found another hit: not
        a lifecycle it makes (stepwarm claims a hit's blocks when the hit is
        set), so the example is discarded."""
        if rid in self.hits and not o.hit_still_found(rid):
            event("prefix hit evicted by an earlier row of the step: example discarded")
            assume(False)

    def _oracle_refuses(self, prefill, decode, resume, finish, preempt) -> bool:
        """Whether vLLM's manager refuses the step stepwarm refused: the same
        step replayed on a copy of the oracle (stepwarm's rows in order)."""
        o = self.oracle.clone()
        o.new_step()
        for rid in finish:
            o.finish(rid)
        pending = self._preempt_order(preempt)
        # stepwarm's rows: RUNNING (chunks, decodes, resumptions still
        # recomputing), then WAITING (preempted resumed, first chunks); the
        # preempted requests freed where the running loop preempts them
        rows = ([(r, n) for r, n in prefill.items() if self.state[r] == "running"]
                + [(r, 1 + k) for r, k in decode.items()]
                + [(r, n) for r, n in resume.items() if self.state[r] == "running"]
                + [(r, n) for r, n in resume.items() if self.state[r] != "running"]
                + [(r, n) for r, n in prefill.items() if self.state[r] != "running"])
        for rid, n in self._in_schedule_order(rows, lambda r: r[0]):
            running = self.state[rid] == "running"
            if not running:
                self._preempted_itself(o, pending, track=False)
            if rid in prefill:
                self._assume_hit_in_order(o, rid)
            got = o.schedule(rid, n)
            while got is None and pending and running:
                self._preempt_all(o, pending[:1], track=False)
                del pending[:1]
                got = o.schedule(rid, n)
            if got is None:
                return True
        return False
