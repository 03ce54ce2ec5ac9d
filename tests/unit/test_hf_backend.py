"""The transformers backend on a tiny random Qwen2 model in float64 (exact, seconds on CPU).

Cache semantics against a no-cache reference forward, rollback, greedy equivalence for
both drafters and several k, a sequence-level chi-square test of sampling, the GGUF path
(same file through llama.cpp and transformers) and loading a model directory.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from scipy.stats import chisquare

from draftwise.backends.base import BackendError, ContextOverflowError, sync_cache
from draftwise.backends.hf import HFBackend, resolve_device, resolve_dtype
from draftwise.backends.hf_tokenizers import ByteTokenizer, HFTokenizer
from draftwise.drafters import ModelDrafter, NgramDrafter
from draftwise.engine import Engine
from draftwise.sampling import distribution
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig
from tiny_qwen2 import EOS, MAX_POSITIONS, VOCAB, perturbed, tiny_qwen2, write_qwen2_gguf

PROMPT = [116, 257, 32, 99, 97, 116, 44, 258, 32, 99, 97, 116, 44, 258, 32]  # "the cat, the cat, the "
PLAIN = SpeculationConfig(enabled=False)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # NOTE: on a shared 2-core machine torch's second thread spins on a busy core: 0.5 -> 25 ms a forward.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def target_model():
    return tiny_qwen2(seed=0)


@pytest.fixture(scope="module")
def draft_model(target_model):
    return perturbed(target_model, noise=0.004)  # agrees on ~80% of argmaxes


def reference_logits(model, ids) -> np.ndarray:
    """Logits of one cache-free forward over ids: the reference for every cached path."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()  # [len(ids), V]


def reference_greedy(model, prompt, num_tokens) -> list[int]:
    ids = list(prompt)
    for _ in range(num_tokens):
        ids.append(int(reference_logits(model, ids)[-1].argmax()))
    return ids[len(prompt) :]


# ---------------------------------------------------------------------- cache semantics
def test_extend_in_pieces_equals_one_forward(target_model):
    backend = HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS)
    backend.prefill(PROMPT[:5])
    rows = [backend.extend(PROMPT[5:6]), backend.extend(PROMPT[6:11]), backend.extend(PROMPT[11:])]
    got = np.concatenate(rows)  # [len(PROMPT) - 5, V]
    assert got.shape == (len(PROMPT) - 5, VOCAB) and got.dtype == np.float64
    np.testing.assert_allclose(got, reference_logits(target_model, PROMPT)[5:], atol=1e-10)
    assert backend.cached_ids == PROMPT and backend.num_cached == len(PROMPT)


def test_truncate_then_extend_equals_fresh_run(target_model):
    rng = np.random.default_rng(0)
    backend = HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS)
    for _ in range(12):
        kept, dropped, new = (rng.integers(0, VOCAB, size=n).tolist() for n in rng.integers(1, 9, size=3))
        if rng.random() < 0.25:
            kept = kept[:0]  # truncation to an empty cache
        backend.reset()
        if kept:
            backend.extend(kept)
        backend.extend(dropped)
        backend.truncate(len(kept))
        assert backend.cached_ids == kept
        got = backend.extend(new)
        np.testing.assert_allclose(got, reference_logits(target_model, kept + new)[len(kept) :], atol=1e-10)


def test_sync_cache_reuses_the_shared_prefix(target_model):
    backend = HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS)
    backend.prefill(PROMPT)
    assert sync_cache(backend, PROMPT[:6] + [3, 4]) == 6
    np.testing.assert_allclose(
        backend.extend([5]), reference_logits(target_model, PROMPT[:6] + [3, 4, 5])[-1:], atol=1e-10
    )


def test_invalid_requests_raise_and_leave_the_cache_intact(target_model):
    backend = HFBackend.from_model(target_model, n_ctx=20)
    backend.prefill(PROMPT[:10])
    with pytest.raises(BackendError):
        backend.truncate(11)
    with pytest.raises(BackendError):
        backend.extend([1, VOCAB])
    with pytest.raises(ContextOverflowError):
        backend.extend(list(range(11)))
    assert backend.cached_ids == PROMPT[:10]
    np.testing.assert_allclose(backend.extend([7]), reference_logits(target_model, PROMPT[:10] + [7])[-1:], atol=1e-10)


def test_a_context_beyond_the_trained_window_is_refused(target_model):
    """As on llama.cpp: n_ctx past max_position_embeddings would use positions the model never saw."""
    with pytest.raises(
        ConfigError, match="n_ctx 1024 is beyond tiny's trained context window of 512 tokens; use --n-ctx 512 or less"
    ):
        HFBackend.from_model(target_model, name="tiny", n_ctx=2 * MAX_POSITIONS)
    with pytest.raises(ConfigError, match="trained context window of 512"):
        HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS + 1, slots=2)
    assert HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS).n_ctx == MAX_POSITIONS


