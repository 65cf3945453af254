"""Canonical dump of many plans, to show a planning change leaves them alike.

Hashes (sha256) of, per item: ``repr`` of every built-in scenario's plan
(with its ``lockstep_signature`` and each step's derived counts and hash) on
every profile of ``tests/unit/test_builtins_matrix.py`` (or the error it
raises), the ``benchmarks/plan_speed.py`` plan with its ledger's tables and
cache, ``plans_for(["all"])`` on that profile, and a lifecycle of prefill,
mixed prefill+decode, decodes, preemption, resumption and cleanup (with and
without prefix caching, one and two groups, 5 and 64 requests) with its
ledger's tables. Run it before and after a change, with the same
``PYTHONHASHSEED``, and compare the files byte for byte:

    PYTHONHASHSEED=0 python benchmarks/plan_dump.py before.json
    PYTHONHASHSEED=0 python benchmarks/plan_dump.py after.json
    cmp before.json after.json

The plans are read after every step was planned, so a step whose rows are
built when first read (``PlannedStep.scheduled``) is checked as well.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]

import plan_speed  # noqa: E402

from stepwarm.plan import PlanBuilder, PlannedRequest  # noqa: E402
from stepwarm.profile import CacheSpec  # noqa: E402
from stepwarm.scenario import ScenarioError, builtin_names, expand, load, plans_for  # noqa: E402
from tests.helpers import make_profile  # noqa: E402
from tests.unit.test_builtins_matrix import PROFILES  # noqa: E402


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _lifecycle(num_reqs: int, caching: bool, groups: int) -> str:
    spec = CacheSpec(kind="full_attention", block_size=16)
    profile = make_profile(max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * 40,
                           num_blocks=num_reqs * 8, kv_cache_groups=(spec,) * groups,
                           enable_prefix_caching=caching)
    ids = [f"_stepwarm_r{i}_" for i in range(num_reqs)]
    half = num_reqs // 2
    b = PlanBuilder(profile, name="work")
    for rid in ids:
        b.add_request(PlannedRequest(rid, 24))
    b.step("prefill", "prefill", prefill={rid: 24 for rid in ids[:half]})
    b.step("mixed_prefill_decode", "mixed", prefill={rid: 24 for rid in ids[half:]},
           decode={rid: 0 for rid in ids[:half]})
    for _ in range(7):
        b.step("decode", "decode", decode={rid: 0 for rid in ids})
    b.step("preempt", "preempt", preempt=tuple(ids[:half]),
           decode={rid: 0 for rid in ids[half:]})
    for rid in ids[:half]:  # the scheduler's prefix lookup on resumption
        b.resume_lookup(rid)
    b.step("resume", "resume", resume={rid: b.num_tokens(rid) - b.num_computed_tokens(rid)
                                       for rid in ids[:half]})
    b.step("decode", "decode", decode={rid: 0 for rid in ids})
    b.cleanup()
    return repr(b.build()) + repr(b.ledger._tables)


def main() -> None:
    out: dict[str, str] = {}
    for name in builtin_names():
        sc = load(name)
        for pname, p in PROFILES.items():
            try:
                plan = expand(sc, p)
                text = repr(plan) + "\n" + plan.lockstep_signature() + repr([
                    (st.total_num_scheduled_tokens, st.req_ids, st.new_block_counts,
                     st.num_sampling_requests, hash(st)) for st in plan.steps])
            except ScenarioError as e:
                text = f"ERR {e}"
            out[f"{name}/{pname}"] = _sha(text)
    profile = plan_speed.bench_profile()
    b = plan_speed.plan_steps(profile)
    out["bench"] = _sha(repr(b.build()) + repr(b.ledger._tables) + repr(b.ledger.pool.cache.entries))
    out["all"] = _sha(repr(plans_for(["all"], profile)))
    for caching in (False, True):
        for groups in (1, 2):
            for num_reqs in (5, 64):
                out[f"work/{caching}/{groups}/{num_reqs}"] = _sha(
                    _lifecycle(num_reqs, caching, groups))
    Path(sys.argv[1]).write_text(json.dumps(out, indent=0, sort_keys=True))
    print(f"{len(out)} items ({len(builtin_names()) * len(PROFILES)} built-in plans and errors)")


if __name__ == "__main__":
    main()
