"""A run's few-shot examples: the ``few_shot`` config section and the draw.

A run with ``few_shot: {shots: 3, mode: distinct, seed: 0, data: {path: EXAMPLES.jsonl, verifier: arithmetic}}``
gives every problem it trains or evaluates on ``shots`` examples (``Problem.shots``) of its own family (the
``family`` field; a problem without one draws from the examples without one); each policy's template renders them
before the problem (:mod:`mrl_llm.templates`: earlier chat turns, or plain blocks). The same examples go to every
policy. ``shots: 0`` (the default) draws nothing: every prompt renders as without this section.

The examples come ONLY from ``data``, which should hold training-split problems that are neither in the RL pool
(the run's ``data``) nor evaluated (``eval.data``, the held-out prompts): an example whose prompt id or question
is also a problem of the run is an error naming it (:func:`attach_shots`).

Modes, both deterministic in ``seed`` and the prompt (whichever policy, rank or resume draws them):

* ``fixed`` -- ``random.Random("<seed>:<family>").sample(the family's examples, shots)``: the same examples for
  every prompt of the family;
* ``distinct`` -- the family's examples in the order of ``random.Random("<seed>:<prompt id>").sample(examples,
  len(examples))``, keeping the first ``shots`` whose gold answers differ from each other and from the prompt's
  (a model that copies an example's answer is then always wrong; issue 41, item 2).

Too few examples for a prompt (its family has fewer than ``shots``, or fewer than ``shots`` answers other than
its own in ``distinct`` mode) is an error naming the prompt, the key and the fix.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from mrl_llm.data.jsonl import DataConfig
from mrl_llm.data.problem import Problem

ShotMode = Literal["fixed", "distinct"]
SHOT_MODES = ("fixed", "distinct")


class ShotsError(ValueError):
    """The few-shot examples cannot be drawn as configured; the message names the key and the fix."""


@dataclass(frozen=True)
class FewShotConfig:
    """The run's ``few_shot`` section (module docstring): ``shots`` examples per prompt (0: none), ``mode``
    ``fixed`` or ``distinct``, the draw's ``seed`` and the examples' source ``data`` (a run needs one when
    ``shots > 0``, :func:`check_run_section`; the draw itself takes the examples as given)."""

    shots: int = 0
    mode: ShotMode = "distinct"
    seed: int = 0
    data: DataConfig | None = None

    def __post_init__(self) -> None:
        if isinstance(self.shots, bool) or not isinstance(self.shots, int) or self.shots < 0:
            raise ShotsError(f"few_shot.shots must be an integer >= 0 (0: no examples), got {self.shots!r}")
        if self.mode not in SHOT_MODES:
            raise ShotsError(f"few_shot.mode {self.mode!r} is not a mode; use 'fixed' (the same examples for every "
                             "prompt of a family) or 'distinct' (per prompt, answers differing from each other and "
                             "from the prompt's)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ShotsError(f"few_shot.seed must be an integer >= 0, got {self.seed!r}")


def check_run_section(cfg: FewShotConfig) -> None:
    """What a run's ``few_shot`` section needs besides its own fields: ``data`` when ``shots > 0``."""
    if cfg.shots > 0 and cfg.data is None:
        raise ShotsError(f"few_shot.shots is {cfg.shots} but few_shot.data names no examples; add few_shot.data: "
                         "{path: EXAMPLES.jsonl, verifier: ...} (training-split problems neither in the RL pool "
                         "nor held out), or set few_shot.shots: 0")


def by_family(examples: Sequence[Problem]) -> dict[str | None, list[Problem]]:
    """The examples grouped by ``family`` (None for those without one), each group in the given order."""
    out: dict[str | None, list[Problem]] = {}
    for e in examples:
        out.setdefault(e.family, []).append(e)
    return out


def _short(problem: Problem, have: int, cfg: FewShotConfig, what: str) -> ShotsError:
    fam = "no family" if problem.family is None else f"family {problem.family!r}"
    fix = "lower few_shot.shots, use few_shot.mode: fixed, or add examples" if cfg.mode == "distinct" else \
        "lower few_shot.shots or add examples"
    src = cfg.data.path if cfg.data is not None else "few_shot.data"
    return ShotsError(f"few_shot: prompt {problem.prompt_id!r} ({fam}) has {have} {what}, fewer than "
                      f"few_shot.shots = {cfg.shots}; {fix} of its family to {src}")


def draw_shots(problem: Problem, examples: Sequence[Problem], cfg: FewShotConfig) -> tuple[Problem, ...]:
    """``cfg.shots`` examples for ``problem`` from ``examples`` (those of its family, in their given order) under
    ``cfg.mode`` (module docstring); () for ``shots = 0``; a :class:`ShotsError` when there are too few."""
    if cfg.shots == 0:
        return ()
    pool = [e for e in examples if e.family == problem.family]
    if cfg.mode == "fixed":
        if len(pool) < cfg.shots:
            raise _short(problem, len(pool), cfg, "examples")
        return tuple(random.Random(f"{cfg.seed}:{problem.family}").sample(pool, cfg.shots))
    picked: list[Problem] = []
    used = {problem.gold}
    for e in random.Random(f"{cfg.seed}:{problem.prompt_id}").sample(pool, len(pool)):
        if e.gold not in used:
            picked.append(e)
            used.add(e.gold)
            if len(picked) == cfg.shots:
                return tuple(picked)
    raise _short(problem, len({e.gold for e in pool} - {problem.gold}), cfg,
                 f"example answers other than its own ({problem.gold})")


def check_apart(examples: Sequence[Problem], problems: Sequence[Problem], what: str) -> None:
    """A :class:`ShotsError` naming the first example whose prompt id or question is also one of ``problems``
    (``what``: which of the run's sets, e.g. ``the RL pool (data)``)."""
    ids = {p.prompt_id for p in problems}
    questions = {p.question for p in problems}
    clash = [e for e in examples if e.prompt_id in ids or e.question in questions]
    if clash:
        raise ShotsError(f"few_shot.data holds {len(clash)} problem(s) of {what}, e.g. {clash[0].prompt_id!r}; the "
                         "examples must be training-split problems neither in the RL pool nor evaluated: remove them "
                         "from the examples file")


def attach_shots(problems: Sequence[Problem], examples: Sequence[Problem], cfg: FewShotConfig) -> list[Problem]:
    """``problems`` with their examples (``Problem.shots``, :func:`draw_shots`); the problems themselves (no copy)
    when ``cfg.shots`` is 0; an empty list for no problems."""
    if cfg.shots == 0:
        return list(problems)
    families = by_family(examples)
    return [replace(p, shots=draw_shots(p, families.get(p.family, []), cfg)) for p in problems]
