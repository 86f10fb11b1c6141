"""``python -m mrl_llm study``: three heterogeneous tiny policies, the five regimes, every checkpoint scored.

The demo's machinery (:mod:`mrl_llm.demo.run`: tokenizers, SFT jobs, the process pool, reuse of finished
steps, progress lines) with the study's own settings (:class:`StudyConfig`) and its own run job and
report:

* three policies (:data:`STUDY_POLICIES`), three architectures (Qwen2-, Llama- and GPT-2-style), three
  tokenizer kinds (byte-level BPE, SentencePiece-style BPE, character-level), three skill families
  (``add``, ``sub``, ``mul_small``), each SFT'd only on its own family, briefly enough that it keeps room
  to improve;
* GRPO settings measured to improve these policies (``experiments/study/README.md``: why the demo's do not);
* every run is evaluated (greedy + ``eval_k`` samples) at step 0, every ``eval_every`` steps and at the
  end on the RL pool AND the held-out prompts of every family, so own-family held-out, peer-exclusive and
  overall accuracy exist at every checkpoint (:mod:`mrl_llm.demo.study_report`).

Layout of ``DIR`` as the demo's, plus ``study.md`` / ``study.json`` / ``study.png``. Resumable: run the same
command again (or with more ``--seeds``) and finished SFTs and runs are reused.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrl_llm.demo.run import _fresh, _quiet, _same, portable_run, run_demo, sft_settings
from mrl_llm.demo.setup import (
    FINAL_NORM_GLOBS,
    NORM_GLOBS,
    DemoConfig,
    DemoPolicy,
    check_settings,
    rl_pool,
    run_config,
)
from mrl_llm.demo.sft import ArchSize, SFTConfig
from mrl_llm.rewards.arithmetic import Family

#: The study's third family: multiplication by 0, 1 or 2 (answers 0..78) -- rules (zero, copy, double) a tiny
#: model can carry to held-out prompts; the earlier ``a <= 4, b <= 19`` table was memorised (held-out greedy
#: 0.15 with the pool at 0.5, 0.25 with the pool at 1.0: nothing for GRPO to sharpen, README 1e)
MUL_SMALL = Family("mul_small", "*", (0, 2), (0, 39))

STUDY_POLICIES = (
    DemoPolicy("qwen-add", "qwen2", "bytebpe", "add", ArchSize(hidden=96, layers=2, heads=4, kv_heads=2)),
    DemoPolicy("llama-sub", "llama", "spbpe", "sub", ArchSize(hidden=80, layers=3, heads=4, kv_heads=4)),
    DemoPolicy("gpt2-mul", "gpt2", "char", "mul_small", ArchSize(hidden=96, layers=2, heads=4, kv_heads=4)),
)


#: the parameter-name glob of each architecture's token embedding (tied to the output head in every study
#: architecture), for :attr:`StudyConfig.embed_lr`
EMBED_GLOBS = {"llama": "*embed_tokens*", "qwen2": "*embed_tokens*", "gpt2": "*.wte.*"}


@dataclass(frozen=True)
class StudyConfig(DemoConfig):
    """The study's knobs: :class:`~mrl_llm.demo.setup.DemoConfig`'s (with the study's defaults) plus the
    optimizer's. ``pool_per_family`` training prompts per family form the RL pool; evaluation covers the
    pool and every held-out prompt of each family."""

    #: 120 steps (study16f; 60 before): on seeds 3-8 every GRPO gain keeps growing to step 120 and its
    #: chance of a 3-seed interval excluding 0 rises from 0.74-1.00 (step 60) to 0.95-1.00
    steps: int = 120
    #: 32 prompts x G = 8 a step, base lr 3e-5: chosen on seeds 3-8 (study16e, ``experiments/study/README.md``):
    #: at 16 prompts and lr 1e-4 the base parameters drift (greedy held-out falls, occasional collapses) and
    #: GRPO's held-out gain is within the seeds' spread. SGT λ 0.02 with the final norm out of SGT's term
    #: (``final_norm_sgt``; study16g, seeds 3-8; λ 0.01 with every norm in it before)
    prompts_per_step: int = 32
    group_size: int = 8
    lr: float = 3e-5
    sgt_weight: float = 0.02
    optimizer: str = "adamw"
    beta2: float = 0.999
    sft_steps: int = 150
    max_new_tokens: int = 14
    pool_per_family: int = 64
    eval_every: int = 30
    eval_k: int = 32
    families: tuple[str | Family, ...] = ("add", "sub", MUL_SMALL)
    policies: tuple[DemoPolicy, ...] = STUDY_POLICIES
    #: SFT steps per policy name (others: ``sft_steps``): the families differ in how fast they are learnt
    sft_steps_per_policy: tuple[tuple[str, int], ...] = (("qwen-add", 400), ("llama-sub", 200), ("gpt2-mul", 100))
    #: RL learning rate of the norm layers (``train.lr_groups``; None: ``lr`` for every parameter), 1e-2 - 3e-2
    #: in ``experiments/study/README.md`` 1e; the final norm out of SGT's term since study16g (on seeds 3-8 SGT's
    #: own-family cost -0.037 -> -0.004 at λ 0.01, for most of its transfer, +0.023 -> +0.018)
    norm_lr: float | None = 3e-2
    final_norm_sgt: bool = False
    #: whether the norm group (``norm_lr``) takes gradient from SGT's term (``train.lr_groups[].sgt``). At
    #: 1000x the base rate, lambda on the norms' gains is 1000x larger than on the rest: SGT's NLL on a
    #: peer's text there warms the policy's sampling instead of teaching it the text
    norm_sgt: bool = True
    #: RL learning rate of the token embeddings (tied output head); 0 freezes them, None: ``lr``. The
    #: PG gradient is largest there (as large as the weights, ``experiments/study/README.md`` 1a)
    embed_lr: float | None = None
    #: the SFT seed of every run: ONE SFT'd start per policy, shared by all seeds, so the seeds vary the RL only
    #: (its sampling and prompt order), as in the paper, where every RL seed starts from the same pretrained
    #: model. None: each seed SFTs its own start (before study16d; the starts' differences then add to the
    #: seed-to-seed spread of every start -> final difference, ``experiments/study/README.md``)
    sft_seed: int | None = 0
    #: the seed of the RL prompt pool (:func:`~mrl_llm.demo.setup.rl_pool`): the same training prompts in every
    #: seed (a fixed data set, like the start). None: each seed draws its own pool
    pool_seed: int | None = 0
    #: RL base learning rate per policy name (others: ``lr``); the norm / embedding groups keep their own rates
    lr_per_policy: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        check_settings(self, "study")
        if len(self.policies) < 2 or len({p.family for p in self.policies}) != len(self.policies):
            raise ValueError("study: at least two policies, each with its own SFT family")
        missing = sorted({p.family for p in self.policies} - set(self.task().family_names))
        if missing:
            raise ValueError(f"study: SFT families {missing} are not in the task families {self.task().family_names}")
        if self.optimizer not in ("adamw", "adam", "sgd"):
            raise ValueError(f"study: optimizer {self.optimizer!r} must be adamw, adam or sgd")
        if self.norm_lr is not None and not self.norm_lr > 0:
            raise ValueError(f"study: --norm-lr must be > 0 (or unset), got {self.norm_lr}")
        unknown = sorted({p.arch for p in self.policies} - set(NORM_GLOBS))
        if self.norm_lr is not None and unknown:
            raise ValueError(f"study: no norm-parameter glob for architecture(s) {unknown}; add them to NORM_GLOBS "
                             f"or unset --norm-lr")
        if not isinstance(self.norm_sgt, bool):
            raise ValueError(f"study: norm_sgt must be True or False, got {self.norm_sgt!r}")
        if not isinstance(self.final_norm_sgt, bool):
            raise ValueError(f"study: final_norm_sgt must be True or False, got {self.final_norm_sgt!r}")
        if not self.norm_sgt and self.norm_lr is None:
            raise ValueError("study: --no-norm-sgt keeps the norm group out of SGT's term; it needs --norm-lr "
                             "(the norm layers' own group)")
        if self.embed_lr is not None and not self.embed_lr >= 0:
            raise ValueError(f"study: --embed-lr must be >= 0 (0 freezes the embeddings) or unset, got {self.embed_lr}")
        unknown = sorted({p.arch for p in self.policies} - set(EMBED_GLOBS))
        if self.embed_lr is not None and unknown:
            raise ValueError(f"study: no embedding glob for architecture(s) {unknown}; add them to EMBED_GLOBS "
                             f"or unset --embed-lr")
        if isinstance(self.sgt_successes, bool) or not isinstance(self.sgt_successes, int) or self.sgt_successes < 1:
            raise ValueError(f"study: --sgt-successes must be an integer >= 1, got {self.sgt_successes!r}")
        for key, v in (("sft-seed", self.sft_seed), ("pool-seed", self.pool_seed)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"study: --{key} must be an integer >= 0 (or unset: one per seed), got {v!r}")
        names = [p.name for p in self.policies]
        for item in self.lr_per_policy:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise ValueError(f"study: --lr-policy entries are NAME=LR pairs, got {item!r}")
            name, lr = item
            if name not in names:
                raise ValueError(f"study: --lr-policy names policy {name!r}, not one of {names}")
            if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
                raise ValueError(f"study: --lr-policy {name}={lr!r}: the learning rate must be a number > 0")
        dup = sorted({n for n, _ in self.lr_per_policy if [m for m, _ in self.lr_per_policy].count(n) > 1})
        if dup:
            raise ValueError(f"study: --lr-policy gives {dup} more than one learning rate; give each policy one")


    def sft_config(self, seed: int, policy: DemoPolicy | None = None) -> SFTConfig:
        """The SFT of ``policy`` in a seed: ``sft_steps_per_policy``'s steps for it, else ``sft_steps``; its
        seed is :meth:`sft_seed_of` ``(seed)``."""
        steps = dict(self.sft_steps_per_policy).get(policy.name, self.sft_steps) if policy else self.sft_steps
        return SFTConfig(steps=steps, batch=self.sft_batch, lr=self.sft_lr, seed=self.sft_seed_of(seed))

    def sft_seed_of(self, seed: int) -> int:
        """``sft_seed`` (one start shared by every seed), or ``seed`` itself when it is None."""
        return seed if self.sft_seed is None else self.sft_seed

    def pool_seed_of(self, seed: int) -> int:
        """``pool_seed`` (one RL pool shared by every seed), or ``seed`` itself when it is None."""
        return seed if self.pool_seed is None else self.pool_seed

    def lr_of(self, policy: str) -> float:
        """The RL base learning rate of ``policy``: ``lr_per_policy``'s, else ``lr``."""
        return dict(self.lr_per_policy).get(policy, self.lr)


def study_run_config(cfg: StudyConfig, regime: str, seed: int, policy_dirs: dict[str, str | Path]) -> dict[str, Any]:
    """The demo's run config (:func:`~mrl_llm.demo.setup.run_config`) with the study's optimizer (and the
    norm layers' and the embeddings' own rates, :attr:`StudyConfig.norm_lr`, :attr:`StudyConfig.embed_lr`;
    the norm group out of SGT's term unless :attr:`StudyConfig.norm_sgt`, the final norm unless
    :attr:`StudyConfig.final_norm_sgt`: a group of its own, first, so that its glob wins)."""
    mapping = run_config(cfg, regime, seed, policy_dirs)
    mapping["name"] = f"study-seed{seed}"
    arch = {p.name: p.arch for p in cfg.policies}
    for p in mapping["policies"]:
        p["train"].pop("lr_groups", None)  # the study's own, below (norm_sgt, embed_lr)
        p["train"]["optimizer"] = cfg.optimizer
        p["train"]["lr"] = cfg.lr_of(p["name"])
        if cfg.optimizer != "sgd":
            p["train"]["betas"] = [0.9, cfg.beta2]
        # the final norm apart (first: its glob wins), unless the whole norm group is out of SGT's term already
        final = (cfg.norm_lr or cfg.lr_of(p["name"])) if cfg.norm_sgt and not cfg.final_norm_sgt else None
        groups = [{"match": globs[arch[p["name"]]], "lr": lr, **extra}
                  for globs, lr, extra in ((FINAL_NORM_GLOBS, final, {"sgt": False}),
                                           (NORM_GLOBS, cfg.norm_lr, {} if cfg.norm_sgt else {"sgt": False}),
                                           (EMBED_GLOBS, cfg.embed_lr, {})) if lr is not None]
        if groups:
            p["train"]["lr_groups"] = groups
    return mapping


def eval_set(cfg: StudyConfig, seed: int) -> list:
    """The RL pool of the seed (:meth:`StudyConfig.pool_seed_of`), then every held-out prompt of each family."""
    task = cfg.task()
    return rl_pool(task, cfg.pool_per_family, cfg.pool_seed_of(seed)) + task.problems("eval")


def study_run_job(cfg: StudyConfig, regime: str, seed: int, policy_dirs: dict[str, str], out_dir: str) -> dict[str, Any]:
    """Train one regime of one seed into ``out_dir``, evaluated on :func:`eval_set` at every checkpoint;
    reused when ``done.json`` records the same settings."""
    from mrl_llm.config import config_from_mapping
    from mrl_llm.trainer import train

    d = Path(out_dir)
    done = d / "done.json"
    mapping = study_run_config(cfg, regime, seed, policy_dirs)
    settings = {"run": portable_run(mapping, d), "sft": [sft_settings(cfg, p, seed) for p in cfg.policies],
                "eval": "pool+heldout", "pool_seed": cfg.pool_seed_of(seed)}
    if _same(done, settings):
        return {"regime": regime, "seed": seed, "reused": True}
    _fresh(d, done)
    _quiet()
    t0 = time.perf_counter()
    train(config_from_mapping(mapping), d, problems=rl_pool(cfg.task(), cfg.pool_per_family, cfg.pool_seed_of(seed)),
          eval_problems=eval_set(cfg, seed))
    wall = time.perf_counter() - t0
    done.write_text(json.dumps({"settings": settings, "wall_s": wall}, indent=1))
    return {"regime": regime, "seed": seed, "wall_s": wall}


def study_finish(cfg: StudyConfig, out: Path, *, wall_s: float, load: tuple, sft: dict, say: Any,
                 reused: int = 0) -> dict[str, Any]:
    """Read every run back and write ``study.json``, ``study.md`` and ``study.png``."""
    from mrl_llm.demo.study_report import write_report

    return write_report(cfg, out, wall_s=wall_s, load=load, sft=sft, say=say, reused=reused)


def run_study(cfg: StudyConfig, out: str | Path, *, jobs: int = 5, say: Any = print,
              progress_every: float = 30.0) -> dict[str, Any]:
    """Run the study into ``out`` (module docstring); returns ``study.json``'s content."""
    return run_demo(cfg, out, jobs=jobs, say=say, progress_every=progress_every, run_fn=study_run_job,
                    finish_fn=study_finish, kind="study")
