"""Whether a runner can run a scenario: its ``needs`` and ``requires``."""

from __future__ import annotations


from stepwarm.expressions import (
    ExpressionError,
    block_sizes_of,
    evaluate_condition,
    facts_of,
    functions_of,
)
from stepwarm.profile import RunnerProfile
from stepwarm.scenario.errors import ScenarioError
from stepwarm.scenario.load import LoadedScenario


#: Each ``needs`` entry in words (``stepwarm list``'s needs column): what
#: the runner must have for the scenario to run, as :func:`unmet_need` checks it.
NEED_WORDS = {
    "speculator": "a speculator (speculative_config)",
    "mamba_align": "a Mamba KV cache group in align mode",
    "encoder_decoder": "an encoder-decoder model",
    "images": "a model taking image input",
    "spec_top_k_top_p": "top-k / top-p sampling beside drafts (not on vLLM's CPU build)",
    "pooling": "a pooling model",
    "structured_output": "a model that samples tokens (not pooling)",
    "prefix_caching": "prefix caching on (enable_prefix_caching)",
}


def needs_in_words(needs: list[str]) -> str:
    """``needs`` as :data:`NEED_WORDS` says them, ``"; "``-joined ("-" for
    none). ``spec_top_k_top_p`` alone is met by any runner without a
    speculator, and says so."""
    words = [NEED_WORDS.get(n, n) for n in needs]
    if "spec_top_k_top_p" in needs and "speculator" not in needs:
        words[needs.index("spec_top_k_top_p")] = "no speculator, or " + NEED_WORDS[
            "spec_top_k_top_p"]
    return "; ".join(words) or "-"


def unmet_need(needs: list[str], profile: RunnerProfile) -> str:
    """Why ``profile`` cannot run a scenario needing ``needs`` ("" if it can)."""
    p = profile
    for need in needs:
        if need == "speculator" and not p.has_speculator:
            return f"needs speculator: runner has num_speculative_steps {p.num_speculative_steps}"
        if need == "mamba_align" and not p.has_mamba_align:
            return ("needs mamba_align: runner has no Mamba KV cache group in align mode "
                    f"(mamba_cache_mode {p.mamba_cache_mode})")
        if need == "encoder_decoder" and not (p.is_encoder_decoder and p.max_encoder_len > 0):
            return (f"needs encoder_decoder: runner's model is not encoder-decoder "
                    f"(is_encoder_decoder {p.is_encoder_decoder}, max_encoder_len {p.max_encoder_len})")
        if need == "images" and not (p.image_classes and p.encoder_budget > 0):
            return ("needs images: runner's model takes no image input "
                    f"({len(p.image_classes)} image classes, encoder budget {p.encoder_budget})")
        if need == "spec_top_k_top_p" and p.has_speculator and not p.top_k_top_p_with_drafts:
            return ("needs spec_top_k_top_p: this vLLM build's sampler fails on top-k / "
                    "top-p requests with a speculator (vLLM's CPU build)")
        if need == "pooling" and not p.is_pooling_model:
            return "needs pooling: runner's model is not a pooling model"
        # Not is_last_pp_rank: every pipeline rank runs the same steps (the
        # plan leaves the grammar bitmask out on non-last ranks, as vLLM's
        # warmup does), or the ranks would fall out of lockstep.
        if need == "prefix_caching" and not p.enable_prefix_caching:
            return ("needs prefix_caching: runner has enable_prefix_caching False (vLLM's "
                    "scheduler sends no prefix hit)")
        if need == "structured_output" and p.is_pooling_model:
            return ("needs structured_output: runner does not sample tokens "
                    f"(pooling model {p.is_pooling_model})")
    return ""


def unmet_requirement(sc: LoadedScenario, profile: RunnerProfile) -> str:
    """Why ``profile`` fails one of the scenario's ``requires`` ("" if none).

    Raises:
        ScenarioError: a ``requires`` entry that is not a valid comparison
            (file, line, field 'requires', what is allowed).
    """
    facts, sizes, funcs = facts_of(profile), block_sizes_of(profile), functions_of(profile)
    for cond in sc.model.requires:
        try:
            ok, shown = evaluate_condition(cond, facts, sizes, funcs)
        except ExpressionError as e:
            line = sc.index.line(("top",), "requires")
            raise ScenarioError(f"{sc.file}:{line or '?'}: field 'requires': {e}",
                                file=sc.file, line=line, field="requires") from None
        if not ok:
            return f"requires {cond.strip()}: false on this runner ({shown})"
    return ""


def unmet_before_engine(needs: list[str], engine_args: dict) -> str:
    """Why an engine started with ``engine_args`` (``vllm.LLM`` keywords) will
    not run a scenario needing ``needs``, where that is known before it
    starts ("" when it may): ``speculator``, which no engine without a
    ``speculative_config`` has (vLLM's ``SpeculativeConfig``), and
    ``prefix_caching`` where the arguments turn it off (the other needs
    depend on the model, read off the runner once it is up).
    """
    if "speculator" in needs and not engine_args.get("speculative_config"):
        return ("needs speculator: no speculative_config in the engine arguments "
                "(give one with -e speculative_config=JSON)")
    if "prefix_caching" in needs and engine_args.get("enable_prefix_caching") is False:
        return "needs prefix_caching: enable_prefix_caching=false in the engine arguments"
    return ""
