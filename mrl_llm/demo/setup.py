"""The demo's settings and the trainer config of one run: :class:`DemoConfig` -> :func:`run_config`.

Two policies (:data:`POLICIES`): ``qwen-add`` (Qwen2-style, the byte-level BPE tokenizer, SFT'd on
``add``) and ``llama-sub`` (Llama-style, the SentencePiece-style tokenizer, another width and depth,
SFT'd on ``sub``). Per seed, every regime's run gets the same config except the regime name: the same
SFT'd starting weights, the same RL prompt pool (:func:`rl_pool`), the same seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrl_llm.data.problem import Problem
from mrl_llm.demo.sft import ArchSize, SFTConfig
from mrl_llm.rewards import ArithmeticTask
from mrl_llm.rewards.arithmetic import Family
from shared_interfaces.regimes.config import STANDARD_REGIMES

TEMPLATE = {"text": "{question}\n"}


@dataclass(frozen=True)
class DemoPolicy:
    """One demo policy: name, architecture, tokenizer kind, its SFT family and its size."""

    name: str
    arch: str
    tokenizer: str
    family: str
    size: ArchSize


POLICIES = (
    DemoPolicy("qwen-add", "qwen2", "bytebpe", "add", ArchSize(hidden=96, layers=2, heads=4, kv_heads=2)),
    DemoPolicy("llama-sub", "llama", "spbpe", "sub", ArchSize(hidden=80, layers=3, heads=4, kv_heads=4)),
)

#: the parameter-name glob of each architecture's normalisation layers (RMSNorm gains; GPT-2's LayerNorm
#: gains and biases), for :attr:`DemoConfig.norm_lr`
NORM_GLOBS = {"llama": "*norm*", "qwen2": "*norm*", "gpt2": "*ln_*"}

#: the final norm's parameters (before the LM head: its gain scales every logit, a global inverse temperature),
#: for :attr:`DemoConfig.final_norm_sgt`
FINAL_NORM_GLOBS = {"llama": "model.norm.*", "qwen2": "model.norm.*", "gpt2": "transformer.ln_f.*"}


@dataclass(frozen=True)
class DemoConfig:
    """Every knob of the demo; the defaults are the setting measured in experiments/demo/README.md.

    SFT: ``sft_steps`` AdamW steps of ``sft_batch`` on the policy's own family (lr ``sft_lr``).
    RL: ``steps`` steps of ``prompts_per_step`` prompts drawn from a pool of ``pool_per_family``
    training prompts per family, ``group_size`` samples each (temperature 1, ``max_new_tokens``),
    AdamW ``lr``, the norm layers at ``norm_lr`` (``train.lr_groups``; the final norm out of SGT's term
    unless ``final_norm_sgt``), clip 0.2 / 0.28, token-mean, KL coefficient ``kl_coef`` (the KL to the SFT
    start is tracked either way), SGT weight λ = ``sgt_weight`` with ``sgt_successes`` shortest peer
    successes, PRP peer weight 1 and ratio cap 2. The SFT report scores at most ``sft_eval_max`` prompts
    per family and split. Evaluation (:func:`eval_set`): the pool and the held-out prompts of each family
    (``heldout_per_family`` of them, None: all), greedy + ``eval_k`` samples each, before training, every
    ``eval_every`` steps and at the end.
    """

    seeds: int = 1
    first_seed: int = 0
    steps: int = 100
    prompts_per_step: int = 16
    group_size: int = 8
    lr: float = 3e-5
    #: RL learning rate of the normalisation layers' gains and biases (``train.lr_groups``; None: ``lr`` for
    #: every parameter): the cheap direction of how sharply a policy samples, which Adam at a safe ``lr``
    #: barely moves (``experiments/study/README.md`` 1e)
    norm_lr: float | None = 3e-2
    #: whether the final norm (before the LM head) takes gradient from SGT's term; False: it is a group of its
    #: own at ``norm_lr`` (``lr`` when that is None) without SGT's gradient (its gain is a global inverse
    #: temperature: SGT's NLL on text the policy finds unlikely pulls it down, warming all sampling)
    final_norm_sgt: bool = False
    #: whether the norm layers take gradient from SGT's term (False: ``train.lr_groups`` ``sgt: false`` for every
    #: norm, the final one included; needs ``norm_lr``)
    norm_sgt: bool = True
    #: SGT λ 0.05: on seeds 5-7 (``experiments/demo/README.md``) the middle of the candidates 0.02 / 0.05 / 0.1
    #: (transfer +0.005 / +0.028 / +0.053 over GRPO, own-family held-out sampled -0.09 / -0.11 / -0.22)
    sgt_weight: float = 0.05
    sgt_successes: int = 1
    kl_coef: float = 0.0
    max_new_tokens: int = 12
    pool_per_family: int = 32
    #: 8 samples per prompt: the held-out sampled accuracy's evaluation noise is about half of the k = 4 one's
    eval_k: int = 8
    eval_every: int = 25
    #: held-out prompts per family in every evaluation (a fixed, seed-independent sample; None: all of them)
    heldout_per_family: int | None = None
    sft_eval_max: int = 80
    sft_steps: int = 400
    sft_batch: int = 64
    sft_lr: float = 3e-3
    regimes: tuple[str, ...] = STANDARD_REGIMES
    families: tuple[str | Family, ...] = ("add", "sub")
    policies: tuple[DemoPolicy, ...] = POLICIES

    def __post_init__(self) -> None:
        check_settings(self, "demo")
        if self.norm_lr is not None and not self.norm_lr > 0:
            raise ValueError(f"demo: --norm-lr must be > 0 (or --no-norm-lr), got {self.norm_lr}")
        for name in ("norm_sgt", "final_norm_sgt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"demo: {name} must be True or False, got {getattr(self, name)!r}")
        if not self.norm_sgt and self.norm_lr is None:
            raise ValueError("demo: --no-norm-sgt takes the norm layers' group out of SGT's term; give that group "
                             "its own learning rate with --norm-lr X")
        unknown = sorted({p.arch for p in self.policies} - set(NORM_GLOBS))
        if unknown and (self.norm_lr is not None or not self.final_norm_sgt):
            raise ValueError(f"demo: no norm-parameter glob for architecture(s) {unknown}; add them to NORM_GLOBS "
                             f"and FINAL_NORM_GLOBS, or pass --no-norm-lr --final-norm-sgt")
        if self.heldout_per_family is not None and (isinstance(self.heldout_per_family, bool)
                                                    or not isinstance(self.heldout_per_family, int)
                                                    or self.heldout_per_family < 1):
            raise ValueError(f"demo: --heldout-per-family must be an integer >= 1 (or unset: all), "
                             f"got {self.heldout_per_family!r}")
        if len(self.policies) != 2 or len({p.family for p in self.policies}) != 2:
            raise ValueError("demo: two policies with different SFT families")
        missing = sorted({p.family for p in self.policies} - set(self.task().family_names))
        if missing:
            raise ValueError(f"demo: SFT families {missing} are not in the task families {list(self.families)}")

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    def sft_config(self, seed: int, policy: DemoPolicy | None = None) -> SFTConfig:
        """The SFT of a seed (the same for every policy here; the study's differs per policy)."""
        return SFTConfig(steps=self.sft_steps, batch=self.sft_batch, lr=self.sft_lr, seed=self.sft_seed_of(seed))

    def sft_seed_of(self, seed: int) -> int:
        """The seed whose SFT'd policies run ``seed``'s RL starts from (here: its own; the study shares one)."""
        return seed

    def pool_seed_of(self, seed: int) -> int:
        """The seed of ``seed``'s RL prompt pool (:func:`rl_pool`; here: its own; the study shares one)."""
        return seed

    def task(self) -> ArithmeticTask:
        return ArithmeticTask(families=self.families)


#: The most rollouts a demo step may draw per policy (``prompts_per_step x group_size``; the defaults draw 128):
#: a CPU demo past it would run for days, and the trainer would only find out after the SFTs.
MAX_ROLLOUTS_PER_STEP = 4096
#: The most seeds one invocation runs (each seed runs every regime).
MAX_SEEDS = 1000


def check_settings(cfg: DemoConfig, what: str) -> None:
    """The flag-level checks of a demo or study (``what``), before any work: counts >= 1 (``--eval-k``: the
    rescue sets need sampled evaluations), at least one regime, each once, and the sizes bounded
    (:data:`MAX_ROLLOUTS_PER_STEP`, :data:`MAX_SEEDS`); a :class:`ValueError` naming the flag."""
    for key in ("seeds", "steps", "sft_steps", "prompts_per_step", "group_size", "eval_k", "pool_per_family",
                "max_new_tokens", "sft_batch"):
        v = getattr(cfg, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            extra = " (the rescue sets are the prompts a peer solves in its k samples)" if key == "eval_k" else ""
            raise ValueError(f"{what}: --{key.replace('_', '-')} must be an integer >= 1, got {v!r}{extra}")
    if isinstance(cfg.eval_every, bool) or not isinstance(cfg.eval_every, int) or cfg.eval_every < 0:
        raise ValueError(f"{what}: --eval-every must be an integer >= 0, got {cfg.eval_every!r}")
    if cfg.seeds > MAX_SEEDS:
        raise ValueError(f"{what}: --seeds {cfg.seeds} is more than {MAX_SEEDS} (each seed runs every regime)")
    rollouts = cfg.prompts_per_step * cfg.group_size
    if rollouts > MAX_ROLLOUTS_PER_STEP:
        raise ValueError(f"{what}: --prompts-per-step {cfg.prompts_per_step} x --group-size {cfg.group_size} = "
                         f"{rollouts} rollouts per step and policy, more than this CPU {what} runs "
                         f"({MAX_ROLLOUTS_PER_STEP}); lower --group-size or --prompts-per-step")
    if not cfg.regimes:
        raise ValueError(f"{what}: --regimes names no regime; give a comma-separated list, e.g. grpo,sgt")
    twice = sorted({r for i, r in enumerate(cfg.regimes) if r in cfg.regimes[:i]})
    if twice:
        raise ValueError(f"{what}: --regimes lists {twice} more than once (one run directory per regime)")


def rl_pool(task: ArithmeticTask, per_family: int, seed: int) -> list[Problem]:
    """The RL prompt pool of a seed: ``per_family`` training problems of each family (a seeded sample),
    families interleaved. The runs train on it and are evaluated on it: a policy's peer-exclusive
    prompts are the pool prompts only its peer solves at step 0 (the rescue set)."""
    groups = []
    for fam in task.family_names:
        probs = task.problems("train", [fam])
        groups.append(random.Random(f"demo-pool:{seed}:{fam}").sample(probs, min(per_family, len(probs))))
    n = min(len(g) for g in groups)
    return [g[i] for i in range(n) for g in groups] + [p for g in groups for p in g[n:]]


def heldout_set(task: ArithmeticTask, per_family: int | None) -> list[Problem]:
    """The held-out prompts every evaluation scores: ``per_family`` of each family's held-out split (a sample
    fixed across seeds, so seeds compare on the same prompts; None or more than the split: all of them)."""
    out = []
    for fam in task.family_names:
        probs = task.problems("eval", [fam])
        if per_family is not None and per_family < len(probs):
            keep = set(random.Random(f"demo-heldout:{fam}").sample(range(len(probs)), per_family))
            probs = [p for i, p in enumerate(probs) if i in keep]
        out.extend(probs)
    return out


def eval_set(cfg: DemoConfig, seed: int) -> list[Problem]:
    """What a run of ``seed`` is evaluated on: its RL pool (:func:`rl_pool`), then :func:`heldout_set`."""
    task = cfg.task()
    return rl_pool(task, cfg.pool_per_family, cfg.pool_seed_of(seed)) + heldout_set(task, cfg.heldout_per_family)


def norm_lr_groups(cfg: DemoConfig, arch: str) -> list[dict[str, Any]]:
    """``train.lr_groups`` of a policy of architecture ``arch``: the final norm first (its glob wins) at
    ``norm_lr`` (or ``lr``) out of SGT's term unless ``final_norm_sgt``, then every norm layer at ``norm_lr``
    (out of SGT's term too unless ``norm_sgt``)."""
    groups = []
    if not cfg.final_norm_sgt and cfg.norm_sgt:
        groups.append({"match": FINAL_NORM_GLOBS[arch], "lr": cfg.norm_lr or cfg.lr, "sgt": False})
    if cfg.norm_lr is not None:
        groups.append({"match": NORM_GLOBS[arch], "lr": cfg.norm_lr, **({} if cfg.norm_sgt else {"sgt": False})})
    return groups


def run_config(cfg: DemoConfig, regime: str, seed: int, policy_dirs: dict[str, str | Path]) -> dict[str, Any]:
    """The trainer config mapping (:func:`mrl_llm.config.config_from_mapping`) of one regime's run."""
    return {
        "name": f"demo-seed{seed}",
        "seed": seed,
        "steps": cfg.steps,
        "prompts_per_step": cfg.prompts_per_step,
        "threads": 1,
        "regime": {"name": regime,
                   "sgt": {"weight": cfg.sgt_weight, "successes_per_prompt": cfg.sgt_successes,
                           "selection": "shortest"},
                   "prp": {"peer_weight": 1.0, "ratio_cap": 2.0}},
        "loss": {"clip_low": 0.2, "clip_high": 0.28, "agg": "token-mean", "kl_coef": cfg.kl_coef},
        "eval": {"every": cfg.eval_every, "k": cfg.eval_k, "max_prompts": None, "max_new_tokens": cfg.max_new_tokens},
        "checkpoint_every": 0,
        "keep_checkpoints": 1,
        "tensorboard": False,
        "progress": False,
        "policies": [
            {"name": p.name, "model_dir": str(policy_dirs[p.name]), "template": dict(TEMPLATE), "engine": "hf",
             "dtype": "fp32", "group_size": cfg.group_size, "max_prompt_len": 32,
             "sampling": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": cfg.max_new_tokens,
                          "seeding": "sample"},
             "train": {"optimizer": "adamw", "lr": cfg.lr, "micro_batch": 64, "grad_clip": 1.0,
                       **({"lr_groups": groups} if (groups := norm_lr_groups(cfg, p.arch)) else {})}}
            for p in cfg.policies
        ],
    }
