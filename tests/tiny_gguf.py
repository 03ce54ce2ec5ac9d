"""Write tiny random GGUF models (llama architecture, byte-level gpt2 vocabulary) for tests.

vocab 258 (256 bytes + <s> + </s>; with fim=True six more, Qwen2.5-Coder's fill-in-the-middle
control tokens, with no tokenizer.ggml.fim_* metadata, as in its GGUF), n_embd 64, 2 layers:
writes and loads in milliseconds. other_vocab=True gives another vocabulary with the same texts
partly: the 256 byte tokens in reverse order, then OTHER_PIECES (merged pieces the default
vocabulary has no single token for), then <s> and </s> (for drafters/crossvocab.py's tests).
Tensors are given as (out, in) numpy arrays; the gguf writer reverses them to ggml order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tiny_qwen2 import byte_chars

# Merged pieces of the other vocabulary and the merges that make them (gpt2 byte-level text).
OTHER_PIECES = ["Ġt", "he", "Ġthe", "in", "Ġa", "er"]
OTHER_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r"]
FIM_TOKENS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layers: int = 2,
    n_ff: int = 128,
    n_head: int = 4,
    n_head_kv: int = 2,
    scale: float = 0.3,
    chat_template: str | None = None,
    fim: bool = False,
    context_length: int = 32768,  # the trained window: any n_ctx a test asks for fits it by default
    architecture: str = "llama",
    special_tokens: Sequence[str] = (),
    eot_token: str | None = None,
    name: str | None = None,
    other_vocab: bool = False,
) -> Path:
    """architecture: "llama", or "qwen2" (llama's tensors with q/k/v biases); another name
    writes llama's tensors under it (a header to read, not a model llama.cpp loads).
    special_tokens: control tokens appended to the vocabulary (turn markers such as
    "<start_of_turn>"); eot_token: one of them, named by tokenizer.ggml.eot_token_id."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens = byte_chars() + ["<s>", "</s>"] + (FIM_TOKENS if fim else []) + list(special_tokens)
    num_plain = 256
    if other_vocab:
        tokens = byte_chars()[::-1] + OTHER_PIECES + ["<s>", "</s>"] + list(special_tokens)
        num_plain += len(OTHER_PIECES)
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), architecture)
    if name:
        writer.add_name(name)
    if eot_token is not None:
        writer.add_eot_token_id(tokens.index(eot_token))
    writer.add_context_length(context_length)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * num_plain + [3] * (vocab - num_plain))
    writer.add_token_merges(OTHER_MERGES if other_vocab else ["Ġ Ġ"])  # at least one, or the writer drops the list
    writer.add_bos_token_id(tokens.index("<s>"))
    writer.add_eos_token_id(tokens.index("</s>"))
    writer.add_add_bos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)

    def t(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    head_dim = n_embd // n_head
    writer.add_tensor("token_embd.weight", t(vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", t(vocab, n_embd) * 4)
    for i in range(n_layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", t(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", t(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", t(n_head_kv * head_dim, n_embd))
        if architecture == "qwen2":
            writer.add_tensor(f"blk.{i}.attn_q.bias", t(n_embd))
            writer.add_tensor(f"blk.{i}.attn_k.bias", t(n_head_kv * head_dim))
            writer.add_tensor(f"blk.{i}.attn_v.bias", t(n_head_kv * head_dim))
        writer.add_tensor(f"blk.{i}.attn_output.weight", t(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
