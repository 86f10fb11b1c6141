"""The study's report: per regime and checkpoint accuracies with paired seed intervals, entropy / KL-to-start
curves, the two acceptance checks and one line per claim of the paper.

Read back from each run's ``eval.jsonl`` and ``metrics.jsonl`` (:func:`run_curves`). Per run, policy and
evaluation step ``s``:

* ``own``: greedy accuracy on the held-out prompts of the policy's own SFT family;
* ``excl``: greedy accuracy on its peer-exclusive prompts (not solved by it at step 0, greedy or any
  sample, while another policy solved them; :func:`mrl_llm.evaluate.peer_exclusive_sets`);
* ``overall``: greedy accuracy on every evaluation prompt (the RL pool and all held-out prompts);
* ``own_s`` / ``excl_s`` / ``overall_s``: the same prompts' *sampled* accuracy (successes / samples over the
  ``eval_k`` samples at the rollout temperature): the policy's expected reward, what GRPO maximises;
* ``reward``: sampled success on the policy's own-family prompts of the RL pool (``eval_k`` samples each)
  -- the training reward on its own family measured at the checkpoint;
* ``entropy`` / ``kl``: mean per-token entropy and k3 KL to the SFT start of the training rows of the
  ``eval_every`` steps before ``s`` (the step-0 point: step 0's own row).
* ``own_s_var`` / ``excl_s_var`` / ``reward_var``: the evaluation's own (binomial) variance of ``own_s`` /
  ``excl_s`` / ``reward`` given the policy, :func:`sampled_var` -- how much of a seed's number is sampling
  noise of the evaluation rather than a property of the policy.

A seed's value of a regime is the mean over the policies; intervals are 95 % Student-t over seeds
(:func:`mrl_llm.demo.results.mean_ci`); *paired* means the per-seed difference is taken first (same
seed, same SFT start).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mrl_llm.demo.results import fmt, mean_ci
from mrl_llm.evaluate import peer_exclusive_sets, read_eval_rows
from mrl_llm.report import render_table

METRICS = ("own", "own_s", "excl", "excl_s", "overall", "overall_s", "reward", "entropy", "kl")
ACC = ("own", "own_s", "excl", "excl_s", "overall", "overall_s")
#: the acceptance checks read the sampled accuracies (the expected reward GRPO optimises; greedy decoding is
#: invariant to the sharpening that is most of what GRPO does to these policies); greedy is printed beside
ACCEPT = {"own": "own_s", "excl": "excl_s"}
LABELS = {"own": "own held-out (greedy)", "own_s": "own held-out (sampled)", "excl": "peer-excl. (greedy)",
          "excl_s": "peer-excl. (sampled)", "overall": "overall (greedy)", "overall_s": "overall (sampled)",
          "reward": "own pool reward", "entropy": "entropy", "kl": "KL to start"}


def _mean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.mean(xs)) if xs else None


def _sampled(rows: Sequence[dict]) -> float | None:
    """Successes / samples over ``rows`` (None when none was sampled)."""
    n = sum(r["samples"] for r in rows)
    return sum(r["successes"] for r in rows) / n if n else None


def sampled_var(rows: Sequence[dict]) -> float | None:
    """Unbiased estimate of the sampling variance of :func:`_sampled` over ``rows`` given the policy: with
    ``k_i`` samples and success rate ``q_i`` on prompt ``i``, ``sum_i k_i^2 q_i (1 - q_i) / (k_i - 1) / (sum_i k_i)^2``
    (each prompt's successes are binomial(k_i, p_i); ``q_i (1 - q_i) k_i / (k_i - 1)`` estimates ``p_i (1 - p_i)``
    without bias). None when nothing was sampled or a prompt has a single sample (no estimate)."""
    n = sum(r["samples"] for r in rows)
    if not n or any(0 < r["samples"] < 2 for r in rows):
        return None
    tot = 0.0
    for r in rows:
        k = r["samples"]
        if k:
            q = r["successes"] / k
            tot += k * k * q * (1 - q) / (k - 1)
    return tot / (n * n)


def run_curves(run_dir: str | Path, families: dict[str, str], heldout_ids: set[str], window: int) -> dict[str, dict]:
    """``{policy: {metric: {step: value}}}`` of one run (module docstring). ``families``: policy -> own family."""
    run_dir = Path(run_dir)
    rows = [r for r in read_eval_rows(run_dir / "eval.jsonl") if not r.get("skipped")]
    excl = peer_exclusive_sets([r for r in rows if r["step"] == 0])
    train = []
    mpath = run_dir / "metrics.jsonl"
    if mpath.is_file():
        for line in mpath.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(r, dict) and r.get("kind") == "train":
                train.append(r)
    out: dict[str, dict] = {}
    for pol, fam in families.items():
        mine = [r for r in rows if r["policy"] == pol]
        steps = sorted({int(r["step"]) for r in mine})
        cur: dict[str, dict[int, float | None]] = {m: {} for m in METRICS}
        for s in steps:
            at = [r for r in mine if r["step"] == s]
            own = [r["greedy_correct"] for r in at if r["family"] == fam and r["prompt_id"] in heldout_ids]
            ex = [r["greedy_correct"] for r in at if r["prompt_id"] in excl.get(pol, set())]
            pool = [r for r in at if r["family"] == fam and r["prompt_id"] not in heldout_ids and r["samples"]]
            own_rows = [r for r in at if r["family"] == fam and r["prompt_id"] in heldout_ids]
            ex_rows = [r for r in at if r["prompt_id"] in excl.get(pol, set())]
            cur["own"][s] = _mean(own)
            cur["excl"][s] = _mean(ex)
            cur["overall"][s] = _mean([r["greedy_correct"] for r in at])
            cur["own_s"][s], cur["excl_s"][s], cur["overall_s"][s] = (_sampled(x) for x in (own_rows, ex_rows, at))
            cur["reward"][s] = (sum(r["successes"] for r in pool) / sum(r["samples"] for r in pool)) if pool else None
            for key, x in (("own_s_var", own_rows), ("excl_s_var", ex_rows), ("reward_var", pool)):
                cur.setdefault(key, {})[s] = sampled_var(x)
            tr = [r for r in train if r["policy"] == pol and (s - window <= r["step"] < s or r["step"] == s == 0)]
            cur["entropy"][s] = _mean([r.get("entropy") for r in tr])
            cur["kl"][s] = _mean([r.get("kl_to_ref") for r in tr])
        out[pol] = cur
    return out


def collect(out: Path, regimes: Sequence[str], seeds: Sequence[int], families: dict[str, str],
            heldout_ids: set[str], window: int) -> dict[tuple[str, int], dict]:
    """``{(regime, seed): run_curves(...)}`` for every finished run under ``out``."""
    res = {}
    for s in seeds:
        for reg in regimes:
            d = out / f"seed{s}" / reg
            if (d / "eval.jsonl").is_file():
                res[(reg, s)] = run_curves(d, families, heldout_ids, window)
    return res


def seed_value(curves: dict, metric: str, step: int, policies: Sequence[str]) -> float | None:
    """The mean over ``policies`` of ``metric`` at ``step`` (None when a policy lacks it)."""
    vals = [curves.get(p, {}).get(metric, {}).get(step) for p in policies]
    return None if any(v is None for v in vals) else float(np.mean(vals))


def paired(res: dict, a: str, b: str | None, metric: str, step_a: int, step_b: int, seeds: Sequence[int],
           policies: Sequence[str]) -> tuple[float, float | None, int]:
    """Mean ± half-width over seeds of ``value(a, step_a) - value(b, step_b)`` (``b = None``: ``a`` itself,
    i.e. a change over steps)."""
    diffs = []
    for s in seeds:
        ca, cb = res.get((a, s)), res.get((b or a, s))
        if ca is None or cb is None:
            continue
        va, vb = seed_value(ca, metric, step_a, policies), seed_value(cb, metric, step_b, policies)
        if va is not None and vb is not None:
            diffs.append(va - vb)
    return mean_ci(diffs)


def eval_noise(res: dict, a: str, b: str | None, metric: str, step_a: int, step_b: int, seeds: Sequence[int],
               policies: Sequence[str]) -> tuple[float | None, float | None]:
    """``(evaluation s.e., seed-to-seed sd)`` of the per-seed difference that :func:`paired` averages: the
    first from the binomial variances (:func:`sampled_var`, ``metric + "_var"``) of both terms, a seed's value
    being the mean over ``policies`` (so its variance is the sum over policies / ``len(policies)^2``),
    averaged over seeds; the second the sample sd (ddof 1) of the differences. None where not computable.
    The s.e. treats the two evaluations as independent: exact for a start -> final difference (another
    sampling seed per step), an upper bound for two regimes at the same step (the same sampling seed, so
    similar policies draw correlated samples)."""
    evs, diffs = [], []
    for s in seeds:
        ca, cb = res.get((a, s)), res.get((b or a, s))
        if ca is None or cb is None:
            continue
        va, vb = seed_value(ca, metric, step_a, policies), seed_value(cb, metric, step_b, policies)
        if va is None or vb is None:
            continue
        diffs.append(va - vb)
        terms = [c.get(p, {}).get(metric + "_var", {}).get(st) for c, st in ((ca, step_a), (cb, step_b)) for p in policies]
        if all(t is not None for t in terms):
            evs.append(sum(terms) / len(policies) ** 2)
    se = math.sqrt(float(np.mean(evs))) if evs and len(evs) == len(diffs) else None
    sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else None
    return se, sd


def _noise(n: tuple[float | None, float | None]) -> str:
    se, sd = n
    if se is None or sd is None:
        return "eval noise n/a"
    share = f", {min(se * se / (sd * sd), 9.99):.0%} of its variance" if sd > 0 else ""
    return f"eval s.e. {se:.3f} vs seed sd {sd:.3f}{share}"


def _excludes_zero(m: tuple[float, float | None, int], sign: int) -> bool:
    mean, half, n = m
    return n > 1 and half is not None and (mean - half > 0 if sign > 0 else mean + half < 0)


def claims(res: dict, regimes: Sequence[str], seeds: Sequence[int], policies: Sequence[str],
           steps: Sequence[int]) -> list[str]:
    """One line per claim of the paper (``../shared/SPEC.md``, *Reported findings*), with the numbers."""
    last = steps[-1]
    lines = []

    def pv(a, b, metric, step=last):
        return paired(res, a, b, metric, step, step, seeds, policies)

    if "sgt" in regimes:
        finals = {r: mean_ci([v for s in seeds if (v := seed_value(res.get((r, s), {}), "overall", last, policies))
                              is not None]) for r in regimes}
        best = max(finals, key=lambda r: finals[r][0])
        lines.append(f"SGT best average accuracy: {'agrees' if best == 'sgt' else 'disagrees'} -- final overall "
                     "accuracy " + ", ".join(f"{r} {fmt(finals[r])}" for r in regimes) + ".")
    if "sgt" in regimes and "grpo" in regimes:
        ck = [s for s in steps if s > 0]
        diffs = {s: pv("sgt", "grpo", "overall", s) for s in ck}
        at_or_above = sum(1 for s in ck if diffs[s][2] and diffs[s][0] >= 0)
        lines.append(f"SGT at or above GRPO at almost every checkpoint: "
                     f"{'agrees' if at_or_above >= len(ck) - 1 and ck else 'disagrees'} -- paired overall accuracy "
                     f"SGT - GRPO >= 0 at {at_or_above}/{len(ck)} checkpoints ("
                     + ", ".join(f"step {s}: {fmt(diffs[s])}" for s in ck) + ").")
        early = ck[0] if ck else last
        e = pv("sgt", "grpo", "overall", early)
        lines.append(f"SGT faster early progress: {'agrees' if e[0] > 0 else 'disagrees'} -- paired overall accuracy "
                     f"SGT - GRPO at step {early}: {fmt(e)}.")
        ent, kl = pv("sgt", "grpo", "entropy"), pv("sgt", "grpo", "kl")
        lines.append(f"SGT entropy comparable or higher than GRPO: {'agrees' if ent[0] + (ent[1] or 0) >= 0 else 'disagrees'}"
                     f" -- paired entropy SGT - GRPO (train rows of the last window before step {last}) {fmt(ent, 4)}.")
        prps = [r for r in regimes if r.startswith("prp")]
        verdict = ("not judged: no PRP regime in this report" if not prps else
                   f"{'agrees' if all(pv('sgt', r, 'kl')[0] <= 0 for r in prps) else 'disagrees'}"
                   " with 'low' read as below PRP's")
        lines.append(f"SGT KL low: KL to start SGT - GRPO {fmt(kl, 4)}"
                     + "".join(f"; SGT - {r} {fmt(pv('sgt', r, 'kl'), 4)}" for r in prps) + f" -- {verdict}.")
    if "xgrpo" in regimes and "grpo" in regimes:
        x = pv("xgrpo", "grpo", "overall")
        same = not _excludes_zero(x, 1) and not _excludes_zero(x, -1)
        lines.append(f"XGRPO nearly indistinguishable from GRPO: {'agrees' if same else 'disagrees'} -- paired final "
                     f"overall accuracy XGRPO - GRPO {fmt(x)}; own held-out {fmt(pv('xgrpo', 'grpo', 'own'))}.")
    for r in regimes:
        if r.startswith("prp") and "sgt" in regimes:
            ent, kl, acc = pv(r, "sgt", "entropy"), pv(r, "sgt", "kl"), pv(r, "sgt", "overall")
            ok = ent[0] < 0 and kl[0] > 0 and acc[0] < 0
            lines.append(f"PRP ({r}) lower entropy, larger KL, lower average accuracy than SGT: "
                         f"{'agrees' if ok else 'disagrees'} -- paired {r} - SGT: entropy {fmt(ent, 4)}, "
                         f"KL {fmt(kl, 4)}, final overall accuracy {fmt(acc)}.")
    return lines


def acceptance(res: dict, seeds: Sequence[int], policies: Sequence[str], steps: Sequence[int]) -> list[str]:
    """The issue's two acceptance checks, one line each, with the numbers."""
    last = steps[-1]
    lines = []
    if any(k[0] == "grpo" for k in res):
        ok = True
        parts = []
        for p in policies:
            own = paired(res, "grpo", None, ACCEPT["own"], last, 0, seeds, [p])
            rew = paired(res, "grpo", None, "reward", last, 0, seeds, [p])
            greedy = paired(res, "grpo", None, "own", last, 0, seeds, [p])
            ok &= _excludes_zero(own, 1) and _excludes_zero(rew, 1)
            n_own = _noise(eval_noise(res, "grpo", None, ACCEPT["own"], last, 0, seeds, [p]))
            n_rew = _noise(eval_noise(res, "grpo", None, "reward", last, 0, seeds, [p]))
            parts.append(f"{p}: own held-out sampled {fmt(own)} ({n_own}), own-family pool reward {fmt(rew)} "
                         f"({n_rew}) (own held-out greedy {fmt(greedy)}, not checked)")
        lines.append(f"GRPO improves every policy (start -> final, paired, 95 % interval excludes 0): "
                     f"{'PASS' if ok else 'FAIL'} -- " + "; ".join(parts) + ".")
    if any(k[0] == "sgt" for k in res) and any(k[0] == "grpo" for k in res):
        ex = paired(res, "sgt", "grpo", ACCEPT["excl"], last, last, seeds, policies)
        own = paired(res, "sgt", "grpo", ACCEPT["own"], last, last, seeds, policies)
        gex = paired(res, "sgt", "grpo", "excl", last, last, seeds, policies)
        gown = paired(res, "sgt", "grpo", "own", last, last, seeds, policies)
        ok = _excludes_zero(ex, 1) and own[2] > 0 and own[0] >= -0.05
        n_ex = _noise(eval_noise(res, "sgt", "grpo", ACCEPT["excl"], last, last, seeds, policies))
        n_own = _noise(eval_noise(res, "sgt", "grpo", ACCEPT["own"], last, last, seeds, policies))
        lines.append(f"SGT vs GRPO (final, paired): {'PASS' if ok else 'FAIL'} -- peer-exclusive sampled {fmt(ex)} "
                     f"({n_ex}; needs > 0, interval excluding 0); own held-out sampled {fmt(own)} ({n_own}; needs "
                     "mean >= -0.05); "
                     f"greedy, not checked: peer-exclusive {fmt(gex)}, own held-out {fmt(gown)}.")
    return lines


