"""The HF engine's batch (:mod:`mrl_llm.rollout.hf_engine`, :mod:`mrl_llm.rollout.hf_batch`): per-row streams
kept from the engine before the on-device draw (``tests/fixtures/hf_engine/row_seeds.json``, captured from it),
call-seeded draws that follow the softmax, last-position prefill logits, finished rows leaving the batch,
waiting rows refilling it, and a batch sized from memory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mrl_llm.rollout import HFEngine, SamplingConfig
from mrl_llm.rollout.hf_batch import SAMPLING_BYTES_PER_VOCAB, rows_that_fit, sequence_bytes
from mrl_llm.rollout.hf_engine import inverse_cdf, top_p_filter
from tests.rollout.test_hf_engine import _Tok

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_engine" / "row_seeds.json"


def _model():
    """The fixture's model (the same construction as when it was captured)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                      eos_token_id=3, bos_token_id=1, pad_token_id=0, tie_word_embeddings=False)
    m = Qwen2ForCausalLM(cfg).float()
    with torch.no_grad():
        m.lm_head.weight[3] += 0.5
    return m.eval()


@pytest.fixture(scope="module")
def model():
    return _model()


def _eos_at(schedule: list[int]):
    """A logits hook making row ``k`` end with EOS (id 3) after ``schedule[k]`` tokens, never before."""
    sched = torch.tensor(schedule)

    def hook(rows, steps, logits):
        logits = logits.clone()
        logits[:, 3] = float("-inf")
        end = steps + 1 == sched[rows]
        logits[end] = float("-inf")
        logits[end, 3] = 0.0
        return logits

    return hook


def _decode_batches(model, engine, prompts, n, sp) -> tuple[list, list[int], list[int]]:
    """The samples, the batch size of every forward that decodes one token, and of every prefill."""
    decode, prefill = [], []

    def pre(_, args, kwargs):
        ids = kwargs["input_ids"]
        (decode if ids.shape[1] == 1 and kwargs.get("past_key_values") is not None else prefill).append(ids.shape[0])
        if kwargs.get("past_key_values") is not None and ids.shape[1] == 1:
            assert kwargs["past_key_values"].layers[0].keys.shape[0] == ids.shape[0]

    h = model.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        out = engine.generate(prompts, n, sp)
    finally:
        h.remove()
    return out, decode, prefill


@pytest.mark.parametrize("max_batch_size", [1, 4, 64])
def test_row_seeded_samples_equal_the_engine_before_the_on_device_draw(model, max_batch_size):
    """Same tokens and finish reasons; log-probs equal up to float32 rounding (the forwards' shapes differ:
    last-position logits, fewer rows)."""
    fx = json.loads(FIXTURE.read_text())
    for case in fx["cases"]:
        sp = SamplingConfig(temperature=case["temperature"], top_p=case["top_p"],
                            max_new_tokens=case["max_new_tokens"], row_seeds=tuple(case["row_seeds"]))
        out = HFEngine(model, _Tok(), max_batch_size=max_batch_size).generate(fx["prompts"], fx["n"], sp)
        got = [[(list(s.token_ids), s.finish_reason) for s in o] for o in out]
        assert got == [[(r["token_ids"], r["finish_reason"]) for r in o] for o in case["samples"]]
        for o, ro in zip(out, case["samples"], strict=True):
            for s, r in zip(o, ro, strict=True):
                assert s.logprobs == pytest.approx(r["logprobs"], abs=2e-6, rel=0)


