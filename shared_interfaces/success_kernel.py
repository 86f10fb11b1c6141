"""The ``kernel`` section of a version-2 success matrix (:mod:`shared_interfaces.success_matrix`): per policy,
a transfer kernel over the matrix's prompts, measured at the run's start (``python -m mrl_llm kernel``,
:mod:`mrl_llm.kernel`).

``K_i(x, x') = sum_params lr * D * g_i(x) * g_i(x')``: policy ``i``'s gradients ``g_i(x)`` of
``log pi_i(y*|x)`` (``y*`` a correct response) in the inner product of its optimizer's step (``lr`` each
parameter's learning rate, ``D`` the optimizer's diagonal preconditioner), so that a step on prompt ``x``
moves ``log pi_i(y*|x')`` by about ``K_i(x, x')`` per unit of advantage. Format (``P`` policies, ``C``
prompts, in the matrix's order)::

    "kernel": null | {
        "projection_dim": int | null,      # count-sketch dimension; null: exact
        "seed": int,                       # the sketch's seed
        "lr_weighted": true,               # each parameter weighted by its learning rate
        "seconds": float, "peak_rss_mb": float,   # what computing it cost (all policies)
        "policies": [P entries: null | {
            "preconditioner": "adam" | "identity",
            "parameters": int,             # the parameters counted (trained; lr 0 counts 0)
            "target": [C "gold" | "success"],  # y*: the gold answer rendered, or a verified step-0 success
            "logprob": [C floats] (optional),  # log pi(y*|x) at the start, <= 0
            "seconds": float,
            "matrix": [[C floats]] * C}]}  # symmetric, finite

:func:`parse_kernel` validates it (shape, symmetry within :data:`SYMMETRY_RTOL`, finite, a non-negative
diagonal) and returns ``(K [P, C, C] with NaN for a null policy, metadata without the matrices)``; errors are
one line naming the key and the fix.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from shared_interfaces.config_io import INT_MAX

#: ``|K - K^T| <= SYMMETRY_RTOL * max|K|`` (a JSON round trip and a float32 Gram matrix are this close)
SYMMETRY_RTOL = 1e-6
PRECONDITIONERS = ("adam", "identity")
TARGETS = ("gold", "success")
KEYS = ("projection_dim", "seed", "lr_weighted", "seconds", "peak_rss_mb", "policies")
POLICY_KEYS = ("preconditioner", "parameters", "target", "seconds", "matrix")
#: significant digits a kernel entry is written with (:func:`kernel_dict`)
DIGITS = 7
#: optional keys of a policy's entry: ``logprob`` [C], log pi(y*|x) of each prompt's target at the start
POLICY_OPTIONAL = ("logprob",)
FIX = "write it again with `python -m mrl_llm kernel --run RUN_DIR`"


def _is_int(x: Any, lo: int = 0) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and lo <= x <= INT_MAX


def _is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def parse_kernel(kernel: Any, P: int, C: int, fail: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """``(K [P, C, C], metadata)`` of a ``kernel`` section (module docstring) for ``P`` policies and ``C``
    prompts; ``fail(msg)`` makes the error to raise."""
    if not isinstance(kernel, dict):
        raise fail(f"'kernel' must be null or an object with keys {list(KEYS)}; {FIX}")
    unknown, missing = sorted(set(kernel) - set(KEYS)), [k for k in KEYS if k not in kernel]
    if unknown or missing:
        raise fail(f"'kernel' has unknown key(s) {unknown} / lacks {missing}; it has exactly {list(KEYS)}; {FIX}")
    dim = kernel["projection_dim"]
    if dim is not None and not _is_int(dim, 1):
        raise fail(f"kernel.projection_dim must be a positive integer or null (exact), got {dim!r}")
    if not _is_int(kernel["seed"]):
        raise fail(f"kernel.seed must be an integer in [0, 2**63), got {kernel['seed']!r}")
    if kernel["lr_weighted"] is not True:
        raise fail(f"kernel.lr_weighted must be true (this code reads learning-rate-weighted kernels), "
                   f"got {kernel['lr_weighted']!r}; {FIX}")
    for key in ("seconds", "peak_rss_mb"):
        if not _is_num(kernel[key]) or kernel[key] < 0:
            raise fail(f"kernel.{key} must be a number >= 0, got {kernel[key]!r}")
    pols = kernel["policies"]
    if not isinstance(pols, list) or len(pols) != P:
        raise fail(f"kernel.policies must be a list of {P} entries (one per policy, null for none); {FIX}")
    K = np.full((P, C, C), np.nan)
    meta = {k: kernel[k] for k in KEYS if k != "policies"}
    meta["policies"] = []
    for i, e in enumerate(pols):
        meta["policies"].append(None if e is None else _policy(e, i, C, K, fail))
    return K, meta


def _policy(e: Any, i: int, C: int, K: np.ndarray, fail: Any) -> dict[str, Any]:
    w = f"kernel.policies[{i}]"
    if not isinstance(e, dict) or not set(POLICY_KEYS) <= set(e) <= set(POLICY_KEYS) | set(POLICY_OPTIONAL):
        got = sorted(e) if isinstance(e, dict) else type(e).__name__
        raise fail(f"{w} must be null or an object with {list(POLICY_KEYS)} (and optionally {list(POLICY_OPTIONAL)}), "
                   f"got {got}; {FIX}")
    lp = e.get("logprob")
    if lp is not None and (not isinstance(lp, list) or len(lp) != C or not all(_is_num(x) and x <= 1e-6 for x in lp)):
        raise fail(f"{w}.logprob must be a list of {C} finite log-probabilities (<= 0), one per prompt; {FIX}")
    if e["preconditioner"] not in PRECONDITIONERS:
        raise fail(f"{w}.preconditioner must be one of {list(PRECONDITIONERS)}, got {e['preconditioner']!r}")
    if not _is_int(e["parameters"], 1):
        raise fail(f"{w}.parameters must be a positive integer (the parameters counted), got {e['parameters']!r}")
    t = e["target"]
    if not isinstance(t, list) or len(t) != C or not all(x in TARGETS for x in t):
        raise fail(f"{w}.target must be a list of {C} entries (one per prompt), each one of {list(TARGETS)}")
    if not _is_num(e["seconds"]) or e["seconds"] < 0:
        raise fail(f"{w}.seconds must be a number >= 0, got {e['seconds']!r}")
    m = e["matrix"]
    if not isinstance(m, list) or len(m) != C or not all(isinstance(r, list) and len(r) == C for r in m):
        raise fail(f"{w}.matrix must be a [C, C] = [{C}, {C}] list of lists over the matrix's prompts; {FIX}")
    bad = next(((r, c) for r, row in enumerate(m) for c, x in enumerate(row) if not _is_num(x)), None)
    if bad is not None:
        raise fail(f"{w}.matrix[{bad[0]}][{bad[1]}] must be a finite number, got {m[bad[0]][bad[1]]!r}; {FIX}")
    a = np.array(m, dtype=float)
    scale = float(np.abs(a).max()) if a.size else 0.0
    asym = float(np.abs(a - a.T).max()) if a.size else 0.0
    if asym > SYMMETRY_RTOL * scale:
        r, c = (int(v) for v in np.unravel_index(int(np.argmax(np.abs(a - a.T))), a.shape))
        raise fail(f"{w}.matrix is not symmetric: [{r}][{c}] = {m[r][c]!r} but [{c}][{r}] = {m[c][r]!r} "
                   f"(tolerance {SYMMETRY_RTOL} x max|K|); {FIX}")
    if a.size and (np.diag(a) < -SYMMETRY_RTOL * scale).any():
        r = int(np.argmin(np.diag(a)))
        raise fail(f"{w}.matrix[{r}][{r}] = {m[r][r]!r} is negative; a kernel's diagonal is a squared norm; {FIX}")
    K[i] = a
    return {k: e[k] for k in (*POLICY_KEYS, *POLICY_OPTIONAL) if k != "matrix" and k in e}


def kernel_dict(K: np.ndarray, meta: dict[str, Any]) -> dict[str, Any]:
    """The JSON section of ``(K, meta)`` (the inverse of :func:`parse_kernel` up to rounding): each matrix made
    exactly symmetric and written to :data:`DIGITS` significant digits (a count-sketched kernel's error is ~1e-2;
    the full float64 text triples the file)."""
    def rounded(a: np.ndarray) -> list:
        a = np.asarray(a, dtype=float)
        a = (a + a.T) / 2
        return [[float(f"{x:.{DIGITS}g}") for x in row] for row in a]

    pols = [None if e is None else {**e, "matrix": rounded(K[i])} for i, e in enumerate(meta["policies"])]
    return {**{k: meta[k] for k in KEYS if k != "policies"}, "policies": pols}
