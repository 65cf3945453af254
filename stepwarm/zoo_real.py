"""Real-dimension zoo configs: the public Hugging Face ``config.json`` of the
families people serve, every width, head count, expert count, rank and
vocabulary as published, with only the layer count cut (``layer_types``
shortened with it), so that a kernel's variants are the real ones while the
model stays small enough for one GPU at ``gpu_memory_utilization`` 0.3.

Each dict keeps the published key spelling (``rope_scaling``, granite's
``"mamba"`` / ``"attention"`` layer types); ``transformers`` 5 remaps them on
load, older releases read them as they are. :data:`stepwarm.zoo.ZOO` names
them with their layer count (``llama-3.1-8b-l2``) and the published one.
"""

from __future__ import annotations

from typing import Any

#: meta-llama/Llama-3.1-8B-Instruct, config.json, 2 of 32 layers.
LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "hidden_act": "silu",
    "hidden_size": 4096,
    "initializer_range": 0.02,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 2,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 128256,
}

#: Qwen/Qwen3-30B-A3B, config.json, 2 of 48 layers (both MoE: 128 experts,
#: top 8, expert width 768).
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 2,
    "mlp_only_layers": [],
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

#: deepseek-ai/DeepSeek-V2-Lite, config.json, 2 of 27 layers: layer 0 dense
#: (``first_k_dense_replace`` 1), layer 1 MoE (64 routed + 2 shared experts,
#: top 6); MLA with ``kv_lora_rank`` 512, no ``q_lora_rank``, yarn rope.
DEEPSEEK_V2_LITE: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 2,
    "num_key_value_heads": 16,
    "pretraining_tp": 1,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "greedy",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

#: ibm-granite/granite-4.0-h-tiny, config.json, 4 of 40 layers: three Mamba2
#: layers then one attention layer (the published stack opens with five Mamba2
#: layers before its first attention layer, one in ten is attention); MoE in
#: every layer (64 experts, top 6, plus a shared expert), no positional
#: embedding on attention (``position_embedding_type`` "nope").
GRANITE_4_0_H_TINY: dict[str, Any] = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_multiplier": 0.0078125,
    "bos_token_id": 100257,
    "embedding_multiplier": 12,
    "eos_token_id": 100257,
    "hidden_act": "silu",
    "hidden_size": 1536,
    "init_method": "mup",
    "initializer_range": 0.1,
    "intermediate_size": 512,
    "layer_types": ["mamba", "mamba", "mamba", "attention"],
    "logits_scaling": 6,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_d_conv": 4,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 48,
    "mamba_proj_bias": False,
    "max_position_embeddings": 131072,
    "normalization_function": "rmsnorm",
    "num_attention_heads": 12,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 4,
    "num_key_value_heads": 4,
    "num_local_experts": 64,
    "output_router_logits": False,
    "pad_token_id": 100256,
    "position_embedding_type": "nope",
    "residual_multiplier": 0.22,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 10000,
    "router_aux_loss_coef": 0.0,
    "shared_intermediate_size": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 100352,
}

#: Qwen/Qwen3-Next-80B-A3B-Instruct, config.json, 4 of 48 layers: with
#: ``full_attention_interval`` 4, three gated delta net (GDN) layers, then one
#: gated full-attention layer; MoE everywhere (512 experts, top 10, plus a
#: shared expert). The published config sets no ``num_nextn_predict_layers``;
#: no speculator is configured, so its MTP layer is not built.
QWEN3_NEXT_80B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

#: google/gemma-3-12b-it, config.json's ``text_config`` (with the
#: ``Gemma3TextConfig`` defaults it leaves out: head_dim 256, vocab 262208,
#: rope_local_base_freq 10000) as a ``Gemma3ForCausalLM``, 2 of 48 layers: one
#: sliding-window layer (1024 tokens) and one full-attention layer, named in
#: ``layer_types`` (the published pattern is five sliding, then one full).
GEMMA_3_12B: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "final_logit_softcapping": None,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 3840,
    "initializer_range": 0.02,
    "intermediate_size": 15360,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 131072,
    "num_attention_heads": 16,
    "num_hidden_layers": 2,
    "num_key_value_heads": 8,
    "pad_token_id": 0,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000.0,
    "sliding_window": 1024,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 262208,
}

