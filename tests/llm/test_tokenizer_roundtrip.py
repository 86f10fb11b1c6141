"""A locally trained tokenizer saved beside a model keeps its tokenization when the folder is reloaded."""

from __future__ import annotations

import pytest

from mrl_llm.models import _load_tokenizer_cached, load_tokenizer_dir
from tests.thl.tiny_tokenizers import byte_level_bpe, metaspace

TEXT = "What is 12+7?\n\\boxed{19} the answer"


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
@pytest.mark.parametrize("make", [byte_level_bpe, metaspace], ids=["bytebpe", "metaspace"])
def test_tokenizer_in_a_model_folder_round_trips(tmp_path, model_type, make):
    from transformers import AutoConfig

    tok = make()
    want = tok(TEXT).input_ids
    tok.save_pretrained(tmp_path)
    AutoConfig.for_model(model_type, vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2).save_pretrained(tmp_path)
    _load_tokenizer_cached.cache_clear()
    got = load_tokenizer_dir(tmp_path)
    assert got(TEXT).input_ids == want
    assert got.decode(want, skip_special_tokens=True) == tok.decode(want, skip_special_tokens=True)
