"""Verification: decide how much of a draft the target keeps. Pure functions, no model.

Speculative sampling after Leviathan et al. 2023 (arXiv 2211.17192) and Chen et al.
2023 (arXiv 2302.01318). Terms: draft token d_i is *accepted* with probability
min(1, target(d_i) / draft(d_i)); at the first rejection a *recovered* token is drawn
from norm(max(0, target - draft)); if every draft token passes, a *bonus* token is
drawn from the target distribution after the last draft token. The committed tokens
are then distributed exactly as the target's own samples would be.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from draftwise.sampling import sample
from draftwise.types import Draft, Verdict


def greedy_verify(draft_ids: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Accept draft tokens while they equal the target's argmax; emit its argmax after.

    target_argmax [k+1]: argmax of the target at each draft position plus the bonus one.
    Example: draft [5, 6, 7], target argmax [5, 6, 8, 2] -> Verdict(num_accepted=2, next_token=8).
    """
    num_accepted = 0
    for draft_id, target_id in zip(draft_ids, target_argmax):
        if int(draft_id) != int(target_id):
            break
        num_accepted += 1
    return Verdict(num_accepted=num_accepted, next_token=int(target_argmax[num_accepted]))


def rejection_sample(draft: Draft, target_probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    """Exact speculative sampling of one chain draft.

    draft.token_ids [k]; draft.draft_probs [k, V] or None (deterministic -> one-hot);
    target_probs [k+1, V]: target distribution at each draft position plus the bonus one
    (an array, or anything indexable by row with a .shape, such as LazyTargetProbs).
    """
    k = len(draft.token_ids)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"target_probs must have k+1={k + 1} rows, got {target_probs.shape[0]}")
    for i, token in enumerate(draft.token_ids):
        target_row = target_probs[i]  # [V]
        p_target = float(target_row[token])
        p_draft = 1.0 if draft.draft_probs is None else float(draft.draft_probs[i, token])
        # Accept with probability min(1, p_target / p_draft); u < ratio, with u in [0, 1).
        if p_draft > 0.0 and rng.random() * p_draft < p_target:
            continue
        return Verdict(num_accepted=i, next_token=_recover(target_row, draft, i, token, rng))
    return Verdict(num_accepted=k, next_token=sample(target_probs[k], rng))


def _recover(target_row: np.ndarray, draft: Draft, i: int, token: int, rng: np.random.Generator) -> int:
    """Sample from norm(max(0, target - draft)) at position i after rejecting `token`."""
    if draft.draft_probs is None:
        # One-hot draft: the residual is the target with the rejected token removed.
        residual = target_row.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(target_row - draft.draft_probs[i], 0.0)
    total = residual.sum()
    if total <= 0.0:
        # NOTE: only reachable through rounding when target == draft (then rejection has
        # probability 0); the target row itself is the right fallback.
        residual = target_row
    return sample(residual, rng)


def greedy_verify_tree(
    branches: Sequence[Sequence[int]], branch_argmax: Sequence[Sequence[int]]
) -> tuple[int, Verdict]:
    """Greedy verification of several candidate continuations checked in one target pass.

    branches[b] [k_b]; branch_argmax[b] [k_b + 1]: target argmax after the shared last
    token and after each token of branch b. The branch with the longest accepted prefix
    wins (ties: the earlier branch); every committed token is the target's own argmax.
    Example: branches [[5, 6], [5, 7]], argmax [[5, 9, 1], [5, 7, 3]] -> (1, Verdict(2, 3)).
    """
    best_branch, best = 0, None
    for b, (draft_ids, argmax) in enumerate(zip(branches, branch_argmax)):
        verdict = greedy_verify(draft_ids, argmax)
        if best is None or verdict.num_accepted > best.num_accepted:
            best_branch, best = b, verdict
    assert best is not None, "a tree needs at least one branch"
    return best_branch, best