#: openai/whisper-large-v3, config.json, 2 of 32 encoder and 2 of 32 decoder
#: layers (``suppress_tokens``, a generation setting, left out).
WHISPER_LARGE_V3: dict[str, Any] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "activation_dropout": 0.0,
    "activation_function": "gelu",
    "apply_spec_augment": False,
    "attention_dropout": 0.0,
    "begin_suppress_tokens": [220, 50257],
    "bos_token_id": 50257,
    "classifier_proj_size": 256,
    "d_model": 1280,
    "decoder_attention_heads": 20,
    "decoder_ffn_dim": 5120,
    "decoder_layerdrop": 0.0,
    "decoder_layers": 2,
    "decoder_start_token_id": 50258,
    "dropout": 0.0,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "encoder_layerdrop": 0.0,
    "encoder_layers": 2,
    "eos_token_id": 50257,
    "init_std": 0.02,
    "is_encoder_decoder": True,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "median_filter_width": 7,
    "num_hidden_layers": 2,
    "num_mel_bins": 128,
    "pad_token_id": 50256,
    "scale_embedding": False,
    "tie_word_embeddings": True,
    "torch_dtype": "float16",
    "use_cache": True,
    "use_weighted_layer_sum": False,
    "vocab_size": 51866,
}

#: Special token ids of Qwen2.5-VL (its tokenizer's added tokens).
QWEN2_5_VL_TOKENS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                     "<|vision_start|>": 151652, "<|vision_end|>": 151653,
                     "<|vision_pad|>": 151654, "<|image_pad|>": 151655,
                     "<|video_pad|>": 151656}

#: Qwen/Qwen2.5-VL-7B-Instruct, config.json, 2 of 28 text layers; the vision
#: tower 2 of 32 blocks, block 0 windowed and block 1 full attention
#: (``fullatt_block_indexes``: the published [7, 15, 23, 31] is every eighth).
QWEN2_5_VL_7B: dict[str, Any] = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
    "vision_token_id": 151654,
    "image_token_id": 151655,
    "video_token_id": 151656,
    "hidden_act": "silu",
    "hidden_size": 3584,
    "initializer_range": 0.02,
    "intermediate_size": 18944,
    "max_position_embeddings": 128000,
    "max_window_layers": 2,
    "num_attention_heads": 28,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vision_config": {
        "depth": 2,
        "hidden_act": "silu",
        "hidden_size": 1280,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_chans": 3,
        "out_hidden_size": 3584,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "window_size": 112,
        "fullatt_block_indexes": [1],
        "tokens_per_second": 2,
        "temporal_patch_size": 2,
    },
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vocab_size": 152064,
}

#: The sampling fields of the published ``generation_config.json`` of the
#: models whose file has any (vLLM's OpenAI server gives them to a request
#: that leaves them unset; ``stepwarm coverage``'s ``server_defaults`` lines
#: read them). Written beside ``config.json`` (:data:`stepwarm.zoo.ZOO`).
GENERATION_CONFIGS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B-Instruct
    "llama-3.1-8b-l2": {"do_sample": True, "temperature": 0.6, "top_p": 0.9},
    # Qwen/Qwen3-30B-A3B
    "qwen3-30b-a3b-l2": {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95},
    # Qwen/Qwen3-Next-80B-A3B-Instruct
    "qwen3-next-80b-a3b-l4": {"do_sample": True, "temperature": 0.7, "top_k": 20,
                              "top_p": 0.8},
    # google/gemma-3-12b-it
    "gemma-3-12b-l2": {"do_sample": True, "top_k": 64, "top_p": 0.95},
}

#: Engine arguments of a real-dimension text model: vLLM's defaults but a
#: ``max_model_len`` that fits one H200 at ``gpu_memory_utilization`` 0.3.
REAL_TEXT_LIMITS: dict[str, Any] = {"max_model_len": 4096}
