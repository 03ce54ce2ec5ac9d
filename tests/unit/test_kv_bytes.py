"""Backends' kv_bytes() and weight_bytes(): the KV cache's size from the model's own shape agrees
with the tensors a transformers cache holds and with llama.cpp's own state size; the toy's is its
list of ids."""

from __future__ import annotations

import pytest

from draftwise.backends.toy import KV_TOKEN_BYTES, ToyBackend, ToyModel


def test_the_toy_counts_a_list_slot_per_cached_id_over_its_sequences():
    backend = ToyBackend(ToyModel(vocab_size=20), slots=2)
    assert backend.kv_bytes() == {"per_token": KV_TOKEN_BYTES, "allocated": 0, "used": 0}
    backend.prefill([1, 2, 3, 4])
    backend.sequence(1).prefill([5, 6])
    assert backend.kv_bytes()["used"] == backend.kv_bytes()["allocated"] == 6 * KV_TOKEN_BYTES
    assert backend.sequence(1).kv_bytes()["used"] == 2 * KV_TOKEN_BYTES
    backend.truncate(1)
    assert backend.kv_bytes()["used"] == 3 * KV_TOKEN_BYTES
    assert backend.weight_bytes() == 0


def cache_tensor_bytes(backend) -> int:
    return sum(layer.keys.nbytes + layer.values.nbytes for layer in backend._cache.layers if layer.keys is not None)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_transformers_kv_bytes_follow_the_config_and_equal_the_cache_tensors(dtype):
    torch = pytest.importorskip("torch")
    from draftwise.backends.hf import HFBackend
    from tiny_qwen2 import tiny_qwen2

    model = tiny_qwen2(seed=0, dtype=getattr(torch, dtype))
    backend = HFBackend.from_model(model, n_ctx=512, slots=2)
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    element = torch.tensor([], dtype=model.dtype).element_size()
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element
    assert backend.kv_bytes() == {"per_token": per_token, "allocated": 0, "used": 0}
    backend.prefill(list(range(10, 27)))
    assert backend.kv_bytes()["used"] == 17 * per_token == cache_tensor_bytes(backend)
    assert backend.kv_bytes()["allocated"] == backend.kv_bytes()["used"]  # a DynamicCache reserves nothing
    backend.sequence(1).prefill([3, 4, 5])
    assert backend.sequence(1).kv_bytes()["used"] == 3 * per_token == cache_tensor_bytes(backend.sequence(1))
    assert backend.kv_bytes()["used"] == 20 * per_token  # the backend counts every sequence
    backend.truncate(5)
    assert backend.kv_bytes()["used"] == 8 * per_token
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert backend.weight_bytes() == params + sum(b.numel() * b.element_size() for b in model.buffers())


def test_llamacpp_kv_bytes_follow_the_gguf_and_llama_cpps_state_size(tiny_gguf_dir):
    pytest.importorskip("llama_cpp")
    from draftwise.backends.llamacpp import LlamaCppBackend

    backend = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=512, n_threads=1)
    try:
        # tiny_gguf: 2 layers, 2 KV heads of 64 / 4 = 16, f16 cache: 2 x (32 + 32) x 2 bytes.
        per_token = 2 * (2 * 16 + 2 * 16) * 2
        assert backend.kv_bytes() == {"per_token": per_token, "allocated": 512 * per_token, "used": 0}
        c, ctx = backend._c, backend._ctx
        backend.prefill(list(range(40, 50)))
        at_10 = c.llama_state_get_size(ctx)
        backend.prefill(list(range(50, 80)))
        at_40 = c.llama_state_get_size(ctx)
        assert backend.kv_bytes()["used"] == 40 * per_token
        # The saved state holds every used cell's keys and values and a few bytes of its own.
        assert 0 <= (at_40 - at_10) / 30 - per_token <= 16
        assert backend.weight_bytes() > 0
    finally:
        backend.close()
    slotted = LlamaCppBackend(tiny_gguf_dir / "target.gguf", n_ctx=256, n_threads=1, slots=2)
    try:
        slotted.prefill([40, 41, 42])
        slotted.sequence(1).prefill([43, 44])
        kv = slotted.kv_bytes()
        # Two slots' windows in one context, and the minimal context of the Llama object beside it.
        assert kv["allocated"] == (2 * 256 + 256) * per_token
        assert kv["used"] == 5 * per_token
        assert slotted.sequence(1).kv_bytes() == {
            "per_token": per_token,
            "allocated": 256 * per_token,
            "used": 2 * per_token,
        }
    finally:
        slotted.close()
