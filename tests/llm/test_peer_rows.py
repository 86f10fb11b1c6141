"""A learner's peer rows (issue 13, items 14-16): THL's own prompt/response split under every chat
template, the peer's generation-config EOS ids, and Dr.GRPO's divisor per learner."""

from __future__ import annotations

import json
import shutil

import pytest

from mrl_llm.config import PolicyConfig, RunConfig, SamplingSection
from mrl_llm.models import load_tokenizer_dir
from mrl_llm.templates import TemplateConfig
from mrl_llm.trainer import worker_config
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig, learner_loss
from shared_interfaces.records import ExperienceRecord, make_record_id
from shared_interfaces.regimes import LossConfig
from tests.llm.helpers import tiny

#: Llama-2-chat's template (BOS inside the template text, as the real one has it)
LLAMA2_CHAT = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>\n{{ m['content'] }}\n<</SYS>>\n\n"
               "{% elif m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]{% endif %}{% endfor %}")


@pytest.fixture(scope="module")
def tok_dirs(shared_dir, tmp_path_factory):
    """qwen1.5 (its own chat template), a llama2 copy with Llama-2-chat's template, and a qwen1.5 copy whose
    generation_config.json adds ``<|im_end|>`` to the EOS ids (a chat model's engine stops on it)."""
    root = tmp_path_factory.mktemp("toks")
    llama_chat = root / "llama2-chat"
    shutil.copytree(shared_dir / "tokenizers" / "llama2", llama_chat)
    cfg = json.loads((llama_chat / "tokenizer_config.json").read_text())
    cfg["chat_template"] = LLAMA2_CHAT
    (llama_chat / "tokenizer_config.json").write_text(json.dumps(cfg))
    qwen_chat = root / "qwen-chat"
    shutil.copytree(shared_dir / "tokenizers" / "qwen1.5", qwen_chat)
    gen = json.loads((qwen_chat / "generation_config.json").read_text())
    gen["eos_token_id"] = [151643, 151645]
    (qwen_chat / "generation_config.json").write_text(json.dumps(gen))
    return {"qwen1.5": str(shared_dir / "tokenizers" / "qwen1.5"), "llama2": str(shared_dir / "tokenizers" / "llama2"),
            "llama2-chat": str(llama_chat), "qwen-chat": str(qwen_chat)}


def _worker(name, tok_dir, peers, *, template=None, peer_eos=None, loss=None):
    pol = PolicyConfig(name=name, model_config=tiny("llama", num_hidden_layers=1), tokenizer_dir=tok_dir,
                       template=template or TemplateConfig(), sampling=SamplingSection(max_new_tokens=40))
    loss = loss or LossConfig()
    cfg = WorkerConfig(policy=pol, loss=loss, tokenizers=tuple(peers), peer_eos_ids=peer_eos or {},
                       track_ref_kl=False, init_seed=0)
    return LLMPolicyWorker(name, cfg, seed=0)


def _record(policy, tokenizer, text, *, extra_ids=()):
    from mrl_llm.models import tokenizer_id

    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"]) + list(extra_ids)
    return ExperienceRecord(
        record_id=make_record_id(policy, 0, "p0", 0), policy_id=policy, policy_version=0, step=0, prompt_id="p0",
        sample_index=0, prompt_text="peer prompt", response_text=text, token_ids=ids,
        token_logprobs=[-0.5] * len(ids), tokenizer_id=tokenizer_id(tokenizer), reward=1.0, verified=True,
        verifier="math", finish_reason="stop")


CHAT_CASES = [
    ("qwen1.5", TemplateConfig(chat="require")),
    ("qwen1.5", TemplateConfig(chat="require", system="You are a careful solver.")),
    ("llama2-chat", TemplateConfig(chat="require")),
    ("llama2-chat", TemplateConfig(chat="require", system="You are a careful solver.")),
    ("qwen1.5", TemplateConfig()),  # plain templates keep THL's split as before
    ("llama2", TemplateConfig()),
]


@pytest.mark.parametrize(("learner_tok", "template"), CHAT_CASES,
                         ids=["qwen-chat", "qwen-chat-system", "llama-chat", "llama-chat-system", "qwen-plain", "llama-plain"])
