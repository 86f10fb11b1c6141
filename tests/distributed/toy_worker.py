"""A small real policy worker for the runtime tests: a tabular softmax policy over arms per prompt.

It keeps the worker contract of :mod:`mrl_llm.distributed.actors` with a torch model, an Adam optimizer,
behaviour log-probs recorded at sampling, and the core's :func:`regime_loss` on the core's rows (:class:`~shared_interfaces.regimes.rows.LearnerRows`:
own rows, PRP peer rows with their behaviour correction, SGT targets) — so the Ray
runtime is tested on real updates without the cost of a transformer. Arm ``prompt % n_arms`` is
correct; policy competence comes from ``config["good_on"]`` (prompt parity where it starts good).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from shared_interfaces.losses import regime_loss
from shared_interfaces.records import ExperienceRecord, make_record_id
from shared_interfaces.regimes.config import LossConfig
from shared_interfaces.regimes.rows import LearnerRows


class ToyWorker:
    def __init__(self, name: str, config: dict[str, Any], seed: int) -> None:
        self.name = name
        self.n_prompts = int(config.get("n_prompts", 8))
        self.n_arms = int(config.get("n_arms", 5))
        self.group_size = int(config.get("group_size", 4))
        self.seed = seed
        g = torch.Generator().manual_seed(seed * 1000 + sum(name.encode()))
        theta = torch.randn(self.n_prompts, self.n_arms, generator=g, dtype=torch.float64)
        good = int(config.get("good_on", 0))
        for x in range(self.n_prompts):
            theta[x, x % self.n_arms] += 3.0 if x % 2 == good else -3.0
        self.theta = torch.nn.Parameter(theta)
        self.opt = torch.optim.Adam([self.theta], lr=float(config.get("lr", 0.1)))
        self.version = 0
        self.loss_cfg = LossConfig()

    def _logp(self) -> torch.Tensor:
        return torch.log_softmax(self.theta, dim=-1)

    def generate(self, problems: list[Any], step: int) -> list[ExperienceRecord]:
        g = torch.Generator().manual_seed(self.seed * 7919 + step * 31 + sum(self.name.encode()))
        with torch.no_grad():
            logp = self._logp()
        out = []
        for pid in problems:
            x = int(str(pid).lstrip("p"))
            arms = torch.multinomial(logp[x].exp(), self.group_size, replacement=True, generator=g)
            for i, a in enumerate(arms.tolist()):
                out.append(ExperienceRecord(
                    record_id=make_record_id(self.name, step, str(pid), i), policy_id=self.name,
                    policy_version=self.version, step=step, prompt_id=str(pid), sample_index=i,
                    prompt_text=f"prompt {x}", response_text=f"arm {a}", token_ids=(a,),
                    token_logprobs=(min(0.0, float(logp[x, a])),), tokenizer_id="arms",
                    reward=1.0 if a == x % self.n_arms else 0.0, verified=True, verifier="table",
                    finish_reason="stop",
                ))
        return out

    def train_step(self, rows: LearnerRows) -> dict[str, float]:
        if not len(rows):
            return {"loss": 0.0, "rows": 0.0}
        recs = rows.row_records()
        x = torch.tensor([int(r.prompt_id.lstrip("p")) for r in recs])
        a = torch.tensor([r.token_ids[0] for r in recs])
        old = self._logp().detach()[x, a].unsqueeze(-1)
        mu = torch.tensor([r.token_logprobs[0] for r in recs], dtype=torch.float64).unsqueeze(-1)
        coef = rows.behaviour_coef(old, mu)
        logp = self._logp()[x, a].unsqueeze(-1)
        out = regime_loss(logp, old, rows.advantages, rows.pg_mask.unsqueeze(-1), self.loss_cfg, behaviour_coef=coef,
                          sample_weight=rows.sample_weight, sgt_mask=rows.sgt_mask.unsqueeze(-1),
                          sgt_weight=rows.sgt_weight)
        self.opt.zero_grad()
        out.loss.backward()
        self.reduce_grads()
        self.opt.step()
        self.version += 1
        own = [r.reward for r, o in zip(recs, (rows.own_mask & rows.pg_mask).tolist(), strict=True) if o]
        return {"loss": float(out.loss.detach()), "rows": float(len(rows)), "reward": sum(own) / max(1, len(own)),
                "accuracy": self.accuracy()}

    def reduce_grads(self) -> None:
        """Nothing for one process (a worker group's ranks average theirs, :mod:`.toy_group_worker`)."""

    def accuracy(self) -> float:
        with torch.no_grad():
            p = self._logp().exp()
        return float(sum(p[x, x % self.n_arms] for x in range(self.n_prompts)) / self.n_prompts)

    def save_checkpoint(self, path: str) -> None:
        torch.save({"theta": self.theta.detach().clone(), "opt": self.opt.state_dict(), "version": self.version},
                   Path(path) / "toy.pt")

    def load_checkpoint(self, path: str) -> None:
        st = torch.load(Path(path) / "toy.pt", weights_only=True)
        with torch.no_grad():
            self.theta.copy_(st["theta"])
        self.opt.load_state_dict(st["opt"])
        self.version = int(st["version"])

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "theta": self.theta.detach().flatten().tolist()}


def build(name: str, config: dict[str, Any], seed: int) -> ToyWorker:
    return ToyWorker(name, config, seed)
