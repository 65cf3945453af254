"""The GEMMs ``stepwarm.gemm_sizes`` picks off a real vLLM model (the
session's CPU engine): its linear layers and its one LM head. What they cost
on a GPU is measured on the H200; on CPU nothing runs."""

from __future__ import annotations

from stepwarm.gemm_sizes import linear_layers, logits_heads, logits_rows, runner_logits_heads


def test_the_lm_head_is_the_one_logits_gemm(engine):
    runner = engine.view.runner
    model = runner.model if getattr(runner, "model", None) is not None else runner.get_model()
    hf = engine.llm.llm_engine.model_config.hf_config
    heads = logits_heads(model, device_type="cpu")
    assert [tuple(h.weight.shape) for h in heads] == [(hf.vocab_size, hf.hidden_size)]
    # a head is not among the linear layers (their ladder is another one)
    assert not {id(h) for h in heads} & {id(m) for m in linear_layers(model, device_type="cpu")}
    config = runner.vllm_config
    assert logits_rows(config) == config.scheduler_config.max_num_seqs


def test_only_the_last_pipeline_rank_warms_the_lm_head(engine, monkeypatch):
    runner = engine.view.runner
    model = engine.view.model
    (head,) = logits_heads(model, device_type="cpu")
    assert runner_logits_heads(engine.view, model, device_type="cpu") == [head]  # one rank: the last
    monkeypatch.setattr(runner, "is_last_pp_rank", False, raising=False)
    assert runner_logits_heads(engine.view, model, device_type="cpu") == []


def test_an_lm_head_a_quant_config_leaves_unquantized_is_still_the_head(engine, monkeypatch):
    """ModelOpt's exclusions give ``ParallelLMHead`` vLLM's
    ``UnquantizedLinearMethod``: it stays on the head's ladder (rows 1 up to
    ``logits_rows``), not the linear layers' (tokens above the graph sizes)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    runner = engine.view.runner
    model = runner.model if getattr(runner, "model", None) is not None else runner.get_model()
    layers = linear_layers(model, device_type="cpu")
    head = model.lm_head
    (table,) = logits_heads(model, device_type="cpu")  # the embedding: same shape, one GEMM
    monkeypatch.setattr(head, "quant_method", UnquantizedLinearMethod())
    assert linear_layers(model, device_type="cpu") == layers
    assert logits_heads(model, device_type="cpu") == [table]
    monkeypatch.setattr(table, "quant_method", UnquantizedLinearMethod())
    assert logits_heads(model, device_type="cpu") in ([table], [head])  # one of the two
