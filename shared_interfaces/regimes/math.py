"""The regime math, written once: GRPO / XGRPO / PRP / SGT as pure functions of arrays.

Every function is vectorised over arbitrary leading dimensions (seeds, prompts, ...). The layout of a
prompt's rollouts is ``rewards[..., P, G]``: P policies (in a fixed order), up to G samples each,
with ``mask[..., P, G]`` marking real samples (policies may have different group sizes). Outputs for a
*learner* i and a *source* policy j are indexed ``[..., i, j, g]``.

Both backends call :func:`regime_plan`; the LLM backend reaches it through
:func:`shared_interfaces.regimes.plan.plan_groups`, which turns records into these arrays (and the plan into rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared_interfaces.records import SUCCESS_THRESHOLD
from shared_interfaces.regimes.config import RegimeSpec


def _as_mask(rewards: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    if mask is None:
        return np.ones(rewards.shape, dtype=bool)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != rewards.shape:
        raise ValueError(f"mask shape {mask.shape} != rewards shape {rewards.shape}")
    return mask


def group_advantages(
    rewards: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> np.ndarray:
    """GRPO advantages over the last axis (one group per leading index).

    ``A_g = (r_g - mean(r)) / (std(r) + eps)`` with the unbiased std (n - 1), as verl and TRL;
    ``scale_by_std=False`` gives Dr.GRPO's ``A_g = r_g - mean(r)``. Only entries with ``mask`` count
    and only they get a value; masked-out entries get 0. A *degenerate* group — fewer than two
    samples, or all rewards equal — gets ``A = 0`` exactly (the formula would give NaN or float noise).
    """
    r = np.asarray(rewards, dtype=np.float64)
    m = _as_mask(r, mask)
    n = m.sum(axis=-1, keepdims=True)
    rm = np.where(m, r, 0.0)
    mean = rm.sum(axis=-1, keepdims=True) / np.maximum(n, 1)
    dev = np.where(m, r - mean, 0.0)
    var = (dev**2).sum(axis=-1, keepdims=True) / np.maximum(n - 1, 1)
    hi = np.where(m, r, -np.inf).max(axis=-1, keepdims=True, initial=-np.inf)  # (initial: an empty group)
    lo = np.where(m, r, np.inf).min(axis=-1, keepdims=True, initial=np.inf)
    degenerate = (n < 2) | (hi == lo)
    scale = np.sqrt(var) + eps if scale_by_std else 1.0
    adv = dev / scale
    return np.where(m & ~degenerate, adv, 0.0)


def pooled_advantages(
    rewards: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    eps: float = 1e-6,
    scale_by_std: bool = True,
) -> np.ndarray:
    """XGRPO / PRP advantages: each sample normalised with the statistics of the pooled group
    ``R_x = U_j {r^j_g}`` of all policies for the prompt.

    ``rewards[..., P, G] -> A[..., P, G]``; ``A^i_g = (r^i_g - mean(R_x)) / (std(R_x) + eps)``.
    With P = 1 this is :func:`group_advantages` exactly (same code path on the same numbers).
    """
    return _pooled(group_advantages, rewards, mask, eps=eps, scale_by_std=scale_by_std)


def _pooled(group_fn, rewards, mask, *, eps: float, scale_by_std: bool) -> np.ndarray:
    """``group_fn`` (a group-advantage function) over each prompt's pooled ``[P * G]`` samples."""
    r = np.asarray(rewards, dtype=np.float64)
    shape = r.shape
    m = None if mask is None else _as_mask(r, mask).reshape(shape[:-2] + (-1,))
    flat = group_fn(r.reshape(shape[:-2] + (-1,)), m, eps=eps, scale_by_std=scale_by_std)
    return flat.reshape(shape)


