"""Rule-based verifiers. Each is a class implementing :class:`Verifier` (``score`` returns a
:class:`Verdict`; counters in ``stats``) and a plain function returning 1.0 / 0.0:

* :func:`math_reward` — last ``\\boxed{}`` + math-verify, deadline enforced in a worker process;
* :func:`mcq_reward` — multiple-choice option letters;
* :func:`arithmetic_reward` — the synthetic arithmetic task (:class:`ArithmeticTask`).

:func:`get_verifier` builds one by the name a config uses (``math``, ``mcq``, ``arithmetic``).
"""

from mrl_llm.rewards.arithmetic import (
    FAMILIES,
    ArithmeticTask,
    ArithmeticVerifier,
    Family,
    arithmetic_reward,
    arithmetic_verdict,
    reference_response,
)
from mrl_llm.rewards.extract import ANSWER_FORMATS, answer_line, gold_answer, last_boxed, response_answer
from mrl_llm.rewards.math_verifier import MathVerifier, math_reward, math_verdict
from mrl_llm.rewards.mcq import MCQVerifier, choice_letter, mcq_reward, mcq_verdict
from mrl_llm.rewards.registry import (
    VERIFIERS,
    close_verifier,
    get_verifier,
    gold_checker,
    score_problem,
    score_problems,
)
from mrl_llm.rewards.verdict import (
    REASONS,
    REWARD_RANGE,
    SKIP_REASONS,
    ScoreRequest,
    UnparsableGoldError,
    Verdict,
    Verifier,
    VerifierStats,
)

__all__ = [
    "ANSWER_FORMATS",
    "FAMILIES",
    "REASONS",
    "REWARD_RANGE",
    "SKIP_REASONS",
    "ScoreRequest",
    "VERIFIERS",
    "ArithmeticTask",
    "ArithmeticVerifier",
    "Family",
    "MCQVerifier",
    "MathVerifier",
    "UnparsableGoldError",
    "Verdict",
    "Verifier",
    "VerifierStats",
    "answer_line",
    "arithmetic_reward",
    "arithmetic_verdict",
    "choice_letter",
    "close_verifier",
    "get_verifier",
    "gold_answer",
    "gold_checker",
    "last_boxed",
    "math_reward",
    "math_verdict",
    "mcq_reward",
    "mcq_verdict",
    "reference_response",
    "response_answer",
    "score_problem",
    "score_problems",
]
