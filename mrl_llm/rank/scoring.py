"""A rank's verifiers: one per verifier name, built once with the run's options for it, and scoring.

``options`` maps a verifier name to its constructor options (the config's ``data`` sections,
:meth:`mrl_llm.data.DataConfig.verifier_options`). :meth:`Scorer.score` is the problem's verifier's
:class:`~mrl_llm.rewards.Verdict` on a response; :meth:`Scorer.score_many` scores ``(problem, text,
finish_reason)`` triples in order, one batch per verifier (:func:`mrl_llm.rewards.score_problems`: the MATH
verifier spreads it over its worker pool). :meth:`Scorer.close` releases the verifiers' processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mrl_llm import rewards


class Scorer:
    """The verifiers of one rank (module docstring)."""

    def __init__(self, options: Mapping[str, Mapping[str, Any]]) -> None:
        self.options = options
        self.verifiers: dict[str, Any] = {}

    def verifier(self, name: str) -> Any:
        """The verifier named ``name``, built once with the run's options for it."""
        v = self.verifiers.get(name)
        if v is None:
            v = self.verifiers[name] = rewards.get_verifier(name, **self.options.get(name, {}))
        return v

    def score(self, problem: Any, text: str, finish_reason: str) -> Any:
        """The problem's verifier's :class:`~mrl_llm.rewards.Verdict` on ``text``."""
        return rewards.score_problem(self.verifier(problem.verifier), problem, text, finish_reason=finish_reason)

    def score_many(self, items: Sequence[tuple[Any, str, str]]) -> list[Any]:
        """:meth:`score` of each ``(problem, text, finish_reason)``, in order, one batch per verifier."""
        out: list[Any] = [None] * len(items)
        by_name: dict[str, list[int]] = {}
        for i, (prob, _, _) in enumerate(items):
            by_name.setdefault(prob.verifier, []).append(i)
        for name, idx in by_name.items():
            for i, v in zip(idx, rewards.score_problems(self.verifier(name), [items[i] for i in idx]), strict=True):
                out[i] = v
        return out

    def close(self) -> None:
        """Release the verifiers' resources (the MATH verifier's checker processes)."""
        for v in self.verifiers.values():
            rewards.close_verifier(v)
        self.verifiers.clear()
