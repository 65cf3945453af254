"""The default scenario through the real CPU worker, and cleanup after failures."""

from __future__ import annotations

from typing import Any

import pytest

from stepwarm.blocks import ReservationContext, reserved_blocks_per_group
from stepwarm.compile import cleanup_output
from stepwarm.driver import RunnerBusyError, StepFailed, drive
from stepwarm.plan import REQ_ID_PREFIX
from stepwarm.worker_view import WorkerView
from stepwarm.sequences import default_plan, max_warmup_requests

pytestmark = pytest.mark.e2e


def _assert_runner_empty(worker: WorkerView, *, other_traffic: bool = False) -> None:
    """No stepwarm request in the runner's request dict or persistent batch;
    without other traffic, nothing at all."""
    runner = worker.runner
    assert [r for r in runner.requests if r.startswith(REQ_ID_PREFIX)] == []
    assert [r for r in runner.input_batch.req_ids if r and r.startswith(REQ_ID_PREFIX)] == []
    if not other_traffic:
        assert runner.input_batch.num_reqs == 0
        assert worker.live_request_ids() == set()


def test_profile_of_tiny_llama(profile):
    assert profile.runner == "v1"
    assert [g.kind for g in profile.kv_cache_groups] == ["full_attention"]
    assert profile.kv_cache_groups[0].block_size == 128
    assert (profile.max_model_len, profile.max_num_seqs, profile.max_num_batched_tokens) == (512, 8, 512)
    assert profile.vocab_size == 512 and profile.decode_query_len == 1
    assert profile.num_blocks > 1000


def test_default_scenario_end_to_end(engine, profile):
    plan = default_plan(profile)
    # vLLM's warmup sends min(max_num_seqs, ...) = 8 requests of 2 tokens.
    assert max_warmup_requests(profile, 2, 5) == 8
    assert [s.kind for s in plan.steps] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert engine.view.kv_connector_active()
    report = drive(engine.view, plan, profile)
    assert report.ok and report.cleanup_ran and report.left_in_runner == []
    assert [r.index for r in report.steps] == list(range(len(plan.steps)))

    ctx = ReservationContext.of(profile)
    computed: dict[str, int] = {}
    for step, result in zip(plan.steps, report.steps):
        sampling = [r.req_id for r in step.scheduled if r.samples]
        if step.sample:
            # One sampled-token list, of one token (no speculator), per request.
            assert result.sampled == {rid: 1 for rid in sampling}
        else:
            assert result.sampled is None
        for row in step.scheduled:
            computed[row.req_id] = row.num_computed_tokens + row.num_scheduled_tokens
        for rid, held in result.held_blocks.items():
            assert tuple(held) == reserved_blocks_per_group(
                computed[rid], profile.kv_cache_groups, ctx
            )
    assert report.steps[0].num_scheduled_tokens == 16  # 8 requests x 2 tokens
    assert report.steps[0].new_blocks == [8]
    assert report.steps[6].num_scheduled_tokens == 16  # 1 decode + 15 prefill
    _assert_runner_empty(engine.view)
    assert engine.view.kv_connector_active()


