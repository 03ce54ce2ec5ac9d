"""Tiny randomly initialised Qwen2 models for the transformers backend, and their GGUF export.

vocab 272 (256 byte tokens, 3 merges, 3 control tokens, 10 "[PAD<i>]" rows as in Qwen's
padded vocabularies), hidden 64, 2 layers: builds in milliseconds. `write_qwen2_gguf`
writes the same weights as an f32 qwen2 GGUF that llama.cpp and transformers both load.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np

MERGES = ["Ġ t", "h e", "Ġt he"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 272
MAX_POSITIONS = 512  # the trained window (max_position_embeddings): a backend's n_ctx must fit it
EOS = 256 + len(MERGES) + 2  # <|im_end|>
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_chars() -> list[str]:
    """GPT-2's reversible byte -> printable character map (the token text of each byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary() -> list[str]:
    merged = ["".join(m.split()) for m in MERGES]
    tokens = byte_chars() + merged + SPECIALS
    return tokens + [f"[PAD{i}]" for i in range(len(tokens), VOCAB)]


def tiny_qwen2(seed: int = 0, dtype=None):
    """A random Qwen2ForCausalLM; initializer_range 0.3 gives peaked next-token distributions."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=0.3,
        tie_word_embeddings=False,
        bos_token_id=256 + len(MERGES),
        eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).to(dtype or torch.float64).eval()


def perturbed(model, noise: float, seed: int = 1):
    """A copy of model with Gaussian noise on every weight: a draft that agrees most of the time."""
    import torch

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise)
    return draft


def write_qwen2_gguf(model, path: Path, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """Export model's weights (as f32) to a qwen2 GGUF with the byte-level vocabulary above."""
    import gguf

    cfg = model.config
    tokens = vocabulary()
    types = [1] * (256 + len(MERGES)) + [3] * len(SPECIALS) + [5] * (VOCAB - 256 - len(MERGES) - len(SPECIALS))
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}  # older 5.x: rope_theta
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)

    state = {k: v.detach().to("cpu").float().numpy() for k, v in model.state_dict().items()}
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm.weight": "attn_norm.weight",
        "post_attention_layernorm.weight": "ffn_norm.weight",
        "self_attn.o_proj.weight": "attn_output.weight",
        "mlp.gate_proj.weight": "ffn_gate.weight",
        "mlp.up_proj.weight": "ffn_up.weight",
        "mlp.down_proj.weight": "ffn_down.weight",
    }
    for proj in "qkv":
        per_layer[f"self_attn.{proj}_proj.weight"] = f"attn_{proj}.weight"
        per_layer[f"self_attn.{proj}_proj.bias"] = f"attn_{proj}.bias"
    for i in range(cfg.num_hidden_layers):
        names.update({f"model.layers.{i}.{k}": f"blk.{i}.{v}" for k, v in per_layer.items()})
    for hf_name, gguf_name in names.items():
        writer.add_tensor(gguf_name, np.ascontiguousarray(state[hf_name]))  # (out, in): the writer reverses
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
