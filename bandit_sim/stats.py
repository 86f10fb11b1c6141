"""Rank correlation with exact (or Monte Carlo) permutation p-values, and precision / recall.

* :func:`ranks` — average ranks (ties share the mean of their positions), 1-based.
* :func:`spearman` — Pearson correlation of the average ranks (NaN when either side is constant).
* :func:`kendall_tau_b` — ``(n_c - n_d) / sqrt((n_0 - n_x)(n_0 - n_y))`` over the ``n_0 = n(n-1)/2``
  pairs, ``n_x`` / ``n_y`` the pairs tied in x / y (tau-b; tau-a when there are no ties).
* :func:`permutation_test` — the null keeps ``x`` fixed and permutes ``y``: every one of the ``n!``
  orders when ``n <= exact_max`` (the exact p-value), else ``n_perm`` seeded random permutations with
  ``p = (1 + #{stat >= observed}) / (1 + n_perm)``. One-sided ``p_greater`` = P(stat >= observed)
  (the alternative "the prediction orders the regimes like the LLM"); two-sided ``p_two_sided`` =
  P(|stat| >= |observed|). A tolerance of 1e-12 counts permutations that tie the observed value.
* :func:`precision_recall` — over boolean sets: ``precision = TP / (TP + FP)`` (None without a
  positive prediction), ``recall = TP / (TP + FN)`` (None without an observed positive), F1 when both
  are defined and not both 0.
* :func:`auc` — threshold-free: the probability that a random positive scores above a random
  negative (ties count one half; the Mann-Whitney statistic over ``n_pos * n_neg``); None when a class
  is empty.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np

TOL = 1e-12


def ranks(x) -> np.ndarray:
    """Average 1-based ranks of ``x`` (ties share their mean rank)."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    r = np.empty(len(x))
    r[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):
        tie = x == v
        if tie.sum() > 1:
            r[tie] = r[tie].mean()
    return r


def spearman(x, y) -> float:
    """Spearman's rho: Pearson's correlation of the average ranks (NaN if a side is constant)."""
    rx, ry = ranks(x), ranks(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((dx**2).sum() * (dy**2).sum()))
    return float((dx * dy).sum() / den) if den > 0 else math.nan


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b (module docstring); NaN if a side is constant."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    i, j = np.triu_indices(len(x), k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    n0 = len(i)
    nx, ny = int((sx == 0).sum()), int((sy == 0).sum())
    den = math.sqrt((n0 - nx) * (n0 - ny))
    return float((sx * sy).sum() / den) if den > 0 else math.nan


def permutation_test(x, y, stat: Callable[[np.ndarray, np.ndarray], float], *, exact_max: int = 8,
                     n_perm: int = 20000, seed: int = 0) -> dict[str, float | int | bool]:
    """``{"statistic", "p_greater", "p_two_sided", "n", "exact", "permutations"}`` (module docstring).
    With fewer than 3 items, or a constant side, the p-values are NaN."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"permutation_test: x and y must be 1-D of one length, got {x.shape} and {y.shape}")
    n = len(x)
    obs = stat(x, y)
    out: dict[str, float | int | bool] = {"statistic": obs, "n": n, "exact": n <= exact_max, "permutations": 0,
                                          "p_greater": math.nan, "p_two_sided": math.nan}
    if n < 3 or math.isnan(obs):
        return out
    if n <= exact_max:
        vals = np.array([stat(x, y[list(p)]) for p in itertools.permutations(range(n))])
        out["p_greater"] = float((vals >= obs - TOL).mean())
        out["p_two_sided"] = float((np.abs(vals) >= abs(obs) - TOL).mean())
        out["permutations"] = len(vals)
    else:
        rng = np.random.default_rng(seed)
        vals = np.array([stat(x, rng.permutation(y)) for _ in range(n_perm)])
        out["p_greater"] = float((1 + (vals >= obs - TOL).sum()) / (1 + n_perm))
        out["p_two_sided"] = float((1 + (np.abs(vals) >= abs(obs) - TOL).sum()) / (1 + n_perm))
        out["permutations"] = n_perm
    return out


def rank_agreement(predicted, observed, **kw) -> dict[str, dict]:
    """Spearman and Kendall between two orderings of the same items, each with its permutation test."""
    return {"spearman": permutation_test(predicted, observed, spearman, **kw),
            "kendall_tau_b": permutation_test(predicted, observed, kendall_tau_b, **kw)}


def precision_recall(predicted, observed) -> dict[str, float | int | None]:
    """``{"tp", "fp", "fn", "precision", "recall", "f1"}`` of boolean arrays (module docstring)."""
    pred, obs = np.asarray(predicted, dtype=bool), np.asarray(observed, dtype=bool)
    if pred.shape != obs.shape:
        raise ValueError(f"precision_recall: shapes differ, {pred.shape} vs {obs.shape}")
    tp, fp, fn = int((pred & obs).sum()), int((pred & ~obs).sum()), int((~pred & obs).sum())
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = None
    if precision is not None and recall is not None and precision + recall > 0:
        f1 = 2 * precision * recall / (precision + recall)
    return {"tp": tp, "fp": fp, "fn": fn, "precision": precision, "recall": recall, "f1": f1}


def auc(scores, labels) -> float | None:
    """``P(score of a positive > score of a negative) + P(tie) / 2`` (module docstring)."""
    x, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    pos, neg = x[y], x[~y]
    if pos.size == 0 or neg.size == 0:
        return None
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)