class FailingWorker:
    """The real worker, except that the ``fail_at``-th call of ``method``
    raises; records whether the KV connector was active at every call."""

    def __init__(self, worker: Any, method: str, fail_at: int):
        self._worker, self._method, self._fail_at = worker, method, fail_at
        self.calls: dict[str, int] = {"execute_model": 0, "sample_tokens": 0}
        self.connector_active_during: list[bool] = []
        self.finished_seen: list[set[str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._worker, name)

    def _call(self, name: str, arg: Any) -> Any:
        self.connector_active_during.append(WorkerView(self._worker).kv_connector_active())
        self.calls[name] += 1
        if name == self._method and self.calls[name] == self._fail_at:
            raise RuntimeError(f"injected failure in {name} call {self._fail_at}")
        if name == "execute_model":
            self.finished_seen.append(set(arg.finished_req_ids))
        return getattr(self._worker, name)(arg)

    def execute_model(self, scheduler_output: Any) -> Any:
        return self._call("execute_model", scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> Any:
        return self._call("sample_tokens", grammar_output)


@pytest.mark.parametrize(
    "method, fail_at, failed_step",
    [
        ("execute_model", 1, 0),  # the very first prefill
        ("execute_model", 3, 2),  # decode [0,1], after two steps ran
        ("sample_tokens", 2, 1),  # execute_model ran, sampling raised
    ],
)
def test_failure_at_step_k_still_cleans_up(engine, profile, method, fail_at, failed_step):
    plan = default_plan(profile)
    worker = FailingWorker(engine.worker, method, fail_at)
    with pytest.raises(StepFailed) as info:
        drive(WorkerView(worker), plan, profile)
    failure = info.value
    assert failure.step == failed_step
    assert f"step {failed_step} ({plan.steps[failed_step].kind}" in str(failure)
    assert "injected failure" in str(failure)
    assert len(failure.report.steps) == failed_step
    # the failed step itself, in the report (the fresh trial: only in the error text)
    step = plan.steps[failed_step]
    assert failure.report.failed_step == {"index": failed_step, "kind": step.kind,
                                          "label": plan.with_display_names(step.label)}
    assert failure.report.to_dict()["failed_step"]["index"] == failed_step
    assert failure.report.cleanup_ran and failure.report.left_in_runner == []
    # The last execute_model call is the cleanup: it finishes all 8 requests
    # that were sent (the prefill requests sent in step 0).
    assert worker.finished_seen[-1] == {f"{REQ_ID_PREFIX}{i}_" for i in range(8)}
    # Connector off for every call of the run, on again afterwards.
    assert worker.connector_active_during and not any(worker.connector_active_during)
    assert engine.view.kv_connector_active()
    _assert_runner_empty(engine.view)
    # The runner still serves a real run after the failure.
    report = drive(engine.view, plan, profile)
    assert report.ok


def test_engine_serves_requests_after_warmup(engine, profile):
    from vllm import SamplingParams

    drive(engine.view, default_plan(profile), profile)
    outputs = engine.llm.generate(
        [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": list(range(200))}],
        SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True),
        use_tqdm=False,
    )
    assert [len(o.outputs[0].token_ids) for o in outputs] == [3, 3]
    _assert_runner_empty(engine.view, other_traffic=True)
    # The V1 runner keeps finished requests until the scheduler's next step
    # names them in finished_req_ids; stepwarm refuses a busy runner.
    leftover = engine.view.live_request_ids()
    assert len(leftover) == 2
    with pytest.raises(RunnerBusyError, match="holds 2 request"):
        drive(engine.view, default_plan(profile), profile)
    # Send the step the scheduler would send next, leaving the runner idle.
    with engine.view.kv_connector_disabled():
        engine.worker.execute_model(cleanup_output(leftover))
    _assert_runner_empty(engine.view)


def test_the_library_examples_take_vllms_own_worker(engine, profile):
    """docs/plugin.md ("as a library, on any worker you hold") and
    docs/consistency-oracle.md, as written: vLLM's worker, not stepwarm's
    WorkerView (a new user's trial: AttributeError 'kv_cache_config')."""
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for
    from stepwarm.verify import verify

    worker = engine.worker
    assert not isinstance(worker, WorkerView)
    assert read_profile(worker) == profile
    plan, = plans_for(["triton-buckets"], profile)
    report = drive(worker, plan, profile)
    assert report.ok and [s.index for s in report.steps] == [s.index for s in plan.steps]
    assert engine.view.live_request_ids() == set()
    plan, = plans_for(["default"], profile)
    checked = verify(engine.llm, worker, plan, profile)
    assert checked.ok and len(checked.checked) == 10 and min(checked.checked.values()) >= 1, checked
    assert engine.view.live_request_ids() == set()
