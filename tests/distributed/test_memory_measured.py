"""The planner against what runs: the peak RSS growth of an HF sampling call and of one update of a tiny-width policy
with a real vocabulary (Qwen2, hidden 64, 2 layers, 151,936 ids; random ids, no tokenizer) is within 0.8-1.5x of the
planner's terms for it (:func:`experiments.gpu.smoke_checks.planned`, without the process overhead). Each phase runs
in a fresh interpreter (:func:`experiments.gpu.smoke_checks.rss_growth`), measured from the resident size when the
phase begins (the model, its optimizer and the batch already built).

The shapes are chosen so that the terms under test dominate: the real vocabulary makes the logits, the gradients and
AdamW's state (``12 N`` plus the step's ``4 N``) most of the update, and the logits and their fp32 working copies most
of the sampling. Prompts are one token long: the planner counts the HF engine's prefill logits at the last position
only (an engine that computes them at every prompt position holds ``B P V e`` more)."""

from __future__ import annotations

import pytest

from experiments.gpu.smoke_checks import ProbeSize, planned, rss_growth, run_phase

LOW, HIGH = 0.8, 1.5


def _ratio(phase: str, size: ProbeSize) -> float:
    got = rss_growth(phase, size, timeout=600)
    want = planned(size)[phase]
    assert got.get("sample_tokens", 0) + got.get("train_tokens", 0) > 0
    return got["growth_bytes"] / want


@pytest.mark.slow
@pytest.mark.parametrize("dtype, chunk", [("fp32", 0), ("bf16", 32)])
def test_update_peak_rss_growth_is_what_the_planner_counts(dtype: str, chunk: int) -> None:
    # gradients + AdamW moments + max(casts + activations + logits, the step's sqrt(v)) of one update
    size = ProbeSize(dtype=dtype, rows=8, prompt_len=4, response_len=16, micro_batch=8, logprob_chunk=chunk)
    ratio = _ratio("update", size)
    assert LOW <= ratio <= HIGH, f"update ({dtype}, chunk {chunk}): measured / planned = {ratio:.2f}"


@pytest.mark.slow
def test_hf_sampling_peak_rss_growth_is_what_the_planner_counts() -> None:
    # KV cache + per sequence the last position's logits, three fp32 [V] working tensors and the prefill's transients
    size = ProbeSize(dtype="fp32", rows=8, prompt_len=1, response_len=16)
    ratio = _ratio("sample", size)
    assert LOW <= ratio <= HIGH, f"HF sampling: measured / planned = {ratio:.2f}"


def test_probe_sizes_and_phases_are_checked() -> None:
    with pytest.raises(ValueError, match="probe size: rows must be >= 1, got 0"):
        ProbeSize(rows=0)
    with pytest.raises(ValueError, match="probe size: prompt_len must be >= 1, got 0"):
        ProbeSize(prompt_len=0)
    with pytest.raises(ValueError, match="phase must be one of baseline, sample, update, step, got 'train'"):
        run_phase("train", ProbeSize())
    one = planned(ProbeSize(rows=1, prompt_len=1, response_len=1, micro_batch=1))
    assert one["static"] == 4 * 151936 * 64 + 4 * 2 * (64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64 + 64 + 2 * 32) + 4 * 64
    assert 0 < one["sample"] < one["update"] and one["total"] > one["static"] + one["update"] + one["sample"]
