"""Metrics: exact values on hand-made policies, seed summaries."""

from __future__ import annotations

import math

import numpy as np
import torch

from bandit_sim.metrics import masked_var, policy_metrics, seed_summary, t975


def test_policy_metrics_hand_computed():
    # one policy, two contexts, two arms; arm 0 correct (reward 1), arm 1 reward 0.2
    rewards = torch.tensor([[1.0, 0.2], [1.0, 0.2]], dtype=torch.float64)
    correct = rewards >= 0.5
    init = torch.log(torch.tensor([[[0.5, 0.5], [0.5, 0.5]]], dtype=torch.float64))
    p = torch.tensor([[[0.9, 0.1], [1e-9, 1 - 1e-9]]], dtype=torch.float64)
    rescue = torch.tensor([[False, True]])
    m = policy_metrics(p.log(), init.double(), rewards.double(), correct, rescue, support_eps=1e-3)
    exp_r = np.array([0.9 + 0.02, 1e-9 + 0.2 * (1 - 1e-9)])
    assert math.isclose(m["accuracy"].item(), exp_r.mean(), rel_tol=1e-12)
    assert math.isclose(m["rescue_accuracy"].item(), exp_r[1], rel_tol=1e-12)
    assert m["support"].item() == 0.5  # context 1 has pi(correct) = 1e-9 < eps
    kl = [sum(q * math.log(q / 0.5) for q in row) for row in ([0.9, 0.1], [1e-9, 1 - 1e-9])]
    assert math.isclose(m["kl_to_init"].item(), np.mean(kl), rel_tol=1e-9)
    assert math.isclose(m["kl_outside_rescue"].item(), kl[0], rel_tol=1e-9)
    ent = [-sum(q * math.log(q) for q in row) for row in ([0.9, 0.1], [1e-9, 1 - 1e-9])]
    assert math.isclose(m["entropy"].item(), np.mean(ent), rel_tol=1e-9)
    none = policy_metrics(p.log(), init.double(), rewards.double(), correct, torch.zeros(1, 2, dtype=torch.bool), 1e-3)
    assert math.isnan(none["rescue_accuracy"].item())


def test_seed_summary_and_t_quantiles():
    x = np.array([[1.0, 2.0, 3.0, np.nan], [np.nan] * 4])
    s = seed_summary(x, axis=1)
    assert s["mean"][0] == 2.0 and s["var"][0] == 1.0
    assert math.isclose(s["ci95"][0], 4.303 * 1.0 / math.sqrt(3))
    assert np.isnan(s["mean"][1]) and np.isnan(s["ci95"][1])
    assert t975(1) == 12.706 and t975(11) == 2.228 and t975(1000) == 1.96


def test_masked_var():
    x = torch.tensor([[1.0, 2.0, 4.0, 100.0], [5.0, 0.0, 0.0, 0.0]])
    m = torch.tensor([[True, True, True, False], [True, False, False, False]])
    v = masked_var(x, m)
    assert math.isclose(v[0].item(), np.var([1, 2, 4], ddof=1), rel_tol=1e-6) and math.isnan(v[1].item())
