"""The reload check on a real bf16 vLLM CPU engine (issue 38 items 5 and 6): fp32 masters, one AdamW update at lr
1e-6 — far below the bf16 engine's noise against the masters — then a sync. A sync that loads the weights (in
the engine's dtype) passes the reload check; a sync that loads nothing is caught at that very sync.

Skipped when vLLM is not importable, unless ``MRL_REQUIRE_VLLM=1`` (CI)."""

from __future__ import annotations

import copy

import pytest
import torch

from mrl_llm.precision import Precision
from mrl_llm.rank.engine import RankEngine
from mrl_llm.rollout import DriftConfig, DriftError, make_engine
from tests.llm.helpers import require_vllm
from tests.rollout.test_vllm_engine import model, tokenizer  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _update(m: torch.nn.Module) -> None:
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6, weight_decay=0.0)
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
    with Precision("bf16").autocast("cpu"):
        m(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def test_a_bf16_vllm_engine_reload_is_checked_against_the_trainers_movement(model, tokenizer, monkeypatch):  # noqa: F811
    require_vllm()
    masters = copy.deepcopy(model).train()
    eng = make_engine("vllm", model=masters, tokenizer=tokenizer, dtype="bfloat16", seed=0, max_model_len=128,
                      engine_args={"kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 16})
    try:
        re = RankEngine(eng, trained=masters, rollout=masters, precision=Precision("bf16"),
                        device=torch.device("cpu"), drift=DriftConfig(on_exceed="stop", threshold=0.5))
        assert re.reloads
        _update(masters)
        re.sync()
        ok = re.last_reload
        assert not ok.exceeded and ok.move > 1e-5, ok
        _update(masters)
        monkeypatch.setattr(eng, "sync_weights", lambda model, state=None: None)  # a reload that loads nothing
        with pytest.raises(DriftError, match="this rank's VLLMEngine did not take weight sync v2"):
            re.sync()
    finally:
        eng.close()
