"""Acceptance feeds back: on a real CPU engine with the zoo's EAGLE drafter
(tiny-llama-eagle, seeded weights 2, whose greedy tokens vary by position),
the driver reads what the worker accepted off ``sample_tokens``' output and
the next rows go out with ``num_computed_tokens`` lowered by the rejected
drafts, as ``Scheduler.update_from_output`` lowers them.

Under ``verify(reject_drafts_from=1)`` every spec row's first draft is the
reference's token and the second is wrong, so the target accepts exactly one
draft per row: the rows' ``num_computed_tokens`` are known exactly, and the
greedy tokens must equal ``LLM.generate``'s through vLLM's scheduler. The
same run with the rows kept as planned (acceptance not followed) differs:
the comparison can fail.

One engine, in a fresh process (run under the engine lock).
"""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.helpers import script_result

pytestmark = pytest.mark.e2e

SCENARIO = """
description = "two greedy requests: spec, spec, mixed, decode"
needs = ["speculator"]
requests.r = { prompt = "decode_query_len + 1", count = 2, sampling = "greedy" }
steps = [{ kind = "prefill", requests = ["r"] },
         { kind = "spec_decode", requests = ["r"], repeat = 2 },
         { kind = "mixed_decode", spec = ["r[0]"], non_spec = ["r[1]"] },
         { kind = "decode", requests = ["r"] }]
"""

SCRIPT = textwrap.dedent(
    '''
    import functools, json, sys
    from dataclasses import asdict
    from stepwarm import verify as V
    from stepwarm.compile import OutputHistory
    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for
    from stepwarm.zoo import ZOO, write_model

    if __name__ == "__main__":
        model_dir = write_model("tiny-llama-eagle", weights_seed=2)
        engine = start_engine(model_dir, load_format="auto",
                              **ZOO["tiny-llama-eagle"].engine_args_for(model_dir))
        worker = engine.worker
        profile = read_profile(engine.view)
        (plan,) = plans_for([sys.argv[1]], profile)
        sent = []  # per step: req -> num_computed_tokens of the cached rows sent
        execute = worker.execute_model

        def recording(out, *a, **k):
            c = out.scheduled_cached_reqs
            ids = list(out.num_scheduled_tokens) or list(out.finished_req_ids)
            if ids and all(str(r).startswith("_stepwarm") for r in ids):  # not LLM.generate's
                sent.append({r[-4:]: n for r, n in zip(c.req_ids, c.num_computed_tokens)})
            return execute(out, *a, **k)

        worker.execute_model = recording
        planned = [{r.req_id[-4:]: r.num_computed_tokens for r in s.scheduled if not r.new}
                   for s in plan.steps]
        out = {"planned": planned}
        # Placeholder drafts (0): the target rejects what it rejects.
        report = drive(engine.view, plan, profile)
        out["plain"] = {"sent": sent[:], "left": report.left_in_runner,
                        "steps": [{"rejected": s.rejected, "followed": s.followed,
                                   "sampled": s.sampled, "diverged": s.diverged}
                                  for s in report.steps]}
        reports = []
        orig = V.drive
        V.drive = lambda *a, **k: reports.append(orig(*a, **k)) or reports[-1]
        del sent[:]
        v = V.verify(engine.llm, engine.view, plan, profile, reject_drafts_from=1)
        out["verify"] = {"diff": [asdict(d) for d in v.differences], "checked": v.checked,
                         "sent": sent[:], "rejected": [s.rejected for s in reports[-1].steps],
                         "sampled": [s.sampled_token_ids for s in reports[-1].steps]}
        # The same, rows kept as planned: must differ from the scheduler.
        V.OutputHistory = functools.partial(OutputHistory, follow_acceptance=False)
        v = V.verify(engine.llm, engine.view, plan, profile, reject_drafts_from=1)
        out["fixed"] = {"diff": [asdict(d) for d in v.differences]}
        out["left"] = sorted(engine.view.live_request_ids())
        print("RESULT " + json.dumps(out))
    '''
)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acceptance")
    (tmp / "accept.toml").write_text(SCENARIO)
    return script_result(tmp, SCRIPT.replace("sys.argv[1]", repr(str(tmp / "accept.toml"))))


def test_rows_after_rejections_follow_what_was_accepted(result):
    # The plan counts every draft as computed: prompt 3 + 1, then + 1 + 2.
    assert result["planned"] == [{}, {"r_0_": 4, "r_1_": 4}, {"r_0_": 7, "r_1_": 7},
                                 {"r_0_": 10, "r_1_": 10}, {"r_0_": 13, "r_1_": 11}, {}]
    v = result["verify"]
    # One draft of two rejected in every spec row: the next rows go out 1,
    # 2, 3 tokens lower, as update_from_output has them.
    assert v["rejected"] == [None, {"_stepwarm_accept_r_0_": 1, "_stepwarm_accept_r_1_": 1},
                             {"_stepwarm_accept_r_0_": 1, "_stepwarm_accept_r_1_": 1},
                             {"_stepwarm_accept_r_0_": 1}, None, None]
    assert v["sent"] == [{}, {"r_0_": 4, "r_1_": 4}, {"r_0_": 6, "r_1_": 6},
                         {"r_0_": 8, "r_1_": 8}, {"r_0_": 10, "r_1_": 9}, {}]
    # 2 tokens per spec row (the accepted draft + the bonus token).
    assert [sorted(len(t) for t in (s or {}).values()) for s in v["sampled"]] == [
        [1, 1], [2, 2], [2, 2], [1, 2], [1, 1], []]


def test_greedy_tokens_equal_the_schedulers_after_rejections(result):
    v = result["verify"]
    assert v["diff"] == []
    # 1 (prefill) + 2 + 2 + 2 + 1 for r[0], 1 + 2 + 2 + 1 + 1 for r[1].
    assert v["checked"] == {"r[0]": 13 - 3 + 1, "r[1]": 11 - 3 + 1}
    tokens = [t for s in v["sampled"] for t in (s or {}).get("_stepwarm_accept_r_0_", [])]
    assert len(set(tokens)) > 2, tokens  # the weights' tokens vary: positions matter
    # Kept as planned, the rows run ahead of what the worker computed.
    assert result["fixed"]["diff"], "rows not following acceptance should differ"


def test_placeholder_drafts_are_followed_and_reported(result):
    p = result["plain"]
    lag: dict[str, int] = {}
    for step, sent in zip(p["steps"], p["sent"]):
        # Each cached row goes out lowered by its request's rejections so far.
        assert (step["followed"] or {}) == {r: n for r, n in lag.items() if n and any(
            r.endswith(k) for k in sent)}, (step, lag)
        for r, n in (step["rejected"] or {}).items():
            lag[r] = lag.get(r, 0) + n
    assert sum(lag.values()) > 0  # the target rejected placeholder drafts
    assert p["left"] == [] and result["left"] == []
