"""Logits -> probabilities under a request's sampling transforms, and seeded sampling.

`distribution(logits, params, history)` is the one place logits become the probabilities a
request samples from, for the target's verified rows and the draft model's proposals alike
(the draft passes the request's parameters with its own temperature). Order: logit bias and
penalties (`adjusted`, each row given the tokens before it: its History), temperature, then
top-k, top-p, min-p on the tempered distribution; the result is renormalised in float64.
The verifier compares draft and target in this space, so losslessness holds with respect
to exactly this distribution. Greedy is the argmax of the adjusted logits.
`logprobs` is what a request reports: the raw log-softmax (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from draftwise.types import SamplingParams


@dataclass(frozen=True)
class History:
    """The tokens each row of a window follows: row j sees tokens + extra[:offset + j].

    tokens: prompt + committed tokens before the window (num_prompt of them the prompt);
    extra: the draft tokens the window verifies. Row i of a verified window [k+1, V] sees
    the context and d_1..d_i; `at(i)` is the window starting at row i.
    Example: History([7, 8], 1, (5, 6)) rows see [7, 8], [7, 8, 5], [7, 8, 5, 6].
    """

    tokens: Sequence[int]
    num_prompt: int
    extra: Sequence[int] = ()
    offset: int = 0

    def at(self, i: int) -> History:
        return History(self.tokens, self.num_prompt, self.extra, self.offset + i)


# The largest logit a penalty may make (a float64's largest, so the softmax stays finite).
_LOGIT_MAX = float(np.finfo(np.float64).max)


def adjusted(logits: np.ndarray, params: SamplingParams, history: History | None) -> np.ndarray:
    """logits [n, V] with params' logit bias and penalties applied, row j given history's row j
    (llama.cpp's order: bias, repeat penalty, presence/frequency). Unchanged (the same array)
    when params adjust nothing. Example: [[2, -2, 1]], repeat_penalty 2 over [0, 1] -> [[1, -4, 1]].
    """
    if not params.adjusts_logits:
        return logits
    if history is None:
        raise ValueError("penalties need the tokens before each row (a History)")
    out = np.array(logits, dtype=np.float64)  # a copy: [n, V]
    if params.logit_bias:
        ids, biases = zip(*params.logit_bias)
        out[:, list(ids)] += np.asarray(biases)
    repeat = params.repeat_penalty != 1.0 and params.repeat_last_n != 0
    counting = params.presence_penalty or params.frequency_penalty
    tokens = history.tokens
    window = tokens if params.repeat_last_n < 0 else tokens[max(0, len(tokens) - params.repeat_last_n) :]
    generated = tokens[history.num_prompt :] if counting else ()
    for j in range(out.shape[0]):
        extra = tuple(history.extra[: history.offset + j])
        row = out[j]
        if repeat:
            seen = [*window, *extra]
            if params.repeat_last_n > 0:
                seen = seen[-params.repeat_last_n :]
            ids = np.unique(np.asarray(seen, dtype=np.int64))
            values = row[ids]
            with np.errstate(over="ignore"):
                penalised = np.where(values > 0, values / params.repeat_penalty, values * params.repeat_penalty)
            # NOTE: a tiny penalty (1e-310) would make a logit infinite, and the softmax NaN
            row[ids] = np.clip(penalised, -_LOGIT_MAX, _LOGIT_MAX)
        if counting:
            ids, counts = np.unique(np.asarray([*generated, *extra], dtype=np.int64), return_counts=True)
            row[ids] -= params.frequency_penalty * counts + params.presence_penalty
    return out


def choose_greedy(logits: np.ndarray, params: SamplingParams, history: History | None = None) -> np.ndarray:
    """Greedy tokens [n]: the argmax of each row's adjusted logits."""
    return np.argmax(adjusted(logits, params, history), axis=-1)


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Row-wise softmax in float64. logits [n, V] or [V] -> same shape.
    The maximum is subtracted before the division, so a tiny temperature (1e-310) gives the
    one-hot of the argmax, its limit, instead of inf - inf = NaN."""
    scaled = np.asarray(logits, dtype=np.float64)
    scaled = scaled - scaled.max(axis=-1, keepdims=True)
    with np.errstate(over="ignore"):  # what overflows is -inf, whose exp is 0
        scaled /= temperature
    np.exp(scaled, out=scaled)
    scaled /= scaled.sum(axis=-1, keepdims=True)
    return scaled


def distribution(logits: np.ndarray, params: SamplingParams, history: History | None = None) -> np.ndarray:
    """The distribution params sample from, row by row. logits [n, V] -> probs [n, V].
    history: the tokens before each row (needed when params carry penalties or a bias).

    Greedy (temperature 0) returns the one-hot of the argmax, so a caller may treat
    greedy and sampling uniformly; the engine uses argmax directly for speed.
    """
    logits = adjusted(np.atleast_2d(np.asarray(logits)), params, history)
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

    def __init__(self, logits: np.ndarray, params: SamplingParams, history: History | None = None) -> None:
        self._logits, self._params, self._history = logits, params, history  # [n, V]
        self._rows: dict[int, np.ndarray] = {}
        self.shape = logits.shape

    def __getitem__(self, i: int) -> np.ndarray:
        row = self._rows.get(i)
        if row is None:
            history = None if self._history is None else self._history.at(i)
            row = self._rows[i] = distribution(self._logits[i : i + 1], self._params, history)[0]
        return row


@dataclass(frozen=True)
class TokenLogprob:
    """A token's logprob and the row's `top` most likely tokens [(id, logprob)], best first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def logprobs(logits: np.ndarray, tokens: Sequence[int], num_top: int) -> list[TokenLogprob]:
    """Each token's logprob under its row: logits [n, V], tokens [n] -> n TokenLogprobs.

    NOTE: the reported distribution is the model's raw log-softmax (temperature 1, no bias,
    penalty, grammar mask or filter), as OpenAI and vLLM report by default: it does not depend
    on how the answer was sampled, so it scores text (lm-eval's loglikelihood) and equals plain
    decoding's row for row. A token the filters or the mask ruled out can thus appear among the
    top alternatives; a grammar-forced token shows the model's own belief in it, not 0.
    Example: logits [[0, 0]], tokens [1], num_top 1 -> [TokenLogprob(1, -0.693.., ((0, -0.693..),))].
    """
    rows = np.asarray(logits, dtype=np.float64)[: len(tokens)]  # [n, V]
    num_top = min(num_top, rows.shape[1])
    out = []
    for j, token in enumerate(tokens):
        row = rows[j]
        peak = row.max()
        norm = peak + np.log(np.exp(row - peak).sum())
        top: tuple[tuple[int, float], ...] = ()
        if num_top:
            # Every id at least as likely as the num_top-th (ties included), then best first, lower id first.
            threshold = np.partition(row, row.shape[0] - num_top)[row.shape[0] - num_top]
            ids = sorted(np.flatnonzero(row >= threshold).tolist(), key=lambda t: (-row[t], t))[:num_top]
            top = tuple((int(t), float(row[t] - norm)) for t in ids)
        out.append(TokenLogprob(int(token), float(row[token] - norm), top))
    return out


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
