"""The transfer kernel at a run's start (:mod:`mrl_llm.kernel`, ``python -m mrl_llm kernel``): the exact kernel
is the hand-computed learning-rate-weighted, Adam-preconditioned inner product of the gradients; SGD is the
identity; the count-sketch is unbiased within its variance bound and deterministic per seed; a missing start
checkpoint and a task without a gold rendering are refused."""

from __future__ import annotations

import json
import math
import shutil
from fnmatch import fnmatchcase

import numpy as np
import pytest
import torch

from mrl_llm.cli import main
from mrl_llm.config import PolicyConfig, config_from_mapping
from mrl_llm.kernel import count_sketch, preconditioned_kernel, run_kernel
from mrl_llm.models import build_model, load_tokenizer, save_policy
from mrl_llm.rewards.arithmetic import problem_from_id
from shared_interfaces.config_io import to_mapping
from shared_interfaces.success_matrix import SuccessMatrixError, read_success_matrix
from tests.llm.helpers import tiny

PROMPTS = ["add:1+2", "add:3+4", "sub:5-2", "sub:9-9"]
POOL = ["add:1+2", "sub:5-2"]
#: policy "a"'s verified greedy success on add:1+2 (not the gold rendering: the kernel must use it)
SUCCESS = "so \\boxed{3}"
LR, NORM_LR = 1e-3, 1e-1


def _policy_dir(root, name: str, seed: int):
    pol = PolicyConfig(name=name, model_config=tiny("llama", hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                                    num_key_value_heads=1, num_hidden_layers=1,
                                                    max_position_embeddings=128), tokenizer_dir="utf8-bytes")
    tok = load_tokenizer(pol)
    return save_policy(build_model(pol, tok, seed=seed), tok, root / f"start-{name}", {"name": name})


def make_run(root, optimizer: str = "adamw"):
    """A run directory of two tiny policies: config.json (policy a: norms at NORM_LR, lm_head frozen), a step-0
    eval.jsonl (a solves add:1+2 greedily) and problems.json (POOL trained, the rest held out)."""
    d = root / "run"
    d.mkdir()
    train = {"optimizer": optimizer, "lr": LR, "eps": 1e-6,
             "lr_groups": [{"match": "*norm*", "lr": NORM_LR}, {"match": "lm_head.*", "lr": 0.0}]}
    cfg = config_from_mapping({
        "name": "k", "steps": 4, "prompts_per_step": 2, "threads": 1, "tensorboard": False, "progress": False,
        "policies": [{"name": n, "model_dir": str(_policy_dir(root, n, seed)), "max_prompt_len": 64,
                      "train": train if n == "a" else {"optimizer": optimizer, "lr": LR}}
                     for n, seed in (("a", 1), ("b", 2))]})
    (d / "config.json").write_text(json.dumps(to_mapping(cfg)))
    rows = [{"step": 0, "policy": p, "prompt_id": pid, "family": pid.split(":")[0], "skipped": False,
             "greedy_correct": int(p == "a" and pid == "add:1+2"),
             "greedy_response": SUCCESS if p == "a" and pid == "add:1+2" else "\\boxed{0}",
             "samples": 2, "successes": int(p == "a" and pid == "add:1+2")} for p in ("a", "b") for pid in PROMPTS]
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probs = [problem_from_id(p) for p in PROMPTS]
    (d / "problems.json").write_text(json.dumps({
        "format": "mrl-run-problems", "version": 1, "train": POOL,
        "eval": [{"prompt_id": p.prompt_id, "question": p.question, "gold": p.gold, "verifier": p.verifier,
                  "choices": [], "family": p.family} for p in probs]}))
    return d, cfg


def hand_gradients(policy, pid_texts):
    """Per prompt the gradient of sum log pi(response) by hand (the HF logits, log-softmax, gather), as one
    flat vector per parameter name; the prompt is the plain template, the response the joint encoding's tail."""
    from transformers import AutoModelForCausalLM

    from mrl_llm.templates import render_prompt

    model = AutoModelForCausalLM.from_pretrained(policy.model_dir, dtype=torch.float32)
    tok = load_tokenizer(policy)
    out = []
    for pid, text in pid_texts:
        prompt = render_prompt(policy.template, problem_from_id(pid))
        p_ids = tok(prompt).input_ids
        ids = tok(prompt + text).input_ids + [tok.eos_token_id]
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        total = sum(logp[t - 1, ids[t]] for t in range(len(p_ids), len(ids)))
        grads = torch.autograd.grad(total, list(model.parameters()))
        out.append({n: g.reshape(-1).double() for (n, _), g in zip(model.named_parameters(), grads, strict=True)})
    return out


