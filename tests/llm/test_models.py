"""Building a policy's model (:func:`mrl_llm.models.build_model`): dropout is off whatever the config says."""

from __future__ import annotations

import pytest
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


def test_saving_and_loading_a_policy_print_no_progress_bar_and_leave_the_setting_as_it_was(tmp_path, capfd):
    """A checkpoint's save inside the step loop, or a local model directory loaded by a policy that joins or
    rejoins mid-run, would print transformers' "Writing model shards" / "Loading weights" bar across the run's
    step bar (transformers 5): they are off for the save and the load and back as they were after, on or off."""
    from transformers.utils import logging as hf_logging

    from mrl_llm.byte_tokenizer import byte_tokenizer
    from mrl_llm.config import PolicyConfig
    from mrl_llm.models import hf_progress_bars_off, load_policy, save_policy

    tok = byte_tokenizer()
    model = build_model(PolicyConfig(name="a", model_config=tiny("llama", num_hidden_layers=1)), tok, seed=0)
    was_on = hf_logging.is_progress_bar_enabled()
    try:
        for on in (True, False):
            (hf_logging.enable_progress_bar if on else hf_logging.disable_progress_bar)()
            save_policy(model, tok, tmp_path / f"p{on}", {"name": "a"})
            assert hf_logging.is_progress_bar_enabled() is on
            assert "Writing model shards" not in capfd.readouterr().err
            loaded, _, meta = load_policy(tmp_path / f"p{on}")
            assert meta["name"] == "a" and hf_logging.is_progress_bar_enabled() is on
            assert "Loading weights" not in capfd.readouterr().err
            torch.testing.assert_close(loaded.state_dict(), model.state_dict())
        hf_logging.enable_progress_bar()
        with pytest.raises(OSError, match="disk full"), hf_progress_bars_off():  # back on after an error too
            assert not hf_logging.is_progress_bar_enabled()
            raise OSError("disk full")
        assert hf_logging.is_progress_bar_enabled()
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()


def test_an_empty_tokenizer_folder_is_named_without_the_install_sentencepiece_advice(tmp_path):
    """transformers answers an empty folder with advice to install sentencepiece or tiktoken."""
    from mrl_llm.models import ModelLoadError, load_tokenizer_dir

    with pytest.raises(ModelLoadError, match=r"policy 'a': .* holds no tokenizer files \(tokenizer\.json, .*\); point "
                                             r"it at a folder written by a tokenizer's save_pretrained") as err:
        load_tokenizer_dir(tmp_path, who="policy 'a'")
    assert "sentencepiece" not in str(err.value)