def _chi2_critical(dof: int, z: float = 3.09) -> float:
    """The chi-square quantile at ``Phi(z)`` (z = 3.09: p = 0.001), Wilson-Hilferty."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("seed", [None, 5])
def test_call_seeded_draws_follow_the_softmax(model, seed):
    """``seeding: call`` now derives one generator per sequence from the call's seed (a new stream): the
    first tokens of 6,000 copies of a prompt pass a chi-square test against softmax(logits / T) within top-p,
    and no token outside the nucleus is drawn."""
    prompt, rows, temp, top_p = [1, 5, 6, 7], 6000, 0.7, 0.95
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1:] / temp, -1)
    probs = top_p_filter(logp, top_p).exp()[0].double()
    probs = probs / probs.sum()
    out = HFEngine(model, _Tok(), max_batch_size=1024).generate(
        [prompt], rows, SamplingConfig(temperature=temp, top_p=top_p, max_new_tokens=1, seed=seed))[0]
    counts = torch.bincount(torch.tensor([s.token_ids[0] for s in out]), minlength=40).double()
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    expected = rows * probs[kept]
    chi2 = float(((counts[kept] - expected) ** 2 / expected).sum())
    assert chi2 < _chi2_critical(int(kept.sum()) - 1), chi2
    lp = {s.token_ids[0]: s.logprobs[0] for s in out}
    for t, v in lp.items():  # the recorded log-prob is the full-vocabulary one, not the nucleus'
        assert v == pytest.approx(float(logp[0, t]), abs=1e-5)


def test_same_call_seed_same_samples_whatever_the_batch(model):
    sp = SamplingConfig(max_new_tokens=10, seed=11)
    prompts = [[1, 5, 6, 7], [1, 9], [1, 11, 12]]
    a, b = (HFEngine(model, _Tok(), max_batch_size=m).generate(prompts, 3, sp) for m in (2, 64))
    assert [[s.token_ids for s in o] for o in a] == [[s.token_ids for s in o] for o in b]


def test_prefill_computes_logits_at_the_last_position_only(model):
    seen = []
    h = model.lm_head.register_forward_hook(lambda _m, args, _o: seen.append(tuple(args[0].shape)))
    try:
        HFEngine(model, _Tok()).generate([[1, 5, 6, 7, 8, 9], [1, 2]], 2, SamplingConfig(max_new_tokens=3, seed=1))
    finally:
        h.remove()
    assert seen and all(s[1] == 1 for s in seen), seen


def test_a_forward_without_logits_to_keep_gets_the_last_hidden_state_through_the_head(model):
    class NoKeep(type(model)):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=None):
            return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                   past_key_values=past_key_values, use_cache=use_cache)

    plain = NoKeep(model.config)
    plain.load_state_dict(model.state_dict())
    plain.eval()
    seen = []
    h = plain.lm_head.register_forward_hook(lambda _m, args, _o: seen.append(tuple(args[0].shape)))
    prompts, sp = [[1, 5, 6, 7, 8, 9], [1, 2]], SamplingConfig(max_new_tokens=5, row_seeds=(1, 2, 3, 4))
    try:
        got = HFEngine(plain, _Tok()).generate(prompts, 2, sp)
    finally:
        h.remove()
    assert seen and all(len(s) == 2 or s[1] == 1 for s in seen), seen  # [B, h] at the prefill, [B, 1, h] after
    want = HFEngine(model, _Tok()).generate(prompts, 2, sp)
    assert [[s.token_ids for s in o] for o in got] == [[s.token_ids for s in o] for o in want]


def test_a_model_without_last_position_logits_is_refused():
    class Bare(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Linear(2, 2)

        def forward(self, input_ids, attention_mask=None):
            return self.w(input_ids.float())

    with pytest.raises(ValueError, match="Bare: its forward takes no logits_to_keep .* pass a transformers causal LM"):
        HFEngine(Bare(), _Tok())


def test_finished_rows_leave_the_batch_and_its_cache(model):
    schedule = [1, 2, 3, 9, 9, 9]  # sequence k ends with EOS after schedule[k] tokens
    eng = HFEngine(model, _Tok(), max_batch_size=64, logits_hook=_eos_at(schedule))
    out, decode, prefill = _decode_batches(model, eng, [[1, 5], [1, 6, 7]], 3,
                                           SamplingConfig(max_new_tokens=12, seed=2))
    assert [len(s.token_ids) for o in out for s in o] == schedule
    assert all(s.finish_reason == "stop" and s.token_ids[-1] == 3 for o in out for s in o)
    assert prefill == [2]  # the two prompts, each once (shared prefill, test_hf_engine_shared_prompts.py)
    assert decode == [5, 4, 3, 3, 3, 3, 3, 3]  # one row less after each of the first three ends


def test_waiting_sequences_refill_the_freed_rows(model):
    """Two rows in flight, five sequences: a row that ends is refilled while the other one runs, and the
    samples equal those of one batch holding all five."""
    schedule = [2, 8, 1, 3, 2]
    prompts, sp = [[1, 5], [1, 6, 7], [1, 8, 9, 10], [1, 2, 4], [1, 9]], SamplingConfig(max_new_tokens=12, seed=4)
    eng = HFEngine(model, _Tok(), max_batch_size=2, logits_hook=_eos_at(schedule))
    out, decode, prefill = _decode_batches(model, eng, prompts, 1, sp)
    assert [len(o[0].token_ids) for o in out] == schedule
    assert prefill == [2, 1, 1, 1] and max(decode) <= 2
    assert len(decode) + len(prefill) < 3 * max(schedule)  # fixed batches of two would decode to each pair's longest
    whole = HFEngine(model, _Tok(), max_batch_size=64, logits_hook=_eos_at(schedule)).generate(prompts, 1, sp)
    for a, b in zip(out, whole, strict=True):
        assert a[0].token_ids == b[0].token_ids
        assert a[0].logprobs == pytest.approx(b[0].logprobs, abs=1e-5)


def test_the_batch_is_sized_from_memory(model, monkeypatch):
    per = sequence_bytes(model, 4, 12)
    # 2 x 1 KV head x 16 dims x 2 layers x 4 bytes x 16 positions; the sampling bound; one layer's prefill
    assert per == 2 * 2 * 1 * 16 * 4 * 16 + SAMPLING_BYTES_PER_VOCAB * 40 + 4 * 4 * (4 * 32 + 2 * 64) + 4 * 2 * 16
    assert rows_that_fit(model, 4, 12, cap=64, free=2 * 3 * per + 1) == 3
    assert rows_that_fit(model, 4, 12, cap=2, free=2 * 3 * per) == 2
    with pytest.raises(MemoryError, match="cannot fit one sequence of 4 \\+ 12 positions.*lower sampling.max_new"):
        rows_that_fit(model, 4, 12, cap=64, free=per)
    import mrl_llm.rollout.hf_batch as hb

    monkeypatch.setattr(hb, "free_bytes", lambda _device: 2 * 3 * per + 1)
    eng = HFEngine(model, _Tok(), max_batch_size=64, logits_hook=_eos_at([12] * 8))
    _, decode, prefill = _decode_batches(model, eng, [[1, 5, 6, 7]], 8, SamplingConfig(max_new_tokens=12, seed=1))
    assert max(prefill + decode) == 3


def test_empty_cases(model):
    eng = HFEngine(model, _Tok())
    assert eng.generate([], 4, SamplingConfig(seed=1)) == []
    assert eng.generate([], 1, SamplingConfig(row_seeds=())) == []
    assert inverse_cdf(torch.zeros((0, 40)), torch.zeros(0)).shape == (0,)


def test_a_sliding_window_cache_drops_rows_and_refills_only_an_empty_batch():
    """A cache of sliding-window layers is not merged: finished rows still leave it, and the next group is
    admitted when the batch is empty; the samples equal one batch's."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mrl_llm.rollout.hf_batch import mergeable

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, max_position_embeddings=128, eos_token_id=3, pad_token_id=0,
                      use_sliding_window=True, sliding_window=4, layer_types=["sliding_attention"] * 2)
    m = Qwen2ForCausalLM(cfg).eval()
    assert not mergeable(m(torch.tensor([[1, 2]]), use_cache=True).past_key_values)
    schedule = [2, 8, 1, 3, 2]
    prompts, sp = [[1, 5], [1, 6, 7], [1, 8, 9, 10], [1, 2, 4], [1, 9]], SamplingConfig(max_new_tokens=12, seed=4)
    out, decode, prefill = _decode_batches(m, HFEngine(m, _Tok(), max_batch_size=2, logits_hook=_eos_at(schedule)),
                                           prompts, 1, sp)
    assert prefill == [2, 2, 1] and decode == [2] + [1] * 9
    whole = HFEngine(m, _Tok(), max_batch_size=64, logits_hook=_eos_at(schedule)).generate(prompts, 1, sp)
    assert [o[0].token_ids for o in out] == [o[0].token_ids for o in whole]
    assert [len(o[0].token_ids) for o in out] == schedule