def lr_of(policy, name: str) -> float:
    g = next((g for g in policy.train.lr_groups if fnmatchcase(name, g.match)), None)
    return policy.train.lr if g is None else g.lr


def hand_kernel(policy, targets, adam: bool) -> np.ndarray:
    gs = hand_gradients(policy, targets)
    K = np.zeros((len(gs), len(gs)))
    for name in gs[0]:
        lr = lr_of(policy, name)
        if lr == 0:
            continue
        G = torch.stack([g[name] for g in gs])
        w = lr / (G.pow(2).mean(0).sqrt() + policy.train.eps) if adam else torch.full_like(G[0], lr)
        K += ((G * w) @ G.T).numpy()
    return K


def targets_of(policy_name: str) -> list[tuple[str, str]]:
    return [(p, SUCCESS if policy_name == "a" and p == "add:1+2" else "\\boxed{" + problem_from_id(p).gold + "}")
            for p in sorted(PROMPTS)]


def test_exact_kernel_is_the_hand_computed_lr_weighted_adam_inner_product(tmp_path):
    d, cfg = make_run(tmp_path)
    path, m = run_kernel(d)
    assert path == d / "success_matrix.json"
    back = read_success_matrix(path)
    assert back.prompts == tuple(sorted(PROMPTS)) and back.split == ("train", "heldout", "train", "heldout")
    np.testing.assert_allclose(back.kernel, m.kernel, rtol=1e-6)  # written to 7 significant digits
    for i, pol in enumerate(cfg.policies):
        want = hand_kernel(pol, targets_of(pol.name), adam=True)
        np.testing.assert_allclose(m.kernel[i], want, rtol=1e-4, atol=1e-9 * np.abs(want).max())
        e = m.kernel_meta["policies"][i]
        assert e["preconditioner"] == "adam" and e["seconds"] >= 0
        assert e["target"] == ["success" if pol.name == "a" and p == "add:1+2" else "gold" for p in sorted(PROMPTS)]
    n_a = sum(p.numel() for n, p in hand_params(cfg.policies[0]) if not n.startswith("lm_head"))
    assert m.kernel_meta["policies"][0]["parameters"] == n_a  # the frozen lm_head counts 0
    assert m.kernel_meta["projection_dim"] is None and m.kernel_meta["lr_weighted"] is True
    assert m.kernel_meta["seconds"] > 0 and m.kernel_meta["peak_rss_mb"] > 0


def hand_params(policy):
    from transformers import AutoModelForCausalLM

    return list(AutoModelForCausalLM.from_pretrained(policy.model_dir).named_parameters())


def test_an_sgd_run_has_the_identity_preconditioner(tmp_path):
    d, cfg = make_run(tmp_path, optimizer="sgd")
    _, m = run_kernel(d, tmp_path / "out.json")
    assert not (d / "success_matrix.json").exists()  # --out elsewhere leaves the run's own alone
    for i, pol in enumerate(cfg.policies):
        assert m.kernel_meta["policies"][i]["preconditioner"] == "identity"
        want = hand_kernel(pol, targets_of(pol.name), adam=False)
        np.testing.assert_allclose(m.kernel[i], want, rtol=1e-4, atol=1e-9 * np.abs(want).max())


def test_the_sketched_kernel_is_deterministic_per_seed_and_near_the_exact(tmp_path):
    d, _ = make_run(tmp_path)
    _, exact = run_kernel(d, tmp_path / "exact.json")
    _, s1 = run_kernel(d, tmp_path / "s1.json", dim=512, seed=7)
    _, s2 = run_kernel(d, tmp_path / "s2.json", dim=512, seed=7)
    _, s3 = run_kernel(d, tmp_path / "s3.json", dim=512, seed=8)
    assert s1.kernel_meta["projection_dim"] == 512 and s1.kernel_meta["seed"] == 7
    np.testing.assert_array_equal(s1.kernel, s2.kernel)
    assert not np.array_equal(s1.kernel, s3.kernel)
    K = exact.kernel
    diag = np.einsum("pii->pi", K)
    sd = np.sqrt((diag[:, :, None] * diag[:, None, :] + K ** 2) / 512)  # the count-sketch's variance bound
    assert (np.abs(s1.kernel - K) <= 6 * sd + 1e-12).all()


