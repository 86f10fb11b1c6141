"""Building a policy's model (:func:`mrl_llm.models.build_model`): dropout is off whatever the config says."""

from __future__ import annotations

import torch

from mrl_llm.models import build_model, load_tokenizer
from tests.llm.helpers import tiny


def test_a_policy_model_is_built_with_dropout_off(caplog):
    """GPT-2's config has dropout 0.1 and Llama's ``attention_dropout`` is a float on each attention module:
    both are off in the built policy, so two train-mode forwards agree (as the update's must with the engine's
    and the reference's eval-mode ones); a model without dropout is left alone (0 modules)."""
    import logging

    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import disable_dropout

    gpt2 = {"model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
    llama = tiny("llama", attention_dropout=0.3)
    x = torch.randint(0, 200, (2, 9))
    for cfg, name in ((gpt2, "g"), (llama, "l")):
        pol = PolicyConfig(name=name, model_config=cfg, tokenizer_dir="utf8-bytes", device="cpu")
        with caplog.at_level(logging.INFO, logger="mrl_llm.models"):
            model = build_model(pol, load_tokenizer(pol), seed=0)
        assert model.training and torch.equal(model(x).logits, model(x).logits)
        assert f"policy {name}: dropout off in" in caplog.text
        assert all(v == 0.0 for k, v in vars(model.config).items() if "drop" in k and isinstance(v, float))
        assert disable_dropout(model) == 0  # nothing left to switch off
    assert disable_dropout(torch.nn.Module()) == 0 and disable_dropout(torch.nn.Dropout(0.0)) == 0
    assert disable_dropout(torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Dropout(0.1))) == 2
