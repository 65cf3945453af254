"""The zoo's seeded random weights: each model as the class its config names."""

from __future__ import annotations

from safetensors import safe_open

from stepwarm.zoo import write_model


def test_whisper_weights_hold_its_encoder_and_decoder(tmp_path):
    d = write_model("tiny-whisper", tmp_path, tokenizer=False, weights_seed=0)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        conv = f.get_tensor("model.encoder.conv1.weight")
    # WhisperForConditionalGeneration: 80 mel bins in, d_model 256 out, kernel 3
    assert tuple(conv.shape) == (256, 80, 3)
    assert "model.decoder.embed_tokens.weight" in keys
    assert sum(k.startswith("model.encoder.layers.0.") for k in keys) == sum(
        k.startswith("model.decoder.layers.0.") and "encoder_attn" not in k for k in keys)


def test_the_same_seed_writes_the_same_weights(tmp_path):
    a = write_model("tiny-llama", tmp_path / "a", tokenizer=False, weights_seed=0)
    b = write_model("tiny-llama", tmp_path / "b", tokenizer=False, weights_seed=0)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_tied_embeddings_are_written_once_and_load_back_tied(tmp_path):
    # tiny-gemma3 ties lm_head to embed_tokens (tie_word_embeddings); the two
    # share memory, which safetensors' save_file refused ("Some tensors share memory").
    import torch
    import transformers

    d = write_model("tiny-gemma3", tmp_path, tokenizer=False, weights_seed=0)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        embed = f.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in keys and tuple(embed.shape) == (512, 256)
    model = transformers.Gemma3ForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    assert torch.equal(model.model.embed_tokens.weight, embed)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