def test_count_sketch_is_unbiased_within_its_variance_bound():
    gen = torch.Generator().manual_seed(0)
    shapes = [(200, 30), (500,), (7, 11)]
    xs = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    xs[1] = [0.6 * a + 0.4 * b for a, b in zip(xs[0], xs[1], strict=True)]  # a correlated pair
    flat = torch.stack([torch.cat([t.reshape(-1) for t in x]) for x in xs]).double()
    K = (flat @ flat.T).numpy()
    dim = 2048
    S = torch.stack([count_sketch(x, dim, seed=3) for x in xs])
    Ks = (S @ S.T).numpy()
    sd = np.sqrt((np.outer(np.diag(K), np.diag(K)) + K ** 2) / dim)
    assert (np.abs(Ks - K) <= 6 * sd).all()
    means = np.mean([(lambda S: (S @ S.T).numpy())(torch.stack([count_sketch(x, 256, seed=s) for x in xs]))
                     for s in range(40)], axis=0)
    assert (np.abs(means - K) <= 6 * np.sqrt((np.outer(np.diag(K), np.diag(K)) + K ** 2) / 256 / 40)).all()
    torch.testing.assert_close(count_sketch(xs[0], dim, 3), S[0], rtol=0, atol=0)


def test_preconditioned_kernel_by_hand_and_its_empty_case():
    g = [[torch.tensor([1.0, 2.0]), torch.tensor([3.0])], [torch.tensor([-1.0, 0.0]), torch.tensor([1.0])]]
    K = preconditioned_kernel(lambda c: g[c], 2, [0.5, 2.0], adam_eps=None)
    np.testing.assert_allclose(K, [[0.5 * 5 + 2 * 9, 0.5 * -1 + 2 * 3], [0.5 * -1 + 2 * 3, 0.5 * 1 + 2 * 1]],
                               rtol=1e-6)  # (fp32 gradients)
    Ka = preconditioned_kernel(lambda c: g[c], 2, [1.0, 1.0], adam_eps=0.0)
    v = [math.sqrt((1 + 1) / 2), math.sqrt((4 + 0) / 2), math.sqrt((9 + 1) / 2)]
    assert Ka[0, 1] == pytest.approx(1 * -1 / v[0] + 0 + 3 * 1 / v[2], rel=1e-6)
    assert preconditioned_kernel(lambda c: g[c], 0, [1.0, 1.0], adam_eps=1e-8).shape == (0, 0)


def test_a_missing_start_checkpoint_is_refused(tmp_path, capsys):
    d, cfg = make_run(tmp_path)
    shutil.rmtree(cfg.policies[1].model_dir)
    with pytest.raises(SuccessMatrixError, match=r"policy 'b''s start checkpoint .* is missing; restore it"):
        run_kernel(d)
    assert main(["kernel", "--run", str(d)]) == 2
    err = capsys.readouterr().err
    assert "start checkpoint" in err and err.count("\n") == 1
    assert not (d / "success_matrix.json").exists()


def test_a_task_without_a_gold_rendering_is_refused(tmp_path):
    d, _ = make_run(tmp_path)
    doc = json.loads((d / "problems.json").read_text())
    doc["eval"][1]["verifier"] = "math"  # add:3+4: no policy solved it at step 0
    (d / "problems.json").write_text(json.dumps(doc))
    with pytest.raises(SuccessMatrixError, match=r"'add:3\+4' has no verified step-0 success and its task "
                                                 r"\(verifier 'math'\) has no gold rendering"):
        run_kernel(d)


def test_the_command_writes_and_reports(tmp_path, capsys):
    d, _ = make_run(tmp_path)
    assert main(["kernel", "--run", str(d), "--dim", "64", "--seed", "1", "--out", str(tmp_path / "m.json")]) == 0
    out = capsys.readouterr().out
    assert "kernel: " in out and "2 policies x 4 prompts, dim 64" in out and "peak RSS" in out
    m = read_success_matrix(tmp_path / "m.json")
    assert m.kernel.shape == (2, 4, 4) and m.kernel_meta["seed"] == 1
    for e in m.kernel_meta["policies"]:  # log pi(y*|x) at the start, the kernel's targets' probabilities
        assert len(e["logprob"]) == 4 and all(-200 < x <= 0 for x in e["logprob"])