@pytest.mark.parametrize("command", [["serve", "--draft", "none"], ["generate", "--prompt", "hi", "--draft", "none"]])
def test_the_cli_refuses_a_context_beyond_the_window_in_one_line(target_model, tmp_path, command):
    from click.testing import CliRunner

    from draftwise.cli import main

    target_model.save_pretrained(tmp_path / "tiny")
    args = ["--target", str(tmp_path / "tiny"), "--backend", "hf", "--dtype", "float64", "--n-ctx", "1024"]
    result = CliRunner().invoke(main, [*command, *args])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: n_ctx 1024 is beyond tiny's trained context window of 512 tokens; use --n-ctx 512 or less"
    )


def test_a_forward_that_fails_midway_is_rolled_back(target_model, monkeypatch):
    backend = HFBackend.from_model(target_model, n_ctx=MAX_POSITIONS)
    backend.prefill(PROMPT[:8])
    layer = target_model.model.layers[1]

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")  # layer 0 has already written its KV entries

    monkeypatch.setattr(layer, "forward", broken)
    with pytest.raises(RuntimeError):
        backend.extend(PROMPT[8:12])
    monkeypatch.undo()
    assert backend.cached_ids == PROMPT[:8]
    assert {lay.get_seq_length() for lay in backend._cache.layers} == {8}
    np.testing.assert_allclose(backend.extend(PROMPT[8:]), reference_logits(target_model, PROMPT)[8:], atol=1e-10)


# ---------------------------------------------------------------------- the engine on top
def make_engine(target_model, draft_model) -> Engine:
    target = HFBackend.from_model(target_model, name="target", n_ctx=MAX_POSITIONS)
    draft = HFBackend.from_model(draft_model, name="draft", n_ctx=MAX_POSITIONS)
    return Engine(target, [ModelDrafter(draft), NgramDrafter(1, 3)])


@pytest.fixture(scope="module")
def engine(target_model, draft_model):
    return make_engine(target_model, draft_model)


@pytest.fixture(scope="module")
def greedy_reference(target_model):
    return reference_greedy(target_model, PROMPT, 24)


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_greedy_speculative_equals_greedy_plain(engine, greedy_reference, drafter, k):
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    plain = engine.generate(prompt_ids=PROMPT, sampling=greedy, speculation=PLAIN)
    spec = engine.generate(
        prompt_ids=PROMPT,
        sampling=greedy,
        drafters=[drafter],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k),
    )
    assert plain.token_ids == greedy_reference
    assert spec.token_ids == greedy_reference
    assert spec.stats.num_drafted > 0


def test_the_draft_model_is_accepted_and_rejected(engine, greedy_reference):
    # Both verification paths must run, or the equivalence test above proves little.
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    spec = engine.generate(
        prompt_ids=PROMPT,
        sampling=greedy,
        drafters=["draft"],
        speculation=SpeculationConfig(policy="heuristic", max_draft_tokens=4),
    )
    assert spec.token_ids == greedy_reference
    assert 0 < spec.stats.num_accepted < spec.stats.num_drafted


LENGTH, NUM_SAMPLES = 3, 1500


@pytest.mark.slow  # 1,500 sampled sequences through two transformers models on the CPU
def test_sampled_sequences_follow_the_target_distribution(target_model, draft_model):
    """Chi-square over all 3-token continuations (top-k 3: 27 outcomes) against enumeration."""
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=LENGTH, ignore_eos=True)
    frontier = {(): 1.0}
    for _ in range(LENGTH):  # expand only sequences the filtered target can produce
        nxt = {}
        for seq, prob in frontier.items():
            probs = distribution(reference_logits(target_model, PROMPT + list(seq))[-1:], params)[0]
            for token in np.flatnonzero(probs):
                nxt[seq + (int(token),)] = prob * probs[token]
        frontier = nxt
    joint = frontier
    engine = make_engine(target_model, draft_model)
    speculation = SpeculationConfig(policy="fixed", max_draft_tokens=2, draft_temperature=1.5)
    counts = dict.fromkeys(joint, 0)
    for seed in range(NUM_SAMPLES):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed, max_tokens=LENGTH, ignore_eos=True)
        result = engine.generate(prompt_ids=PROMPT, sampling=sampling, speculation=speculation, drafters=["draft"])
        counts[tuple(result.token_ids)] += 1  # KeyError: a sequence the target cannot produce
    seqs = sorted(joint, key=joint.get)  # rarest first
    expected = np.array([joint[s] for s in seqs]) * NUM_SAMPLES
    observed = np.array([counts[s] for s in seqs], dtype=float)
    # Pool every outcome expected fewer than 5 times into one bin that itself expects >= 5.
    cut = max(int(np.sum(expected < 5)), int(np.searchsorted(np.cumsum(expected), 5)) + 1)
    expected = np.array([expected[:cut].sum(), *expected[cut:]])
    observed = np.array([observed[:cut].sum(), *observed[cut:]])
    assert len(expected) >= 8 and expected.min() >= 5
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3