def test_peer_row_is_the_learners_encoding_of_prompt_and_response(tok_dirs, learner_tok, template):
    """A peer's response starting with "\\n" (llama2's into Qwen, Qwen's into Llama) into a chat learner: the row (prompt ids + response ids)
    is exactly the learner's own encoding of prompt + response, so a token straddling the boundary
    ("assistant\\n" + "\\n" -> "\\n\\n" in Qwen) does not repeat a character."""
    peer_dir = tok_dirs["llama2"] if learner_tok.startswith("qwen") else tok_dirs["qwen1.5"]  # another vocabulary
    w = _worker("L", tok_dirs[learner_tok], [peer_dir], template=template)
    text, own_ids = w.set_prompt("p0", w.template.render("What is 2+2?"))
    assert w.template.uses_chat == (template.chat != "never")
    rec = _record("P", load_tokenizer_dir(peer_dir), "\nThe answer is \\boxed{4}.")
    prompt, response, lps, _ = w.alignment.align(rec)
    response_text = w.trace_cache.get_or_compute(rec.record_id, w.tok_id, lambda: None).text
    assert response_text.startswith("\n")
    joint = w.tokenizer(text + response_text, add_special_tokens=w.template.add_special_tokens)["input_ids"]
    assert prompt + response == list(joint)  # no character twice, no BOS twice
    assert len(lps) == len(response)
    assert prompt[: len(own_ids) - 1] == own_ids[:-1]  # the learner's own prompt (its last token may straddle)
    if learner_tok.startswith("qwen"):  # byte-level: the decode is the text itself
        assert w.tokenizer.decode(prompt + response) == text + response_text


def test_peer_generation_config_eos_reaches_the_learner(tok_dirs):
    """A peer whose engine stops on ``<|im_end|>`` (its generation config): the learner's row ends with the
    learner's EOS carrying that log-prob; without the ids (before) the EOS mass was dropped."""
    qwen = load_tokenizer_dir(tok_dirs["qwen-chat"])
    im_end = qwen.convert_tokens_to_ids("<|im_end|>")
    rec = _record("Q", qwen, "The answer is 4.", extra_ids=[im_end])
    with_ids = _worker("L", tok_dirs["llama2"], [tok_dirs["qwen-chat"]], peer_eos={"Q": [im_end]})
    with_ids.set_prompt("p0", "What is 2+2?\n")
    _, response, lps, residual = with_ids.alignment.align(rec)
    assert response[-1] == with_ids.tokenizer.eos_token_id and lps[-1] == -0.5 and residual.unaligned_mass == 0.0
    without = _worker("L", tok_dirs["llama2"], [tok_dirs["qwen-chat"]])
    without.set_prompt("p0", "What is 2+2?\n")
    _, response, _, residual = without.alignment.align(rec)
    assert response[-1] != without.tokenizer.eos_token_id and residual.unaligned_mass == -0.5


def test_worker_config_passes_each_policys_generation_eos_ids(tok_dirs):
    cfg = RunConfig(policies=(PolicyConfig(name="Q", model_dir=tok_dirs["qwen-chat"]),
                              PolicyConfig(name="L", model_config=tiny("llama"), tokenizer_dir=tok_dirs["llama2"])))
    wc = worker_config(cfg, "L")
    assert wc["peer_eos_ids"] == {"Q": [151643, 151645]}


def test_dr_grpo_divisor_is_the_learners_generation_budget(tok_dirs):
    pol = PolicyConfig(name="L", model_config=tiny("llama"), tokenizer_dir="x", sampling=SamplingSection(max_new_tokens=48))
    assert LossConfig().max_response_len is None and LossConfig().dr_grpo_len == 1  # the core's (bandit's) default
    assert learner_loss(LossConfig(agg="seq-mean-token-sum-norm"), pol).max_response_len == 48
    assert learner_loss(LossConfig(max_response_len=7), pol).max_response_len == 7  # the config's own wins
    w = _worker("L", tok_dirs["llama2"], [], loss=LossConfig(agg="seq-mean-token-sum-norm"))
    assert w.loss_cfg.max_response_len == 40 and w.loss_cfg.dr_grpo_len == 40
