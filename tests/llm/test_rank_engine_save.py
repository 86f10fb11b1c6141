"""Every rank of a worker group writes the model directory its own vLLM engine starts from
(:func:`mrl_llm.rollout.vllm_engine.save_on_this_process`): inside a ``torch.distributed`` group transformers'
``save_pretrained`` writes only on rank 0, which left rank 1's engine without a ``config.json``. Two spawned
gloo ranks, no vLLM needed."""

from __future__ import annotations

from pathlib import Path

import torch

from mrl_llm.parallel.group import GroupSpec, WorkerGroup
from tests.llm.parallel_ranks import rank_done, tiny_model


def save_rank_main(rank: int, spec: GroupSpec, out: str) -> None:
    """One rank: join the group, save :func:`tiny_model` to ``out/rank<r>``; the model is left unpatched. The rank
    leaves the group only after its work succeeded (leaving is a collective)."""
    from mrl_llm.rollout.vllm_engine import save_on_this_process

    torch.set_num_threads(1)
    group = WorkerGroup.join(spec.for_rank(rank))
    d = Path(out) / f"rank{rank}"
    d.mkdir(parents=True)
    model = tiny_model()
    save_on_this_process(model, d)
    assert "should_save_on_this_rank" not in model.__dict__
    group.close()
    rank_done()


def test_every_rank_saves_its_own_copy_for_its_engine(tmp_path):
    import torch.multiprocessing as mp

    from mrl_llm.parallel.group import rendezvous

    addr, port = rendezvous("127.0.0.1")
    spec = GroupSpec(rank=0, world_size=2, addr=addr, port=port, backend="gloo", timeout_s=120)
    mp.spawn(save_rank_main, args=(spec, str(tmp_path)), nprocs=2, join=True)
    for r in (0, 1):
        assert (tmp_path / f"rank{r}" / "config.json").is_file() and (tmp_path / f"rank{r}" / "model.safetensors").is_file()
