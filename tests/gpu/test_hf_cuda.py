"""The transformers backend on a CUDA device; the whole module is skipped without one.

float64 on the GPU is exact enough for greedy equivalence against a CPU reference;
bfloat16 is checked for what it promises: float32 logits on the host, and a twin
draft (same weights) accepted almost always. scripts/gpu_check.sh runs this module.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

from draftwise.backends.hf import HFBackend, resolve_device
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.types import SamplingParams, SpeculationConfig
from tiny_qwen2 import MAX_POSITIONS, VOCAB, perturbed, tiny_qwen2

PROMPT = [116, 257, 32, 99, 97, 116, 44, 258, 32, 99, 97, 116, 44, 258, 32]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def cpu_model():
    return tiny_qwen2(seed=0)


def cpu_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()  # [len(ids), V]


def on_cuda(model, dtype):
    import copy

    return copy.deepcopy(model).to(device="cuda", dtype=dtype)


def test_auto_device_is_cuda():
    assert resolve_device("auto") == "cuda"


def test_cuda_cache_matches_the_cpu_reference(cpu_model):
    backend = HFBackend.from_model(on_cuda(cpu_model, torch.float64), n_ctx=MAX_POSITIONS)
    assert backend.capabilities.device.startswith("cuda")
    backend.prefill(PROMPT[:6])
    backend.extend([1, 2, 3])
    backend.truncate(6)
    got = backend.extend(PROMPT[6:])
    assert isinstance(got, np.ndarray) and got.shape == (len(PROMPT) - 6, VOCAB)
    np.testing.assert_allclose(got, cpu_logits(cpu_model, PROMPT)[6:], atol=1e-9)


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_greedy_equivalence_on_cuda(cpu_model, drafter, k):
    target = HFBackend.from_model(on_cuda(cpu_model, torch.float64), name="target", n_ctx=MAX_POSITIONS)
    draft = HFBackend.from_model(
        on_cuda(perturbed(cpu_model, noise=0.004), torch.float64), name="draft", n_ctx=MAX_POSITIONS
    )
    engine = Engine(target, [ModelDrafter(draft), NgramDrafter(1, 3)])
    plain = engine.generate(prompt_ids=PROMPT, sampling=GREEDY, speculation=SpeculationConfig(enabled=False))
    spec = engine.generate(
        prompt_ids=PROMPT,
        sampling=GREEDY,
        drafters=[drafter],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k),
    )
    assert spec.token_ids == plain.token_ids
    assert spec.stats.num_drafted > 0


def test_bfloat16_speculation_with_a_twin_draft(cpu_model):
    target = HFBackend.from_model(on_cuda(cpu_model, torch.bfloat16), name="target", n_ctx=MAX_POSITIONS)
    twin = HFBackend.from_model(on_cuda(cpu_model, torch.bfloat16), name="twin", n_ctx=MAX_POSITIONS)
    logits = target.extend(PROMPT)
    assert logits.dtype == np.float32 and logits.shape == (len(PROMPT), VOCAB)
    target.reset()
    engine = Engine(target, [ModelDrafter(twin)])
    spec = engine.generate(
        prompt_ids=PROMPT, sampling=GREEDY, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4)
    )
    # Near-ties may flip between batched and one-at-a-time bf16 logits; the rest must agree.
    assert spec.stats.acceptance_rate > 0.8
    assert spec.stats.tokens_per_step > 2.5


def test_load_a_directory_onto_cuda_in_bfloat16(tmp_path, cpu_model):
    cpu_model.save_pretrained(tmp_path)
    backend = HFBackend(tmp_path, dtype="bfloat16", device="cuda", n_ctx=256)
    assert backend.capabilities.dtype == "bfloat16" and backend.capabilities.device.startswith("cuda")
    got = backend.extend(PROMPT)
    # bf16 weights and activations: close to the float64 reference (logits ~ +-8), not equal.
    assert np.abs(got - cpu_logits(cpu_model, PROMPT)).mean() < 0.1
    backend.close()