def checkpoint_tables(res: dict, regimes: Sequence[str], seeds: Sequence[int], policies: Sequence[str],
                      steps: Sequence[int]) -> str:
    """Per regime and checkpoint: the metrics (mean over policies, ± over seeds), then paired vs GRPO."""
    head = ["regime", "step", *(LABELS[m] for m in METRICS)]
    body = []
    for reg in regimes:
        for s in steps:
            cells = []
            for m in METRICS:
                v = [x for sd in seeds if (c := res.get((reg, sd))) and (x := seed_value(c, m, s, policies)) is not None]
                cells.append(fmt(mean_ci(v), 4 if m in ("entropy", "kl") else 3))
            body.append([reg, str(s), *cells])
    md = render_table(head, body)
    if "grpo" in regimes:
        head2 = ["regime", "step", *(f"Δ {h}" for h in head[2:])]
        body2 = [[reg, str(s), *(fmt(paired(res, reg, "grpo", m, s, s, seeds, policies), 4 if m in ("entropy", "kl")
                                     else 3) for m in METRICS)]
                 for reg in regimes if reg != "grpo" for s in steps if s > 0]
        md += "\n\nPaired differences vs grpo (per seed first; mean ± 95 % t-interval over seeds):\n\n" + render_table(head2, body2)
    return md


