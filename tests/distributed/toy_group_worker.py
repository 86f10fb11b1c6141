"""The toy worker as one rank of a worker group (``config["group"]``, :mod:`mrl_llm.parallel.group`): every
rank holds the full table and trains on the step's rows; the gradients are averaged over the ranks (a gloo
all-reduce, so a rank that dies leaves the others in a collective, as an FSDP rank would), which makes k
ranks' update bit-identical to one rank's (each rank's gradient is the same; ``(g + g) / 2 == g``). Rank 0
writes the checkpoint. It counts the records its peer-claim check is given (``checked_<policy>`` metrics)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from tests.distributed.toy_worker import ToyWorker


class ToyGroupWorker(ToyWorker):
    def __init__(self, name: str, config: dict[str, Any], seed: int) -> None:
        super().__init__(name, config, seed)
        g = config.get("group")
        self.group = WorkerGroup.join(GroupSpec(**g) if g else GroupSpec(rank=0, world_size=1))
        self.checked: dict[str, int] = {}  # producer -> records given to check_peer_records since the last update

    def prepare(self, problems: list[Any]) -> None:
        """The actor's hook for ranks that do not sample (nothing to keep: no peer-claim check here)."""

    def check_peer_records(self, records: list[Any]) -> dict[str, str]:
        """The actor's peer-claim check: keeps every record, counts them by producer for ``train_step``'s metrics."""
        for r in records:
            self.checked[r.policy_id] = self.checked.get(r.policy_id, 0) + 1
        return {}

    def train_step(self, rows: Any) -> dict[str, float]:
        checked, self.checked = self.checked, {}
        return {**super().train_step(rows), **{f"checked_{p}": float(n) for p, n in checked.items()}}

    def reduce_grads(self) -> None:
        if self.group.sharded:
            dist.all_reduce(self.theta.grad)
            self.theta.grad /= self.group.world_size

    def save_checkpoint(self, path: str) -> None:
        if self.group.rank == 0:
            super().save_checkpoint(path)

    def close(self) -> None:
        self.group.close()


def build(name: str, config: dict[str, Any], seed: int) -> ToyGroupWorker:
    return ToyGroupWorker(name, config, seed)
