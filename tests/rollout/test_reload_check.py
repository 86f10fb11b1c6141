"""The reload check (:func:`mrl_llm.rollout.drift.reload_check`, issue 38 item 5): after one AdamW update at lr 1e-6
a bf16 engine over its own copy of the fp32 masters (a k > 1 rank's HF rollout copy) is checked against the trainer's
movement, not against a fixed threshold: a reload that did nothing is caught at that very sync — where the sample
check's 0.05 nats cannot see it — and a reload that worked passes."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mrl_llm.precision import Precision
from mrl_llm.rank.engine import RankEngine
from mrl_llm.rollout import DriftConfig, DriftError, HFEngine
from mrl_llm.rollout.drift import check_drift, reload_check, reload_probe
from tests.rollout.test_engine_support import _Tok


def _masters():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).float()


def _update(model: torch.nn.Module, lr: float = 1e-6) -> None:
    """One AdamW step on the masters (every weight moves by ~lr)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    ids = torch.randint(4, 64, (4, 12), generator=torch.Generator().manual_seed(1))
    with Precision("bf16").autocast("cpu"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()


def _rank_engine(on_exceed: str = "stop") -> RankEngine:
    trained = _masters()
    rollout = copy.deepcopy(trained)  # a k > 1 rank's rollout copy: weights of its own
    return RankEngine(HFEngine(rollout, _Tok()), trained=trained, rollout=rollout, precision=Precision("bf16"),
                      device=torch.device("cpu"), drift=DriftConfig(on_exceed=on_exceed, max_new_tokens=8))


def test_a_correct_reload_passes_and_moves_with_the_trainer():
    re = _rank_engine()
    _update(re.trained)
    re.sync()
    r = re.last_reload
    assert r is not None and not r.exceeded and r.n_tokens == 16
    assert r.move > 1e-4  # one lr-1e-6 update moves the bf16 probe well above the floor ...
    assert r.err <= 1e-6, r  # ... and the reloaded copy moved exactly as the trainer did
    assert re.drift_metrics()["drift_reload_err"] == r.err


def test_a_reload_that_did_nothing_is_caught_at_that_sync(monkeypatch):
    import mrl_llm.rank.engine as engine_mod

    re = _rank_engine()
    _update(re.trained)
    monkeypatch.setattr(engine_mod, "gather_into", lambda trained, rollout: 0)  # the sync copies nothing
    # the sample check's 0.05 nats cannot tell the stale bf16 copy from the fp32 masters
    with Precision("bf16").autocast("cpu"):
        assert not check_drift(re.engine, re.trained, [[1, 5, 6], [1, 9]], DriftConfig(), pad_id=0).exceeded
    with pytest.raises(DriftError, match=r"the HF engine's rollout copy of this rank did not take weight sync"):
        re.sync()
    warn = _rank_engine("warn")
    _update(warn.trained)
    warn.sync()
    assert warn.last_reload.exceeded and warn.last_reload.err == pytest.approx(warn.last_reload.move)


def test_the_hf_engine_over_the_masters_has_nothing_to_reload():
    trained = _masters()
    re = RankEngine(HFEngine(trained, _Tok()), trained=trained, rollout=trained, precision=Precision("bf16"),
                    device=torch.device("cpu"), drift=DriftConfig())
    assert not re.reloads and re.reference is None
    _update(trained)
    re.sync()
    assert re.last_reload is None and re.drift_metrics() == {}


def test_reload_check_bounds_and_refusals():
    cfg = DriftConfig(reload_floor=1e-3)
    one = [[-1.0, -2.0]]
    # nothing moved, nothing to see: passes at any err below the floor
    assert not reload_check(one, [[-1.0005, -2.0]], one, one, cfg).exceeded
    with pytest.raises(DriftError, match="did not take weight sync v3"):  # engine still, trainer moved 0.1
        reload_check(one, one, one, [[-1.1, -2.1]], cfg, version=3)
    assert not reload_check(one, [[-1.1, -2.1]], one, [[-1.12, -2.08]], cfg).exceeded  # within half the movement
    # a low-precision engine of its own weights: the right size of movement in its own direction passes, none fails
    moved = [[-1.1, -2.1]]
    lowp = reload_check(one, [[-0.95, -2.06]], one, moved, cfg, exact=False)
    assert not lowp.exceeded and not lowp.exact and lowp.engine_move == pytest.approx(0.055)
    with pytest.raises(DriftError, match=r"moved 0 nats per token where the trainer's moved 0.1"):
        reload_check(one, one, one, moved, cfg, exact=False, version=4)
    assert not reload_check(one, one, one, [[-1.0004, -2.0]], cfg, exact=False).exceeded  # below the floor
    with pytest.raises(DriftError, match="not all finite"):
        reload_check(one, [[math.nan, -2.0]], one, [[-1.1, -2.1]], cfg)
    with pytest.raises(ValueError, match="ref_new holds 1 log-probs, the others 2"):
        reload_check(one, one, one, [[-1.0]], cfg)
    with pytest.raises(ValueError, match="the probe has no tokens"):
        reload_check([], [], [], [], cfg)
    with pytest.raises(ValueError, match="reload_floor must be > 0"):
        DriftConfig(reload_floor=0)


def test_the_reload_probe_is_the_same_in_every_process_and_within_the_vocabulary():
    a, b = reload_probe(50, DriftConfig()), reload_probe(50, DriftConfig())
    assert a == b and len(a.prompts) == 2 and all(len(r) == 8 for r in a.responses)
    assert all(0 <= t < 50 for row in a.prompts + a.responses for t in row)
    assert reload_probe(50, DriftConfig(seed=7)) != a
    with pytest.raises(ValueError, match="vocab_size must be >= 1"):
        reload_probe(0, DriftConfig())