def per_policy_table(res: dict, regimes: Sequence[str], seeds: Sequence[int], policies: Sequence[str],
                     steps: Sequence[int]) -> str:
    """Final own held-out / peer-exclusive / overall per regime and policy, with the step-0 value."""
    head = ["regime", "policy", "own held-out greedy / sampled (start)", "own held-out greedy / sampled (final)",
            "peer-excl. greedy / sampled (final)", "overall greedy / sampled (final)"]
    body = []
    for reg in regimes:
        for p in policies:
            def mc(m, s, p=p, reg=reg):
                return mean_ci([x for sd in seeds if (c := res.get((reg, sd))) and (x := seed_value(c, m, s, [p]))
                                is not None])
            body.append([reg, p, *(f"{fmt(mc(m, s))} / {fmt(mc(m + '_s', s))}" for m, s in
                                   (("own", 0), ("own", steps[-1]), ("excl", steps[-1]), ("overall", steps[-1])))])
    return render_table(head, body)


def plot(res: dict, regimes: Sequence[str], seeds: Sequence[int], policies: Sequence[str], steps: Sequence[int],
         path: Path) -> None:
    """Nine panels, one metric each, mean over policies and seeds per regime and checkpoint."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = {**LABELS, "reward": "own-family pool reward (sampled)", "entropy": "entropy (train rows)",
              "kl": "KL to the SFT start (train rows)"}
    fig, axes = plt.subplots(3, 3, figsize=(14, 10.5))
    for ax, m in zip(axes.flat, METRICS, strict=True):
        for reg in regimes:
            ys = [_mean([seed_value(res[(reg, sd)], m, s, policies) for sd in seeds if (reg, sd) in res]) for s in steps]
            ax.plot(steps, [np.nan if y is None else y for y in ys], marker="o", ms=3, label=reg)
        ax.set_title(titles[m], fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"mutual-RL study: {len(policies)} policies, {len(seeds)} seed(s); means over policies and seeds",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


def _norm_sgt(cfg: Any) -> str:
    """`` without SGT's gradient`` when the study keeps its norm group out of SGT's term (``, the final norm
    without SGT's gradient`` for the final norm alone), else nothing."""
    if not getattr(cfg, "norm_sgt", True) and getattr(cfg, "norm_lr", None) is not None:
        return ", without SGT's gradient"
    return "" if getattr(cfg, "final_norm_sgt", True) else ", the final norm without SGT's gradient"


def _embed_lr(cfg: Any) -> str:
    lr = getattr(cfg, "embed_lr", None)
    return f"{cfg.lr}" if lr is None else ("0 (frozen)" if lr == 0 else f"{lr}")


def _lrs(cfg: Any) -> str:
    per = dict(getattr(cfg, "lr_per_policy", ()))
    return f"{cfg.lr}" + (" (" + ", ".join(f"{n} {v}" for n, v in per.items()) + ")" if per else "")


def _starts(cfg: Any) -> str:
    """Where the seeds' runs start from and train on (shared or per seed)."""
    sft, pool = getattr(cfg, "sft_seed", None), getattr(cfg, "pool_seed", None)
    return (("one SFT'd start per policy shared by every seed (SFT seed " + f"{sft})" if sft is not None
             else "each seed SFTs its own start") + ", " +
            (f"one RL pool shared by every seed (pool seed {pool})" if pool is not None else "each seed its own RL pool")
            + (" -- the seeds vary the RL only (sampling, prompt order), as in the paper; start -> final differences "
               "carry no start-to-start variance" if sft is not None and pool is not None else ""))


def write_report(cfg: Any, out: Path, *, wall_s: float, load: tuple, sft: dict, say: Callable[[str], None],
                 reused: int = 0) -> dict[str, Any]:
    """Write ``study.md``, ``study.json`` and ``study.png`` under ``out`` and return the JSON content."""
    task = cfg.task()
    heldout_ids = {p.prompt_id for p in task.problems("eval")}
    families = {p.name: p.family for p in cfg.policies}
    pols = [p.name for p in cfg.policies]
    seeds = cfg.seed_list
    res = collect(out, cfg.regimes, seeds, families, heldout_ids, cfg.eval_every)
    steps = sorted({s for c in res.values() for m in c.values() for s in m["overall"]})
    if not steps:
        raise FileNotFoundError(f"no finished study run under {out}; run `python -m mrl_llm study --out {out}`")
    md = [f"# mutual-RL study\n\n{cfg.seeds} seed(s) {seeds}, {len(pols)} policies "
          f"({', '.join(f'{p.name}: {p.arch}/{p.tokenizer}/{p.family}' for p in cfg.policies)}), {cfg.steps} RL steps x "
          f"{cfg.prompts_per_step} prompts x G={cfg.group_size}, {cfg.optimizer} lr {_lrs(cfg)} (beta2 {cfg.beta2}; norm "
          f"layers lr {getattr(cfg, 'norm_lr', None) or cfg.lr}{_norm_sgt(cfg)}; token embeddings lr {_embed_lr(cfg)}), eval {cfg.eval_k} "
          f"samples/prompt every {cfg.eval_every} steps, "
          f"SFT steps {', '.join(f'{p.name} {cfg.sft_config(0, p).steps}' for p in cfg.policies)}, "
          f"pool {cfg.pool_per_family}/family, SGT λ {cfg.sgt_weight}; {_starts(cfg)}; this invocation: "
          f"wall {wall_s:.0f} s on {os.cpu_count()} CPU(s), load average {load[0][0]:.2f} -> {load[1][0]:.2f}; "
          f"{reused} SFT/run step(s) reused.\n",
          "## SFT start (greedy accuracy train / held-out per family)\n",
          *[f"- SFT seed {s} {n}: " + ", ".join(f"{f} {a['train']:.2f}/{a['eval']:.2f}" for f, a in rep["accuracy"].items())
            for s, reps in sft.items() for n, rep in reps.items()],
          "\n## Acceptance\n", f"Accuracies checked: sampled (successes / samples, {cfg.eval_k} samples per prompt at the "
          "rollout temperature): the policy's expected reward, what GRPO maximises; greedy accuracy is printed beside "
          "and not checked. Beside each checked difference: the evaluation's own noise (eval s.e.: the binomial "
          "standard error of one seed's difference given the policies, from the per-prompt success rates) and the "
          "seed-to-seed sd of the differences; where the first is most of the second, more samples per prompt "
          "(--eval-k) make the check more precise.\n", *[f"- {x}" for x in acceptance(res, seeds, pols, steps)],
          "\n## The paper's claims\n", *[f"- {x}" for x in claims(res, cfg.regimes, seeds, pols, steps)],
          "\n## Per regime and checkpoint (mean over policies; ± 95 % t-interval over seeds)\n",
          checkpoint_tables(res, cfg.regimes, seeds, pols, steps),
          "\n## Per policy (final)\n", per_policy_table(res, cfg.regimes, seeds, pols, steps), "\n![study](study.png)\n"]
    text = "\n".join(md)
    (out / "study.md").write_text(text)
    plot(res, cfg.regimes, seeds, pols, steps, out / "study.png")
    doc = {"config": asdict(cfg), "wall_s": wall_s, "reused_steps": reused, "steps": steps,
           "runs": {f"{r}/seed{s}": c for (r, s), c in res.items()}, "sft": {str(k): v for k, v in sft.items()}}
    (out / "study.json").write_text(json.dumps(doc, indent=1, default=str))
    say(text)
    say(f"report: {out / 'study.md'}  plot: {out / 'study.png'}")
    return doc
