"""A pooling runner (the zoo's tiny-llama-embed: the tiny Llama converted to an embedding model) on the
CPU worker, in a fresh process: vLLM's pooling branch of warmup_kernels and
the pooling built-in."""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.helpers import script_result

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json
    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for

    if __name__ == "__main__":
        # The zoo's embedding model: the tiny Llama (its limits, its word-level
        # tokenizer) with runner="pooling", convert="embed".
        engine = start_engine("tiny-llama-embed")
        profile = read_profile(engine.view)
        out = {"profile": profile.model_dump(), "runs": {}}
        for plan in plans_for(["default", "pooling"], profile):
            report = drive(engine.view, plan, profile)
            out["runs"][plan.name] = {
                "report": report.to_dict(),
                "prefilled": [[r.req_id for r in s.scheduled
                               if r.num_computed_tokens + r.num_scheduled_tokens
                               == plan.request(r.req_id).prompt_len] for s in plan.steps],
            }
        out["live"] = sorted(engine.view.live_request_ids())
        # The consistency oracle: the pooling built-in's embeddings vs LLM.embed.
        from dataclasses import asdict
        from stepwarm.verify import verify
        (plan,) = plans_for(["pooling"], profile)
        out["verify"] = asdict(verify(engine.llm, engine.view, plan, profile))
        out["live_after_verify"] = sorted(engine.view.live_request_ids())
        print("RESULT " + json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    return script_result(tmp_path_factory.mktemp("pool"), SCRIPT)


def test_profile_reads_a_pooling_runner(result):
    assert result["profile"]["is_pooling_model"] and result["profile"]["pooling_task"] == "embed"


def test_default_on_a_pooling_runner_is_prefill_then_cleanup(result):
    report = result["runs"]["default"]["report"]
    assert [s["kind"] for s in report["steps"]] == ["prefill", "cleanup"]
    prefill = report["steps"][0]
    assert prefill["num_reqs"] == 8 and prefill["num_scheduled_tokens"] == 16
    assert prefill["sampled"] is None
    # One pooler output per request whose prompt completed.
    assert sorted(prefill["pooled"]) == sorted(result["runs"]["default"]["prefilled"][0])


def test_pooling_builtin_pools_every_finished_prompt(result):
    run = result["runs"]["pooling"]
    report = run["report"]
    assert report["ok"] and report["left_in_runner"] == [] and result["live"] == []
    for step, prefilled in zip(report["steps"], run["prefilled"]):
        assert step["sampled"] is None
        if step["num_reqs"]:
            assert sorted(step["pooled"]) == sorted(prefilled)
    assert sum(len(p) for p in run["prefilled"]) == len({r for p in run["prefilled"] for r in p})


def test_pooling_builtin_embeddings_equal_llm_embed(result):
    """Every request the pooling built-in pools gets the embedding vLLM's own
    scheduler path gives its prompt (LLM.embed), within 1e-3 per element."""
    rep = result["verify"]
    assert rep["skipped"] == "" and rep["embedding_differs"] == []
    pooled = {r for p in result["runs"]["pooling"]["prefilled"] for r in p}
    assert len(rep["embedding_error"]) == len(pooled)
    assert all(0 <= e <= 1e-3 for e in rep["embedding_error"].values())
    assert result["live_after_verify"] == []