# ---------------------------------------------------------------------- GGUF and directories
@pytest.fixture(scope="module")
def gguf_pair(tmp_path_factory, target_model, draft_model):
    pytest.importorskip("gguf")  # transformers needs it to read GGUF files too
    root = tmp_path_factory.mktemp("hf-gguf")
    return write_qwen2_gguf(target_model, root / "target.gguf"), write_qwen2_gguf(draft_model, root / "draft.gguf")


def test_gguf_through_transformers_matches_the_source_model(gguf_pair, target_model):
    with pytest.raises(ConfigError, match="n_ctx 513 is beyond target.gguf's trained context window of 512 tokens"):
        HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS + 1)
    backend = HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS)
    tok = backend.tokenizer
    assert isinstance(tok, HFTokenizer) and backend.vocab_size == tok.vocab_size == VOCAB
    assert tok.encode("the cat, the cat, the ") == PROMPT
    assert tok.decode(PROMPT + [EOS]) == "the cat, the cat, the "
    assert tok.token_text(258) == "Ġthe" and tok.token_text(271) == "[PAD271]"
    assert EOS in tok.eos_token_ids
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.encode(chat)[:1] == [260]  # special-token text maps to the control token
    # f32 weights in the file: equal to the float64 source up to float32 rounding.
    np.testing.assert_allclose(backend.extend(PROMPT), reference_logits(target_model, PROMPT), atol=1e-4)
    result = Engine(backend).generate(
        messages=[{"role": "user", "content": "the cat"}], sampling=SamplingParams(max_tokens=8), speculation=PLAIN
    )
    assert len(result.token_ids) <= 8 and isinstance(result.text, str)


def test_transformers_target_with_a_llamacpp_draft(gguf_pair, target_model):
    pytest.importorskip("llama_cpp")
    from draftwise.backends.llamacpp import LlamaCppBackend

    target = HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS)
    draft = LlamaCppBackend(gguf_pair[1], n_ctx=256, n_threads=1)
    try:
        engine = Engine(target, [ModelDrafter(draft)])  # the tokenizer check must pass
        assert target.tokenizer.eos_token_ids == draft.tokenizer.eos_token_ids
        greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
        expected = engine.generate(prompt_ids=PROMPT, sampling=greedy, speculation=PLAIN).token_ids
        for k in (1, 4):
            spec = engine.generate(
                prompt_ids=PROMPT, sampling=greedy, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=k)
            )
            assert spec.token_ids == expected
            assert spec.stats.num_accepted > 0
    finally:
        draft.close()


def test_load_backend_from_model_directories(tmp_path, gguf_pair, target_model):
    from transformers import AutoTokenizer

    from draftwise.loading import LoadOptions, load_backend

    with_tokenizer, bare = tmp_path / "with-tokenizer", tmp_path / "bare"
    target_model.save_pretrained(with_tokenizer)
    target_model.save_pretrained(bare)
    AutoTokenizer.from_pretrained(gguf_pair[0].parent, gguf_file=gguf_pair[0].name).save_pretrained(with_tokenizer)
    options = LoadOptions(dtype="float64", n_ctx=256)  # backend "auto": a directory means hf
    backend = load_backend(str(with_tokenizer), options)
    assert isinstance(backend, HFBackend) and backend.n_ctx == 256
    assert backend.tokenizer.encode("the cat, the cat, the ") == PROMPT
    np.testing.assert_allclose(backend.extend(PROMPT), reference_logits(target_model, PROMPT), atol=1e-10)
    bytes_only = load_backend(str(bare), options)
    assert isinstance(bytes_only.tokenizer, ByteTokenizer)
    assert bytes_only.tokenizer.decode(bytes_only.tokenizer.encode("naïve")) == "naïve"
    assert bytes_only.tokenizer.eos_token_ids == {EOS}
    assert backend.identity != bytes_only.identity
    batched = load_backend(str(bare), LoadOptions(dtype="float64", n_ctx=256, slots=3))  # --parallel 3
    assert batched.num_slots == 3 and batched.sequence(2).n_ctx == 256
    assert load_backend(str(bare), LoadOptions(dtype="float64", n_ctx=256, slots=0)).num_slots == 1  # the default: one


def test_options_are_validated():
    from draftwise.loading import LoadOptions

    with pytest.raises(ConfigError, match="dtype"):
        resolve_dtype("int8")
    with pytest.raises(ConfigError, match="device"):
        resolve_device("tpu")
    with pytest.raises(ConfigError, match="dtype"):
        LoadOptions(backend="hf", dtype="fp32")
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="CUDA"):
            resolve_device("cuda")
        assert resolve_device("auto") == "cpu"


