"""``sampling.stop_at_newline``: the engine's extra stop ids (kept like EOS, nothing else changes), the newline ids
of a real vocabulary, the graded text (up to the first newline), and the policy's engine built with them."""

from __future__ import annotations

import pytest
import torch

from mrl_llm.config import PolicyConfig, SamplingSection
from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.rollout.base import graded_text, newline_token_ids
from shared_interfaces.config_io import ConfigError

NEWLINE = 5


class _Tok:
    """Id 5 decodes to a newline, 3 is EOS, 0 pad, the rest digits."""

    eos_token_id, pad_token_id = 3, 0

    def __len__(self):
        return 40

    def decode(self, ids, skip_special_tokens=True):
        return "".join("\n" if i == NEWLINE else str(i % 10) for i in ids if i not in (0, 3))

    def batch_decode(self, batch, skip_special_tokens=False):
        return [self.decode(r) for r in batch]


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():  # a newline likely enough to end many samples early
        m.lm_head.weight[NEWLINE] += 1.0
    return m.eval()


def test_a_stop_id_ends_a_sequence_like_eos_and_changes_nothing_before_it(model):
    prompts, sp = [[1, 7, 8], [1, 9]], SamplingConfig(temperature=0.8, max_new_tokens=10, seed=4)
    free = HFEngine(model, _Tok()).generate(prompts, 6, sp)
    eng = HFEngine(model, _Tok())
    eng.add_stop_ids(newline_token_ids(_Tok()))
    assert eng.eos_ids == [3, NEWLINE]
    stopped = eng.generate(prompts, 6, sp)
    n_cut = 0
    for f_group, s_group in zip(free, stopped, strict=True):
        for f, s in zip(f_group, s_group, strict=True):
            assert NEWLINE not in s.token_ids[:-1]
            k = len(s.token_ids)
            assert f.token_ids[:k] == s.token_ids  # the same draws, cut short (log-probs: other batches, float noise)
            assert f.logprobs[:k] == pytest.approx(s.logprobs, abs=1e-5)
            if s.token_ids[-1] == NEWLINE:
                assert s.finish_reason == "stop" and s.text.endswith("\n")
                n_cut += len(f.token_ids) > k
    assert n_cut > 0  # the fixture's newline bias makes some samples stop early


def test_newline_ids_of_a_real_vocabulary(shared_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(shared_dir / "tokenizers" / "qwen1.5")
    ids = newline_token_ids(tok)
    assert tok.convert_tokens_to_ids("Ċ") in ids and tok.convert_tokens_to_ids("ĊĊ") in ids  # "\n", "\n\n"
    assert all("\n" in tok.decode([i]) for i in ids) and len(ids) < len(tok) // 10
    assert tok.convert_tokens_to_ids("A") not in ids and tok.eos_token_id not in ids


def test_empty_cases():
    class NoNewline(_Tok):
        def decode(self, ids, skip_special_tokens=True):
            return "x" * len(ids)

    assert newline_token_ids(NoNewline()) == ()
    assert graded_text("", True) == "" == graded_text("", False)


def test_the_graded_text_ends_before_the_first_newline():
    assert graded_text("\\boxed{19}\nQ: What is 1+1?\nA: \\boxed{2}", True) == "\\boxed{19}"
    assert graded_text("\\boxed{19}\n}", True) == "\\boxed{19}"
    assert graded_text("a\nb", False) == "a\nb"
    assert graded_text("\nb", True) == ""


def test_the_setting_is_checked_and_reaches_the_policy_engine(model):
    from mrl_llm.rank.engine import make_rollout_engine

    with pytest.raises(ConfigError, match="sampling.stop_at_newline must be true or false, got 'yes'"):
        SamplingSection(stop_at_newline="yes")
    for flag, want in ((False, [3]), (True, [3, NEWLINE])):
        pol = PolicyConfig(name="p", model_config={"model_type": "qwen2"},
                           sampling=SamplingSection(stop_at_newline=flag))
        eng = make_rollout_engine(pol, model, _Tok(), seed=0, max_positions=128, engine_args={})
        assert eng.eos_ids == want
