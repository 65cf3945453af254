"""Requests with images (multimodal encoder inputs): planning rules, the
vision-encoder built-in's plan, and the SchedulerOutput fields they compile
to (real vLLM classes; no engine)."""

from __future__ import annotations

import pytest

from stepwarm.compile import cleanup_output, encoder_cache_keys, to_scheduler_output
from stepwarm.encoder_inputs import RequestInputs
from stepwarm.plan import Plan, PlanBuilder, PlanError, PlannedRequest
from stepwarm.profile import ImageClass, RunnerProfile
from stepwarm.scenario import expand, load
from tests.helpers import make_profile

#: Qwen2-VL-like classes (56, 140, 224 px: 4, 25, 64 image tokens + 2 markers).
CLASSES = (ImageClass(side=16, tokens=4, prompt_tokens=6),
           ImageClass(side=112, tokens=25, prompt_tokens=27),
           ImageClass(side=224, tokens=64, prompt_tokens=66))


def _profile(**kw) -> RunnerProfile:
    return make_profile(**{**dict(
        num_blocks=200, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=512,
        vocab_size=512, image_classes=CLASSES, encoder_budget=512, max_images_per_prompt=2),
        **kw})


def test_vision_encoder_builtin_runs_each_class_then_the_most_images():
    plan = expand(load("vision-encoder"), _profile())
    assert [(r.prompt_len, r.images) for r in plan.requests] == [
        (7, (0,)), (28, (1,)), (67, (2,)), (133, (2, 2))]
    steps = [(s.kind, [(r.num_scheduled_tokens, r.encoder_inputs) for r in s.scheduled])
             for s in plan.steps]
    assert steps == [("prefill", [(7, (0,))]), ("prefill", [(28, (0,))]),
                     ("prefill", [(67, (0,))]), ("finish", []),
                     ("prefill", [(133, (0, 1))]), ("decode", [(1, ())]), ("cleanup", [])]


def test_vision_encoder_skips_without_images_and_on_decode_workers():
    assert expand(load("vision-encoder"), _profile(image_classes=())).skipped.startswith(
        "needs images: runner's model takes no image input")
    assert expand(load("vision-encoder"), _profile(max_num_seqs=2)).skipped.startswith(
        "requires max_num_seqs >= num_image_classes")
    assert "decode" in expand(load("vision-encoder"), _profile(role="decode")).skipped


def test_the_most_images_respect_the_encoder_budget():
    plan = expand(load("vision-encoder"), _profile(encoder_budget=100))
    assert plan.requests[-1].images == (2,)  # 2 x 64 encoder tokens exceed 100


@pytest.mark.parametrize("req, message", [
    (PlannedRequest("_stepwarm_x_", 10, images=(3,)), "image class 3 out of range; allowed: 0..2"),
    (PlannedRequest("_stepwarm_x_", 200, images=(0, 0, 0)), "3 images but the runner allows 2"),
    (PlannedRequest("_stepwarm_x_", 60, images=(2,)), "prompt_len 60 cannot hold its images' 66"),
])
def test_bad_image_requests_are_refused(req, message):
    with pytest.raises(PlanError, match=message):
        PlanBuilder(_profile()).add_request(req)


def test_an_image_request_is_prefilled_in_one_step_within_the_encoder_budget():
    b = PlanBuilder(_profile(encoder_budget=100))
    b.add_request(PlannedRequest("_stepwarm_a_", 70, images=(2,)))
    b.add_request(PlannedRequest("_stepwarm_b_", 70, images=(2,)))
    with pytest.raises(PlanError, match="carries images: it is prefilled in one step"):
        b.step("chunked_prefill", "c", prefill={"_stepwarm_a_": 16})
    with pytest.raises(PlanError, match="128 encoder tokens scheduled but the encoder budget is 100"):
        b.step("prefill", "p", prefill={"_stepwarm_a_": 70, "_stepwarm_b_": 70})
    b.step("prefill", "p", prefill={"_stepwarm_a_": 70})
    with pytest.raises(PlanError, match="carries images; stepwarm does not preempt"):
        b.step("preempt", "x", preempt=("_stepwarm_a_",))


def test_compiled_step_schedules_encoder_inputs_and_frees_them_at_finish():
    p = _profile()
    b = PlanBuilder(p)
    req = PlannedRequest("_stepwarm_a_", 20, images=(0, 0))
    b.add_request(req)
    prefill = b.step("prefill", "p", prefill={"_stepwarm_a_": 20})
    finish = b.step("finish", "f", finish=("_stepwarm_a_",))
    plan = Plan("t", (req,), (prefill, finish))
    ids = list(range(100, 120))
    images = {"_stepwarm_a_": RequestInputs(prompt_token_ids=ids, mm_features=[])}
    out = to_scheduler_output(prefill, plan, p, {}, images=images)
    assert out.scheduled_encoder_inputs == {"_stepwarm_a_": [0, 1]}
    assert out.scheduled_new_reqs[0].prompt_token_ids == ids
    assert out.free_encoder_mm_hashes == []
    out = to_scheduler_output(finish, plan, p, {}, images=images)
    keys = ["_stepwarm_a_image0", "_stepwarm_a_image1"]
    assert out.free_encoder_mm_hashes == keys == encoder_cache_keys(plan, ["_stepwarm_a_"])
    assert cleanup_output({"_stepwarm_a_"}, keys).free_encoder_mm_hashes == keys
