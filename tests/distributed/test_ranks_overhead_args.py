"""``experiments/bench/ranks_overhead.py``'s arguments: the FSDP units it measures, empty and malformed lists refused
before any run starts; each k-rank config carries the unit and per-sample seeds."""

from __future__ import annotations

import pytest

from experiments.bench.ranks_overhead import main, with_ranks


@pytest.mark.parametrize("units", ["", " , ", "layer,block"])
def test_an_empty_or_unknown_unit_list_is_refused(units):
    with pytest.raises(SystemExit, match="--fsdp-units must list 'layer' and/or 'model'"):
        main(["--fsdp-units", units])


def test_the_k_rank_config_carries_ranks_unit_and_per_sample_seeds():
    from mrl_llm.config import config_from_mapping
    from tests.llm.helpers import tiny

    cfg = config_from_mapping({"policies": [{"name": "a", "model_config": tiny("llama"), "tokenizer_dir": "utf8-bytes"}]})
    p = with_ranks(cfg, 2, "model").policies[0]
    assert (p.ranks, p.train.fsdp_unit, p.sampling.seeding) == (2, "model", "sample")
