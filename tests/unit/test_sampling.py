import numpy as np
import pytest

from draftwise.sampling import distribution, filter_probs, sample
from draftwise.types import ConfigError, SamplingParams, SpeculationConfig
from draftwise.verify import greedy_verify


def test_filter_docstring_example():
    np.testing.assert_allclose(filter_probs(np.array([[0.5, 0.3, 0.2]]), top_k=2), [[0.625, 0.375, 0.0]])


def test_top_p_keeps_smallest_nucleus():
    np.testing.assert_allclose(filter_probs(np.array([[0.5, 0.3, 0.2]]), top_p=0.7), [[0.625, 0.375, 0.0]])
    np.testing.assert_allclose(filter_probs(np.array([[0.5, 0.3, 0.2]]), top_p=0.5), [[1.0, 0.0, 0.0]])


def test_min_p_relative_to_top():
    np.testing.assert_allclose(filter_probs(np.array([[0.6, 0.3, 0.1]]), min_p=0.4), [[2 / 3, 1 / 3, 0.0]])


def test_greedy_is_one_hot_argmax():
    probs = distribution(np.array([[0.1, 3.0, 2.0]]), SamplingParams())
    np.testing.assert_array_equal(probs, [[0, 1, 0]])


def test_sample_never_draws_zero_probability():
    rng = np.random.default_rng(0)
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert {sample(probs, rng) for _ in range(2000)} == {1, 3}


def test_greedy_verify_docstring_example():
    v = greedy_verify([5, 6, 7], [5, 6, 8, 2])
    assert (v.num_accepted, v.next_token) == (2, 8)
    assert v.committed([5, 6, 7]) == [5, 6, 8]
    assert greedy_verify([5, 6], [5, 6, 9]).committed([5, 6]) == [5, 6, 9]  # bonus token


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"min_p": 1}, "min_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"repeat_last_n": -2}, "repeat_last_n"),
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logprobs": 21}, "logprobs"),
        ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ],
)
def test_sampling_params_validated(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SamplingParams(**kwargs)


def test_speculation_config_validated():
    with pytest.raises(ConfigError, match="max_draft_tokens"):
        SpeculationConfig(max_draft_tokens=0)
    with pytest.raises(ConfigError, match="policy"):
        SpeculationConfig(policy="magic")
