"""Peer alignment (:mod:`mrl_llm.rank.alignment`) alone: tokenizers and a prompt cache, no model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mrl_llm.byte_tokenizer import BYTE_TOKENIZER_ID, byte_tokenizer
from mrl_llm.contract import learner_tokenizer_dir
from mrl_llm.models import load_tokenizer_dir, tokenizer_id
from mrl_llm.rank.alignment import PeerAlignment, run_tokenizers
from mrl_llm.rank.prompts import PromptCache
from mrl_llm.templates import PromptTemplate, TemplateConfig
from mrl_llm.thl import align_trace
from shared_interfaces.records import ExperienceRecord, make_record_id

PROMPT = "Question: what is 2+2? Put the answer in \\boxed{}."


@pytest.fixture(scope="module")
def learner_dir() -> str:
    return learner_tokenizer_dir()


def record(policy: str, g: int, text: str, *, prompt_id: str = "p0") -> ExperienceRecord:
    ids = list(text.encode()) + [byte_tokenizer().eos_token_id]
    return ExperienceRecord(
        record_id=make_record_id(policy, 0, prompt_id, g), policy_id=policy, policy_version=0, step=0,
        prompt_id=prompt_id, sample_index=g, prompt_text="peer prompt", response_text=text, token_ids=ids,
        token_logprobs=[-0.1 * (k + 1) for k in range(len(ids))], tokenizer_id=BYTE_TOKENIZER_ID, reward=1.0,
        verified=True, verifier="math", finish_reason="stop")


def alignment(learner_dir: str, **kw) -> PeerAlignment:
    tok = load_tokenizer_dir(learner_dir)
    prompts = PromptCache("L", tok, PromptTemplate(TemplateConfig(), tok), max_prompt_len=256)
    prompts.set_prompt("p0", PROMPT)
    return PeerAlignment("L", tok, prompts, tokenizers=run_tokenizers("L", tok, learner_dir, [BYTE_TOKENIZER_ID]),
                         peer_eos_ids={}, **kw)


def test_run_tokenizers_hold_the_own_the_byte_and_each_peer_once(learner_dir):
    tok = load_tokenizer_dir(learner_dir)
    assert run_tokenizers("L", tok, learner_dir, []) == {tokenizer_id(tok): tok, BYTE_TOKENIZER_ID: byte_tokenizer()}
    got = run_tokenizers("L", tok, learner_dir, [learner_dir, BYTE_TOKENIZER_ID, learner_dir])
    assert got.keys() == {tokenizer_id(tok), BYTE_TOKENIZER_ID} and got[tokenizer_id(tok)] is tok


def test_a_peer_record_aligns_into_the_learners_tokens_once_per_record(learner_dir):
    a = alignment(learner_dir)
    rec = record("P", 0, "The answer is \\boxed{4}.")
    prompt, response, lps, residual = a.align(rec)
    want = align_trace(byte_tokenizer(), a.tokenizer, list(rec.token_ids), list(rec.token_logprobs), prompt_text=PROMPT)
    assert (prompt, response, lps) == (want.prompt_ids.tolist(), want.target_ids.tolist(), want.target_logprobs.tolist())
    assert residual == want.residual and response[-1] == a.tokenizer.eos_token_id
    a.align(rec)
    assert (a.trace_cache.misses, a.trace_cache.hits) == (1, 1)


def test_prefetch_batches_the_peer_records_and_skips_the_learners_own(learner_dir):
    batched, single = alignment(learner_dir), alignment(learner_dir)
    peers = [record("P", g, t) for g, t in enumerate(["So \\boxed{4}", "It is 3.", "five?"])]
    own = replace(record("L", 0, "mine"), tokenizer_id=batched.tok_id)
    batched.prefetch([own, *peers])
    assert batched.trace_cache.misses == len(peers) and len(batched.trace_cache) == len(peers)
    for rec in peers:
        assert batched.align(rec) == single.align(rec)
    assert batched.trace_cache.misses == len(peers)  # every align above was a hit


def test_prefetch_of_no_records_aligns_nothing(learner_dir):
    a = alignment(learner_dir)
    a.prefetch([])
    assert len(a.trace_cache) == 0 and a.trace_cache.misses == 0


def test_a_worker_group_with_no_peer_record_makes_no_collective(learner_dir):
    class NoCollective:  # a rank of a group of two that must not be asked for anything
        sharded, rank, world_size = True, 0, 2

        def gather_objects(self, obj):
            raise AssertionError("prefetch gathered although no rank had a peer record to align")

    a = alignment(learner_dir)
    a.prefetch([replace(record("L", 0, "mine"), tokenizer_id=a.tok_id)], group=NoCollective())
    a.prefetch([], group=NoCollective())
    assert len(a.trace_cache) == 0 and a.trace_cache.misses == 0
    with pytest.raises(AssertionError, match="gathered"):  # a peer record: the ranks share their alignments
        a.prefetch([record("P", 0, "x")], group=NoCollective())


def test_unknown_tokenizer_and_unrendered_prompt_are_errors_naming_learner_and_record(learner_dir):
    a = alignment(learner_dir)
    stranger = replace(record("P", 0, "x"), tokenizer_id="vocab9-0000")
    with pytest.raises(KeyError, match="policy 'L' cannot read record .* tokenizer 'vocab9-0000'"):
        a.align(stranger)
    with pytest.raises(KeyError, match="policy 'L' has not rendered prompt 'p9'"):
        a.prefetch([record("P", 0, "x", prompt_id="p9")])


def test_a_worker_group_aligns_each_peer_record_once_and_every_rank_holds_all(learner_dir, tmp_path):
    """2 gloo ranks: 4 + 3 of the 7 peer records aligned (the own record never), and each rank's cache gives
    exactly the one-process traces for all 7 (cache hits, no alignment after the prefetch)."""
    from tests.llm.parallel_ranks import aligned_view, peer_records, run_align

    recs = peer_records()
    one = alignment(learner_dir)
    one.prefetch(recs)
    want = aligned_view(one, recs)
    assert want["hits"] == 7
    got = run_align(tmp_path / "align", learner_dir)
    assert sorted(g["aligned"] for g in got) == [3, 4]
    for g in got:
        assert g["hits"] == 7 and g["view"] == want["view"]


def test_prefetch_of_nothing_or_only_own_records(learner_dir):
    a = alignment(learner_dir)
    a.prefetch([])
    a.prefetch([record("L", 0, "own")])
    assert len(a.trace_cache) == 0


def test_a_token_straddling_a_one_token_prompt_stays_the_prompt(shared_dir):
    """GPT-2 encodes prompt "a" + response "nd then" as ["and", " then"]: THL gives the straddling "and" to the
    response, leaving no prompt token, and the batch's pack refused the row ("the prompt is empty"), ending the
    run. It stays the prompt; the rest is the response."""
    d = str(shared_dir / "tokenizers" / "gpt2")
    tok = load_tokenizer_dir(d)
    prompts = PromptCache("L", tok, PromptTemplate(TemplateConfig(text="{question}"), tok), max_prompt_len=8)
    prompts.set_prompt("p0", "a")
    a = PeerAlignment("L", tok, prompts, tokenizers=run_tokenizers("L", tok, d, [BYTE_TOKENIZER_ID]), peer_eos_ids={})
    rec = record("P", 0, "nd then")
    want = align_trace(byte_tokenizer(), tok, list(rec.token_ids), list(rec.token_logprobs), prompt_text="a")
    assert want.prompt_ids.tolist() == [] and want.residual.n_boundary_conflicts == 1
    prompt, response, lps, _ = a.align(rec)
    assert prompt == tok("and")["input_ids"] and response == want.target_ids.tolist()[1:]
    assert lps == want.target_logprobs.tolist()[1:] and tok.decode(prompt + response).startswith("and then")
    empty = a.align(record("P", 1, ""))  # the empty case: nothing straddles, the prompt is the prompt's
    assert empty[0] == tok("a")["input_ids"] and empty[1] == [tok.eos_token_id]
