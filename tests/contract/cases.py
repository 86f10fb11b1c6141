"""Contract cases: raw rollout records + a regime. Every backend must hand its optimizer the same
advantages, weights and SGT targets for them (see :mod:`shared_interfaces.contract`).

Records carry UTF-8 byte ids of their response text (tokenizer id ``utf8-bytes``) and behaviour
log-probs of -0.1 per token, so that an LLM backend can decode and re-encode them and a bandit
backend can read their lengths. Texts differ in length on purpose: ``shortest`` selection must use them.
"""

from __future__ import annotations

from shared_interfaces.contract import ContractCase
from shared_interfaces.records import ExperienceRecord, make_record_id
from shared_interfaces.regimes import parse_regime

TEXTS = [
    "The answer is \\boxed{4}.",
    "So x = 4, answer \\boxed{4}",
    "I think it is 5.",
    "Compute 2+2: \\boxed{4}",
    "No idea",
    "Let us check: 2 + 2 = 4 so \\boxed{4}.",
]


def rec(policy: str, prompt: str, g: int, reward: float, *, verified: bool = True, step: int = 0,
        text: str | None = None) -> ExperienceRecord:
    text = TEXTS[(g + len(policy) + len(prompt)) % len(TEXTS)] if text is None else text
    ids = tuple(text.encode("utf-8"))
    return ExperienceRecord(
        record_id=make_record_id(policy, step, prompt, g), policy_id=policy, policy_version=step,
        step=step, prompt_id=prompt, sample_index=g, prompt_text=f"Question {prompt}: what is 2+2?",
        response_text=text, token_ids=ids, token_logprobs=tuple(-0.1 for _ in ids),
        tokenizer_id="utf8-bytes", reward=reward, verified=verified, verifier="math",
        finish_reason="stop",
    )


def group(policy: str, prompt: str, rewards, **kw) -> list[ExperienceRecord]:
    return [rec(policy, prompt, g, r, **kw) for g, r in enumerate(rewards)]


def _case(name, regime, pids, records, **settings):
    return ContractCase(name=name, regime=parse_regime(regime, settings or None), policy_ids=tuple(pids),
                        records=tuple(records))


def all_cases() -> list[ContractCase]:
    two = ("A", "B")
    mixed = group("A", "p0", [1, 0, 0, 1]) + group("B", "p0", [0, 0, 0, 1])
    rescue = group("A", "p1", [0, 0, 0, 0]) + group("B", "p1", [1, 0, 1, 0])
    constant = group("A", "p2", [1, 1, 1, 1]) + group("B", "p2", [1, 1, 1, 1])
    unverified = group("A", "p3", [0, 0, 0, 0]) + group("B", "p3", [1, 0, 0, 0], verified=False)
    cases = []
    for regime in ("grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt", "sgt+xgrpo", "prp_thl+sgt"):
        cases.append(_case(f"{regime}-mixed+rescue+constant", regime, two, mixed + rescue + constant))
    cases.append(_case("sgt-unverified-peer-never-selected", "sgt", two, unverified))
    cases.append(_case("sgt-two-successes-shortest", "sgt", two, rescue, sgt={"successes_per_prompt": 2}))
    cases.append(_case("sgt-first", "sgt", two, rescue, sgt={"selection": "first"}))
    rescue2 = group("A", "p5", [0, 0, 0]) + group("B", "p5", [1, 1, 0])
    for regime in ("sgt", "prp_thl+sgt"):  # lambda per rescued prompt: two pools
        cases.append(_case(f"{regime}-normalize-prompt", regime, two, mixed + rescue + rescue2,
                           sgt={"normalize": "prompt", "successes_per_prompt": 2}))
    three = group("A", "p4", [0, 0]) + group("B", "p4", [1, 0, 0]) + group("C", "p4", [0, 1, 1, 0, 1])
    for regime in ("xgrpo", "prp_snapshot", "sgt"):
        cases.append(_case(f"{regime}-three-policies-unequal-groups", regime, ("A", "B", "C"), three))
    cases.append(_case("prp-capped-peers", "prp_snapshot", two, mixed, prp={"max_peer_samples": 2,
                                                                             "peer_weight": 0.5}))
    cases.append(_case("drgrpo-no-std", "xgrpo", two, mixed, advantage={"scale_by_std": False}))
    # a policy with no records for a prompt (e.g. crashed): the others still train
    cases.append(_case("missing-policy", "sgt", ("A", "B", "C"), rescue))
    return cases
