"""Logits -> probabilities under a request's sampling transforms, and seeded sampling.

`distribution(logits, params)` is the one place logits become the probabilities a request
samples from, for the target's verified rows and the draft model's proposals alike (the
draft passes the request's parameters with its own temperature). Order: temperature, then
top-k, top-p, min-p on the tempered distribution; the result is renormalised in float64.
The verifier compares draft and target in this space, so losslessness holds with respect
to exactly this distribution.
"""

from __future__ import annotations

import numpy as np

from draftwise.types import SamplingParams


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax in float64. logits [n, V] or [V] -> same shape."""
    scaled = np.asarray(logits, dtype=np.float64) / temperature
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum(axis=-1, keepdims=True)
    return scaled


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution params sample from, row by row. logits [n, V] -> probs [n, V].

    Greedy (temperature 0) returns the one-hot of the argmax, so a caller may treat
    greedy and sampling uniformly; the engine uses argmax directly for speed.
    """
    logits = np.atleast_2d(np.asarray(logits))
    if params.greedy:
        probs = np.zeros(logits.shape, dtype=np.float64)
        probs[np.arange(logits.shape[0]), logits.argmax(axis=-1)] = 1.0
        return probs
    probs = softmax(logits, params.temperature)
    return filter_probs(probs, top_k=params.top_k, top_p=params.top_p, min_p=params.min_p)


class LazyTargetProbs:
    """distribution(logits, params) computed one row at a time, on first access.

    Rejection sampling usually stops at the first rejection, so most of the k+1 rows of a
    large vocabulary (150k on Qwen) are never needed; computing them all costs ~1 ms each.
    """

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self._logits, self._params = logits, params  # [n, V]
        self._rows: dict[int, np.ndarray] = {}
        self.shape = logits.shape

    def __getitem__(self, i: int) -> np.ndarray:
        row = self._rows.get(i)
        if row is None:
            row = self._rows[i] = distribution(self._logits[i : i + 1], self._params)[0]
        return row


def filter_probs(probs: np.ndarray, *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    """Apply top-k, top-p (nucleus) and min-p to rows of probabilities and renormalise.

    Example: [0.5, 0.3, 0.2] with top_k=2 -> [0.625, 0.375, 0.0].
    Ties at the top-k boundary keep the lower token ids (stable sort), like argsort.
    """
    if top_k <= 0 and top_p >= 1.0 and min_p <= 0.0:
        return probs
    probs = probs.copy()
    n, vocab = probs.shape
    if 0 < top_k < vocab:
        # NOTE: stable descending order so that ties are broken by token id, deterministically.
        order = np.argsort(-probs, axis=-1, kind="stable")
        drop = order[:, top_k:]
        np.put_along_axis(probs, drop, 0.0, axis=-1)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_probs = np.take_along_axis(probs, order, axis=-1)
        sorted_probs = sorted_probs / sorted_probs.sum(axis=-1, keepdims=True)
        cumulative = np.cumsum(sorted_probs, axis=-1)
        # Keep a token if the mass strictly before it is below top_p (the first always stays).
        keep_sorted = (cumulative - sorted_probs) < top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs[~keep] = 0.0
    if min_p > 0.0:
        threshold = min_p * probs.max(axis=-1, keepdims=True)
        probs[probs < threshold] = 0.0
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector [V] by inverse CDF (one uniform)."""
    cumulative = np.cumsum(probs)
    u = rng.random() * cumulative[-1]
    token = int(np.searchsorted(cumulative, u, side="right"))
    # Guard against u landing on the very end through rounding: step back to a token with mass.
    token = min(token, probs.shape[-1] - 1)
    while probs[token] <= 0.0 and token > 0:
        token -= 1
    return token


def make_rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)