def successes(rewards: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """``r >= SUCCESS_THRESHOLD`` on real samples."""
    r = np.asarray(rewards, dtype=np.float64)
    return _as_mask(r, mask) & (r >= SUCCESS_THRESHOLD)


def sgt_gate(
    rewards: np.ndarray,
    verified: np.ndarray,
    mask: np.ndarray | None = None,
) -> np.ndarray:
    """SGT gate per learner: ``open_i(x) = [no success in i's group] AND [some j != i has a verified
    success]``. ``rewards, verified, mask: [..., P, G] -> gate [..., P]`` (bool). A success is
    ``r >= SUCCESS_THRESHOLD`` (0.5): on 0/1 rewards, SPEC's ``sum_g r_g = 0`` and ``r = 1``."""
    r = np.asarray(rewards, dtype=np.float64)
    m = _as_mask(r, mask)
    succ = successes(r, m)
    own_success = succ.any(axis=-1)  # [..., P]
    vsucc = (succ & np.asarray(verified, dtype=bool)).any(axis=-1)  # [..., P]
    n_verified = vsucc.sum(axis=-1, keepdims=True)  # [..., 1]
    peer_has = (n_verified - vsucc.astype(np.int64)) > 0  # some OTHER policy has one
    return ~own_success & peer_has


def sgt_select(
    rewards: np.ndarray,
    verified: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    k: int = 1,
    rule: str = "shortest",
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """Which peer samples each learner's SGT term uses: ``targets[..., i, j, g]`` (bool).

    Candidates for learner i are the *verified successes* of every policy j != i. Where the gate of
    :func:`sgt_gate` is open, the ``k`` best candidates by ``rule`` are selected: ``shortest`` (fewest
    tokens; ties in canonical (j, g) order), ``first`` (canonical order), ``random`` (uniform, from
    ``rng``). Where the gate is closed nothing is selected. An unverified record is never selected.
    """
    flat_cand, flat_key, gate, shape = sgt_candidates(rewards, verified, lengths, mask, rule=rule, rng=rng)
    order = np.argsort(flat_key, axis=-1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(flat_key.shape[-1]), axis=-1)
    chosen = flat_cand & (rank < k) & gate[..., None]
    return chosen.reshape(shape)


def sgt_candidates(
    rewards: np.ndarray,
    verified: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray | None,
    *,
    rule: str,
    rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, ...]]:
    """:func:`sgt_select`'s inputs to the ranking: learner i's candidates flattened over ``(j, g)``
    ``[..., i, P * G]``, their keys (``inf`` off the candidates), the gate ``[..., i]`` and the shape
    ``[..., i, j, g]`` of the result."""
    r = np.asarray(rewards, dtype=np.float64)
    m = _as_mask(r, mask)
    P, G = r.shape[-2:]
    cand_src = successes(r, m) & np.asarray(verified, dtype=bool)  # [..., P, G]
    not_self = ~np.eye(P, dtype=bool)[:, :, None]  # [i, j, 1]
    cand = cand_src[..., None, :, :] & not_self  # [..., i, j, g]
    gate = sgt_gate(r, verified, m)  # [..., i]
    if rule == "shortest":
        key = np.broadcast_to(np.asarray(lengths, dtype=np.float64)[..., None, :, :], cand.shape)
    elif rule == "first":
        key = np.zeros(cand.shape)
    elif rule == "random":
        if rng is None:
            raise ValueError("sgt selection rule 'random' needs a seeded numpy Generator (rng=...)")
        key = rng.random(cand.shape)
    else:
        raise ValueError(f"unknown sgt selection rule {rule!r}; use shortest, first or random")
    flat_cand = cand.reshape(cand.shape[:-2] + (P * G,))
    flat_key = np.where(flat_cand, key.reshape(flat_cand.shape), np.inf)
    return flat_cand, flat_key, gate, cand.shape


def behaviour_correction(learner_old_logp, mu_logp, cap: float):
    """PRP's truncated behaviour correction for a peer token, ``c_t = min(pi_old(y_t) / mu(y_t), cap)``.

    The peer term's full importance ratio is ``w_t = pi_theta / mu = (pi_theta / pi_old) * (pi_old / mu)``
    (decoupled PPO): the PPO clip acts on the proximal ratio ``pi_theta / pi_old`` as for own samples,
    and this coefficient, detached, corrects for the behaviour policy. For ``prp_snapshot`` ``mu = pi_old``
    and ``c = 1`` exactly; for ``prp_thl`` ``mu`` is the THL-aligned peer trace. Works on numpy arrays
    and torch tensors alike (``exp``/``minimum`` of the input's own library).
    """
    diff = learner_old_logp - mu_logp
    if hasattr(diff, "clamp"):  # torch
        return diff.clamp(max=float(np.log(cap))).exp()
    return np.exp(np.minimum(diff, np.log(cap)))


def ratio_variance(learner_old_logp: np.ndarray, mu_logp: np.ndarray, mask: np.ndarray | None = None) -> float:
    """Empirical density-ratio variance ``Var[pi_old / mu]`` over the (masked) peer tokens, before
    truncation: the chi^2-like cost PRP pays. 0.0 when fewer than two tokens."""
    w = np.exp(np.asarray(learner_old_logp, dtype=np.float64) - np.asarray(mu_logp, dtype=np.float64))
    if mask is not None:
        w = w[np.asarray(mask, dtype=bool)]
    w = w.ravel()
    return float(w.var(ddof=1)) if w.size > 1 else 0.0


@dataclass(frozen=True)
class RegimePlan:
    """What a regime hands each learner for one prompt (arrays over leading dims ``...``).

    * ``advantages[..., j, g]``: the advantage of sample (j, g) as every learner that trains on it uses it
      (own-group for ``grpo``, pooled for ``xgrpo``/PRP);
    * ``pg_mask[..., i, j, g]``: learner i applies the policy-gradient term to sample (j, g) —
      its own samples always, peer samples under PRP;
    * ``sample_weight[..., i, j, g]``: 1 for own samples, ``peer_weight`` for PRP peer samples, 0 elsewhere;
    * ``denominator``: ``"snapshot"`` / ``"thl"`` for PRP peer samples, else None;
    * ``sgt_gate[..., i]`` and ``sgt_targets[..., i, j, g]``: SGT's gate and selected peer successes;
      ``sgt_weight`` its lambda (0 when the regime has no SGT term) and ``sgt_normalize`` how lambda is
      shared among rescued prompts (``batch`` / ``prompt``, :class:`~shared_interfaces.regimes.config.SGTConfig`).
    """

    advantages: np.ndarray
    pg_mask: np.ndarray
    sample_weight: np.ndarray
    denominator: str | None
    sgt_gate: np.ndarray
    sgt_targets: np.ndarray
    sgt_weight: float
    ratio_cap: float
    sgt_normalize: str = "batch"

    def learner_advantages(self) -> np.ndarray:
        """``[..., i, j, g]``: the advantage learner i's optimizer sees for sample (j, g) (0 off ``pg_mask``)."""
        adv = np.broadcast_to(self.advantages[..., None, :, :], self.pg_mask.shape)
        return np.where(self.pg_mask, adv, 0.0)


def regime_plan(
    spec: RegimeSpec,
    rewards: np.ndarray,
    verified: np.ndarray,
    lengths: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    rng: np.random.Generator | None = None,
    group_fn=group_advantages,
    select_fn=sgt_select,
) -> RegimePlan:
    """Apply regime ``spec`` to one or many prompts' pooled rollouts ``[..., P, G]``.

    Advantages: ``grpo`` normalises each policy's own group; ``xgrpo``, ``prp_*`` use the pooled
    group's statistics. Learner i's policy-gradient batch is its own samples, plus (PRP) every peer
    sample (up to ``max_peer_samples`` in canonical order) weighted by ``peer_weight``. SGT adds
    :func:`sgt_select`'s targets with weight ``lambda`` where :func:`sgt_gate` is open.
    ``group_fn`` / ``select_fn`` replace :func:`group_advantages` / :func:`sgt_select` by equal variants
    (:func:`shared_interfaces.regimes.fast.regime_plan_fast`).
    """
    r = np.asarray(rewards, dtype=np.float64)
    m = None if mask is None else _as_mask(r, mask)
    P = r.shape[-2]
    adv_cfg = spec.advantage
    if spec.pooled_advantages:
        adv = _pooled(group_fn, r, m, eps=adv_cfg.eps, scale_by_std=adv_cfg.scale_by_std)
    else:
        adv = group_fn(r, m, eps=adv_cfg.eps, scale_by_std=adv_cfg.scale_by_std)
    # which samples are real: the mask, or (no mask) one all-real [P, G] pattern shared by every prompt
    real = np.ones(r.shape[-2:], dtype=bool) if m is None else m
    eye = np.eye(P, dtype=bool)[:, :, None]  # [i, j, 1]
    src = real[..., None, :, :]  # [..., 1, j, g]
    own = src & eye
    if spec.uses_peer_samples:
        peer = src & ~eye
        cap = spec.prp.max_peer_samples
        if cap is not None:
            flat = peer.reshape(peer.shape[:-2] + (-1,))
            peer = (flat & (np.cumsum(flat, axis=-1) <= cap)).reshape(peer.shape)
        weight = np.where(own, 1.0, np.where(peer, spec.prp.peer_weight, 0.0))
        pg_mask = own | peer
    else:
        pg_mask = own
        weight = own.astype(np.float64)
    full = r.shape[:-1] + r.shape[-2:]  # [..., i, j, g]
    pg_mask, weight = np.broadcast_to(pg_mask, full).copy(), np.broadcast_to(weight, full).copy()
    if spec.sgt_enabled:
        gate = sgt_gate(r, verified, m)
        targets = select_fn(
            r, verified, lengths, m, k=spec.sgt.successes_per_prompt, rule=spec.sgt.selection, rng=rng
        )
        lam = spec.sgt.weight
    else:
        gate = np.zeros(r.shape[:-1], dtype=bool)
        targets = np.zeros(pg_mask.shape, dtype=bool)
        lam = 0.0
    return RegimePlan(
        advantages=adv,
        pg_mask=pg_mask,
        sample_weight=weight,
        denominator=spec.denominator,
        sgt_gate=gate,
        sgt_targets=targets,
        sgt_weight=lam,
        ratio_cap=spec.prp.ratio_cap,
        sgt_normalize=spec.sgt.normalize,
    )
