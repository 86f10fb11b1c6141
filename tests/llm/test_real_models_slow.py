"""The real packages: ``models prepare`` writes SmolLM2-135M-Instruct and Gemma-3-270M, and each loads and talks sense.

Needs ``scripts/setup.sh --real-models`` (.ci/run installs them before the slow suite). Without the packages
the tests skip, and fail under ``CI=true``. The models are prepared under ``$MRL_MODELS_DIR`` or the checkout's
``models/`` (git-ignored), so a second run finds them there; on a fresh clone the conversion takes a few
minutes on 2 cores.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from pathlib import Path

import pytest
import torch

from mrl_llm import real_models
from mrl_llm.real_models import prepare_models, starts_with_bos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
TEXTS = ("The capital of France is Paris, and the capital of Germany is Berlin.",
         "Water boils at one hundred degrees Celsius at sea level.",
         "If x + 3 = 7, then x = 4.",
         "She opened the door and walked into the garden.")


def require_packages() -> None:
    missing = sorted({p.distribution for s in real_models.SOURCES for p in s.parts if not _installed(p.distribution)})
    if missing:
        msg = f"the real models' packages are not installed ({', '.join(missing)}); run scripts/setup.sh --real-models"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (required in CI)")
        pytest.skip(msg)


def _installed(dist: str) -> bool:
    try:
        md.distribution(dist)
    except md.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def models_dir() -> Path:
    require_packages()
    root = Path(os.environ.get("MRL_MODELS_DIR") or REPO / "models")
    rows = prepare_models(root)
    assert [r["name"] for r in rows] == ["smollm2-135m-instruct", "gemma-3-270m"]
    again = prepare_models(root, progress=False)
    assert [r["created"] for r in again] == [False, False]  # idempotent
    return root


def load(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def greedy(tok, model, text: str, n: int = 12) -> str:
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def mean_nll(tok, model) -> float:
    """Mean next-token NLL (nats) of :data:`TEXTS` encoded by the tokenizer as saved (BOS or not)."""
    total, count = 0.0, 0
    for text in TEXTS:
        ids = torch.tensor([tok(text)["input_ids"]])
        with torch.no_grad():
            logp = model(ids).logits.log_softmax(-1)
        nll = -logp[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        total, count = total + nll.sum().item(), count + nll.numel()
    return total / count


def test_smollm2(models_dir):
    tok, model = load(models_dir / "smollm2-135m-instruct")
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert 134_000_000 < sum(p.numel() for p in model.parameters()) < 135_000_000
    assert not starts_with_bos(tok)  # as the released checkpoint
    chat = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and model.generation_config.eos_token_id == tok.eos_token_id
    assert "Paris" in greedy(tok, model, "The capital of France is")
    assert mean_nll(tok, model) < 3.5


def test_gemma_with_bos(models_dir):
    tok, model = load(models_dir / "gemma-3-270m")
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.model_type == "gemma3_text"
    assert 268_000_000 < sum(p.numel() for p in model.parameters()) < 269_000_000
    assert starts_with_bos(tok) and tok.bos_token_id == 2  # the GGUF's tokenizer alone does not add it
    assert not tok.chat_template  # a base model
    words = greedy(tok, model, "The capital of France is").split()
    assert len(set(words)) >= len(words) // 2 + 1, words  # not "France. The The The The ..." (no BOS)
    assert mean_nll(tok, model) < 3.5  # ~2.6 with BOS, ~5.8 without