def test_the_server_answers_from_a_transformers_target(gguf_pair):
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    from fastapi.testclient import TestClient

    from draftwise.server import create_app

    engine = Engine(
        HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS),
        [NgramDrafter(1, 3)],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4),
    )
    messages = [{"role": "user", "content": "the cat, the cat"}]
    expected = engine.generate(messages=messages, sampling=SamplingParams(max_tokens=12), speculation=PLAIN)
    with TestClient(create_app(engine, "tiny"), base_url="http://localhost") as client:
        response = client.post(
            "/v1/chat/completions", json={"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
        )
    assert expected.text and response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == expected.text


def test_the_server_batches_concurrent_streams_on_a_transformers_target(gguf_pair):
    """`serve --backend hf --parallel 2`: three concurrent streams through two slots, each
    exactly its single-request answer, with padded forwards shared between them."""
    pytest.importorskip("fastapi")
    import asyncio

    import httpx

    from tests.server.conftest import MODEL, LiveServer
    from tests.server.test_parallel import stream_text

    single = Engine(HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS), [NgramDrafter(1, 3)])
    engine = Engine(HFBackend(gguf_pair[0], dtype="float64", slots=2, n_ctx=MAX_POSITIONS), [NgramDrafter(1, 3)])
    prompts = ["the cat, the cat", "the the the", "cat, cat, the cat, the"]
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    with LiveServer(engine) as live:

        async def scenario():
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*(stream_text(client, live.url, {**body, "prompt": p}) for p in prompts))

        answers = asyncio.run(scenario())
    for prompt, (text, usage) in zip(prompts, answers):
        expected = single.generate(prompt, sampling=SamplingParams(max_tokens=16, ignore_eos=True))
        assert text == expected.text and usage["completion_tokens"] == 16
    assert engine.target.num_batches > 0


@pytest.mark.parametrize("drafter", ["draft", "ngram"])
def test_constrained_greedy_on_transformers(gguf_pair, drafter):
    """Structured output through the transformers backend and its tokenizer's llguidance adapter."""
    import re

    from draftwise.constraints import Constraint

    target, draft = (
        HFBackend(gguf_pair[0], dtype="float64", n_ctx=MAX_POSITIONS),
        HFBackend(gguf_pair[1], dtype="float64", n_ctx=MAX_POSITIONS),
    )
    engine = Engine(target, [ModelDrafter(draft), NgramDrafter(1, 3)])
    sampling = SamplingParams(max_tokens=30, constraint=Constraint.regex(r"the (cat|dog)(, the (cat|dog)){2,4}\."))
    plain = engine.generate(prompt_ids=PROMPT, sampling=sampling, speculation=PLAIN)
    spec = engine.generate(
        prompt_ids=PROMPT,
        sampling=sampling,
        drafters=[drafter],
        speculation=SpeculationConfig(policy="fixed", max_draft_tokens=3),
    )
    assert re.fullmatch(r"the (cat|dog)(, the (cat|dog)){2,4}\.", plain.text), plain.text
    assert spec.token_ids == plain.token_ids and spec.stats.num_forced_tokens > 0


def test_float32_logprobs_under_speculation_equal_plain_decodings():
    """Logprobs (the chosen token's and the top 5) of a speculative answer on a float32 model:
    plain decoding's within 1e-5, token by token (rows of verification batches against one-row
    steps). The output layer is scaled to logits of a trained model's size (the random one's
    reach the hundreds, where float32 rounding alone moves a logprob by 1e-5)."""
    target32 = tiny_qwen2(seed=0, dtype=torch.float32)
    with torch.no_grad():
        target32.lm_head.weight.mul_(0.2)
    draft32 = perturbed(target32, noise=0.004)
    engine = Engine(
        HFBackend.from_model(target32, name="target32", n_ctx=MAX_POSITIONS),
        [ModelDrafter(HFBackend.from_model(draft32, name="draft32", n_ctx=MAX_POSITIONS), name="draft")],
    )
    sampling = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=5)
    plain = engine.generate(prompt_ids=PROMPT, sampling=sampling, speculation=PLAIN)
    spec = engine.generate(
        prompt_ids=PROMPT, sampling=sampling, speculation=SpeculationConfig(policy="fixed", max_draft_tokens=4)
    )
    assert 0 < spec.stats.num_accepted < spec.stats.num_drafted and spec.token_ids == plain.token_ids
    assert len(spec.logprobs) == len(plain.logprobs) == 24
    for a, b in zip(spec.logprobs, plain.logprobs):
        assert a.token == b.token and abs(a.logprob - b.logprob) < 1e-5
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        np.testing.assert_allclose([lp for _, lp in a.top], [lp for _, lp in b.top], rtol=0, atol=1e-5)
