"""A step's rollouts (:mod:`mrl_llm.rank.rollouts`) alone: sampling settings and records from samples."""

from __future__ import annotations

from mrl_llm.config import PolicyConfig, SamplingSection
from mrl_llm.rank.rollouts import RolloutStats, make_records, rollout_sampling
from mrl_llm.rank.seeds import derive_seed
from mrl_llm.rewards import Verdict
from mrl_llm.rewards.verdict import CORRECT, GOLD_UNPARSABLE, WRONG
from mrl_llm.rollout import Sample
from shared_interfaces.records import make_record_id
from tests.llm.helpers import problems, tiny


def policy(seeding: str = "call") -> PolicyConfig:
    return PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=2,
                        sampling=SamplingSection(temperature=0.8, top_p=0.9, max_new_tokens=9, seeding=seeding))


def test_rollout_sampling_is_seeded_per_step_and_with_seeding_sample_per_prompt_and_index():
    probs = problems(2)
    sp = rollout_sampling(policy(), probs, seed=7, step=3)
    assert (sp.temperature, sp.top_p, sp.max_new_tokens, sp.row_seeds) == (0.8, 0.9, 9, None)
    assert sp.seed == derive_seed(7, "a", "rollout", 3)
    per_sample = rollout_sampling(policy("sample"), probs, seed=7, step=3)
    assert per_sample.seed == sp.seed and per_sample.row_seeds == tuple(
        derive_seed(7, "a", "rollout", 3, p, g) for p in ("p0", "p1") for g in range(2))
    assert rollout_sampling(policy("sample"), [], seed=7, step=3).row_seeds == ()


def test_seeding_defaults_to_one_seed_per_sample():
    """The default (``sampling.seeding: sample``) gives every (prompt, sample index) its own seed, so a worker
    group's k ranks sample the same records as one rank."""
    assert SamplingSection().seeding == "sample"
    pol = PolicyConfig(name="a", model_config=tiny("llama"), tokenizer_dir="utf8-bytes", group_size=2)
    assert rollout_sampling(pol, problems(2), seed=7, step=3).row_seeds == rollout_sampling(
        policy("sample"), problems(2), seed=7, step=3).row_seeds


def test_records_carry_the_verdicts_and_a_skipped_sample_is_counted_not_recorded():
    probs = problems(2)
    rendered = [("Q0", [1, 2, 3]), ("Q1", [4, 5])]
    samples = [[Sample((7, 8), (-0.1, -0.2), "stop", "ok"), Sample((9,), (-0.3,), "length", " ")],
               [Sample((7,), (-0.4,), "stop", "x"), Sample((), (), "stop", "")]]
    verdicts = [Verdict(1.0, CORRECT), Verdict(0.0, WRONG), Verdict(0.0, GOLD_UNPARSABLE), Verdict(0.0, WRONG)]
    recs, st = make_records(probs, rendered, samples, verdicts, policy="a", version=4, step=3, tok_id="utf8-bytes",
                            group_size=2, flops_params=10)
    assert [r.record_id for r in recs] == [make_record_id("a", 3, "p0", 0), make_record_id("a", 3, "p0", 1),
                                           make_record_id("a", 3, "p1", 1)]
    first = recs[0]
    assert (first.prompt_text, first.token_ids, first.reward, first.policy_version, first.step) == ("Q0", (7, 8), 1.0, 4, 3)
    assert (st.samples, st.gen_tokens, st.skipped, st.empty, st.truncated) == (4, 4, 1, 2, 1)
    assert st.prompt_tokens == (3 + 2) * 2 and st.flops == 2.0 * 10 * (10 + 4)
    m = st.metrics(generation_s=1.5, scoring_s=0.5)
    assert m["skipped_samples"] == 1.0 and m["gen_flops"] == st.flops and m["generation_s"] == 1.5


def test_no_problems_make_no_records():
    recs, st = make_records([], [], [], [], policy="a", version=0, step=0, tok_id="t", group_size=2, flops_params=10)
    assert recs == [] and st == RolloutStats()
