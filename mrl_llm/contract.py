"""The LLM backend of the cross-backend contract (:mod:`shared_interfaces.contract`).

:func:`run_contract_case` puts a case's raw records into an in-memory exchange and, for every learner,
runs the trainer's own step path on them: :func:`mrl_llm.distributed.actors.fetch_learner_rows` (fetch,
filter, plan with the core: the learner's rows) and :meth:`mrl_llm.worker.LLMPolicyWorker.build_batch`
(prompts, THL alignment of every peer record into the learner's tokenizer), then computes the behaviour
coefficients at the snapshot (one no-grad pass of the learner's model, then the rows'
:meth:`~shared_interfaces.regimes.rows.LearnerRows.behaviour_coef`). It reports what the optimizer would
see: each row's advantage and sample weight (the rows' float64 tensors), the coefficient of every
``prp_snapshot`` peer row (all its tokens must be exactly 1; their common value is reported), the rows in
the SGT mask and the gates.

The case records are in ``utf8-bytes`` ids (:mod:`mrl_llm.byte_tokenizer`). Each learner is a tiny
llama with its *own* byte-level BPE tokenizer, trained on the case texts, so THL really re-encodes
every peer trace. The learner's prompt is the records' prompt text, encoded with its tokenizer.
"""

from __future__ import annotations

import tempfile
from functools import lru_cache
from pathlib import Path

import torch

from mrl_llm.batch import pad_tensors
from mrl_llm.config import PolicyConfig
from mrl_llm.distributed.actors import fetch_learner_rows
from mrl_llm.logprobs import response_logprob_rows
from mrl_llm.worker import LLMPolicyWorker, WorkerConfig
from shared_interfaces.contract import ContractCase, ContractOutput, LearnerDecisions
from shared_interfaces.exchange import InMemoryExchange

TINY_LLAMA = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 1024}


#: What the learners' tokenizer is trained on: short math answers in English, like the case texts.
_CORPUS = [
    "Question: what is 2+2? The answer is \\boxed{4}.",
    "So x = 4, and the answer is \\boxed{4}. I think it is 5.",
    "Compute 2 + 2 = 4, let us check the answer: \\boxed{4}. No idea.",
]


@lru_cache(maxsize=1)
def learner_tokenizer_dir() -> str:
    """A byte-level BPE tokenizer (vocabulary 320) trained on the contract texts, saved in a temp dir."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator(_CORPUS, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>")
    d = Path(tempfile.mkdtemp(prefix="mrl-contract-tok-"))
    tok.save_pretrained(str(d))
    return str(d)


def _worker(name: str) -> LLMPolicyWorker:
    pol = PolicyConfig(name=name, model_config=dict(TINY_LLAMA), tokenizer_dir=learner_tokenizer_dir())
    return LLMPolicyWorker(name, WorkerConfig(policy=pol, track_ref_kl=False, init_seed=0), seed=0)


def run_contract_case(case: ContractCase) -> ContractOutput:
    ex = InMemoryExchange()
    ex.publish(case.records)
    by_step: dict[int, list[str]] = {}
    prompt_text: dict[str, str] = {}
    for r in case.records:
        by_step.setdefault(r.step, [])
        if r.prompt_id not in by_step[r.step]:
            by_step[r.step].append(r.prompt_id)
        prompt_text.setdefault(r.prompt_id, r.prompt_text)
    out: ContractOutput = {}
    for learner in case.policy_ids:
        w = _worker(learner)
        for pid, text in prompt_text.items():
            w.set_prompt(pid, text)
        dec = LearnerDecisions()
        for step in sorted(by_step):
            pids = sorted(by_step[step])
            rows, _ = fetch_learner_rows(ex, learner, case.regime, pids, step, present=case.policy_ids)
            for k, pid in enumerate(pids):
                dec.sgt_gates[pid] = bool(rows.sgt_gate[k])
            if not len(rows):
                continue
            batch = w.build_batch(rows)
            old = response_logprob_rows(w.model, batch.prompts, batch.responses, pad_id=w.pad_id)
            T = max(1, int(batch.lengths.max()))
            mu = pad_tensors([torch.tensor(m, dtype=torch.float32) for m in batch.mu], T)
            coef = rows.behaviour_coef(pad_tensors(old, T), mu)
            token = torch.arange(T)[None, :] < batch.lengths[:, None]
            snapshot = ~rows.own_mask & rows.pg_mask if rows.denominator == "snapshot" else torch.zeros_like(rows.pg_mask)
            for n, rec in enumerate(rows.row_records()):
                rid = rec.record_id
                if bool(rows.pg_mask[n]):
                    dec.advantages[rid] = float(rows.advantages[n])
                    dec.weights[rid] = float(rows.sample_weight[n])
                if bool(snapshot[n]):
                    values = set(coef[n][token[n]].tolist()) or {1.0}  # a row with no tokens deviates nowhere
                    dec.snapshot_coef[rid] = values.pop() if len(values) == 1 else float("nan")
                if bool(rows.sgt_mask[n]):
                    dec.sgt_targets.add(rid)
            if batch.sgt_scale is not None:
                pools: dict[int, set[str]] = {}
                for n, rec in enumerate(rows.row_records()):
                    if bool(rows.sgt_mask[n]):
                        pools.setdefault(int(rows.prompt[n]), set()).add(rec.record_id)
                dec.sgt_pools.update(frozenset(p) for p in pools.values())
        out[learner] = dec
    return out
