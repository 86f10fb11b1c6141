"""A deterministic, resumable cursor over a dataset's prompts: the per-step prompt batches.

Epoch ``e`` visits the problems in the order of a permutation drawn from ``random.Random`` seeded by
``(seed, e)`` (so epoch orders do not depend on how many batches were drawn before). A batch takes the
next ``batch_size`` problems; a batch that runs past the end of an epoch continues with the next
epoch's order (every batch has exactly ``batch_size`` problems; a problem repeats within one batch
only when ``batch_size`` exceeds the dataset). ``shuffle=False`` keeps file order in every epoch.

The state (:meth:`DataCursor.state_dict`) is a small JSON-able dict: seed, epoch, position and a
fingerprint of what the run uses of every problem (:func:`fingerprint`: id, question, gold answer,
choices, verifier), so a resume against a different or edited dataset fails instead of silently
drawing other prompts or scoring against other answers.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from typing import Any

from mrl_llm.data.problem import Problem

STATE_VERSION = 2  # 2: the fingerprint covers each problem's content, not only its id


def fingerprint(problems: Sequence[Problem]) -> str:
    """SHA-256 (hex) of the ordered problems as the run uses them: per problem the JSON list
    ``[prompt_id, question, gold, list(choices), verifier]`` (and the ids of its few-shot examples, when it has
    some) plus a newline. Changing any of these
    fields of any row, or the rows' order or number, changes it."""
    h = hashlib.sha256()
    for p in problems:
        row = [p.prompt_id, p.question, p.gold, list(p.choices), p.verifier]
        if p.shots:  # a prompt's few-shot examples are part of it (absent: the fingerprint of a run without them)
            row.append([s.prompt_id for s in p.shots])
        h.update(json.dumps(row).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def epoch_order(n: int, seed: int, epoch: int, *, shuffle: bool = True) -> list[int]:
    """The visiting order of indices ``0..n-1`` in ``epoch`` (a seeded permutation, or ``range(n)``)."""
    order = list(range(n))
    if shuffle:
        random.Random(f"mrl-data-cursor:{seed}:{epoch}").shuffle(order)
    return order


class DataCursor:
    """Draws per-step prompt batches from ``problems`` deterministically from ``seed``; resumable."""

    def __init__(self, problems: Sequence[Problem], batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 source: str = "the dataset"):
        """``source`` names the dataset in errors (e.g. its file)."""
        if not problems:
            raise ValueError("DataCursor needs at least one problem; the dataset is empty")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.problems = tuple(problems)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.source = source
        self.fingerprint = fingerprint(self.problems)
        self.epoch = 0
        self.position = 0
        self._order = epoch_order(len(self.problems), seed, 0, shuffle=shuffle)

    def _advance_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        self._order = epoch_order(len(self.problems), self.seed, self.epoch, shuffle=self.shuffle)

    def next_batch(self) -> list[Problem]:
        """The next ``batch_size`` problems (continuing into the next epoch at the end of one)."""
        out: list[Problem] = []
        while len(out) < self.batch_size:
            if self.position == len(self._order):
                self._advance_epoch()
            take = min(self.batch_size - len(out), len(self._order) - self.position)
            out.extend(self.problems[i] for i in self._order[self.position : self.position + take])
            self.position += take
        return out

    def state_dict(self) -> dict[str, Any]:
        """The cursor's position as a JSON-able dict (save it with the checkpoint)."""
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "n_problems": len(self.problems),
            "fingerprint": self.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; a different dataset, seed, batch size or order is an error."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"data cursor state version {state.get('version')!r} is not {STATE_VERSION} (a checkpoint "
                             "of an older version); start a new run directory")
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(f"cannot resume: {self.source} differs from the dataset the run was trained on (its "
                             "fingerprint over prompt ids, questions, gold answers and choices changed); resume "
                             "with the run's own dataset, unedited")
        for key, mine in (
            ("n_problems", len(self.problems)),
            ("seed", self.seed),
            ("batch_size", self.batch_size),
            ("shuffle", self.shuffle),
        ):
            if state.get(key) != mine:
                raise ValueError(
                    f"cannot resume the data cursor: saved {key} = {state.get(key)!r} but this run has {mine!r}; "
                    "resume with the same dataset, seed and batch size as the saved run"
                )
        epoch, position = state["epoch"], state["position"]
        if not (
            isinstance(epoch, int)
            and epoch >= 0
            and isinstance(position, int)
            and 0 <= position <= len(self.problems)
        ):
            raise ValueError(f"data cursor state has invalid epoch/position {epoch!r}/{position!r}")
        self.epoch = epoch
        self.position = position
        self._order = epoch_order(len(self.problems), self.seed, epoch, shuffle=self.shuffle)
