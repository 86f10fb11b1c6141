"""Optimizer parameter groups by parameter name (``train.lr_groups``).

Each group is ``{match: GLOB, lr: LR}``: a parameter whose name (``model.named_parameters()``) matches
``GLOB`` (:func:`fnmatch.fnmatchcase`) is stepped at ``LR`` instead of ``train.lr``; the FIRST group that
matches wins, unmatched parameters keep ``train.lr``. ``lr: 0`` freezes the matched parameters (they are
left out of the optimizer). Why: at the demo's scale Adam steps every coordinate by about ``lr``, signal
or noise alike, so one ``lr`` cannot both move a cheap, consistent direction (the final norm's gain: how
sharply the policy samples) and leave the noisy embedding gradients alone
(``experiments/study/README.md``).

``sgt: false`` keeps a group's parameters out of SGT's term: they learn from the policy-gradient and KL
terms only (:func:`mrl_llm.update.run_update` back-propagates ``lambda L_SGT`` apart and restores their
gradients). Why: on a group stepped far faster than ``lr`` (the norms' gains at 3e-2 beside 3e-5) SGT's
NLL on a peer's text mostly warms the policy's sampling (it raises unlikely tokens most cheaply through the
gains) instead of teaching it the text (``experiments/study/README.md``). One process only (``ranks: 1``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from shared_interfaces.config_io import ConfigError


@dataclass(frozen=True)
class LrGroup:
    """Parameters whose name matches the glob ``match`` train at ``lr`` (0: frozen); ``sgt: False``: they take
    no gradient from SGT's term (module docstring)."""

    match: str
    lr: float
    sgt: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.match, str) or not self.match.strip():
            raise ConfigError(f"train.lr_groups[].match must be a non-empty glob over parameter names, "
                              f"got {self.match!r}")
        if not self.lr >= 0:
            raise ConfigError(f"train.lr_groups[{self.match!r}].lr must be >= 0 (0 freezes), got {self.lr}")
        if not isinstance(self.sgt, bool):
            raise ConfigError(f"train.lr_groups[{self.match!r}].sgt must be true or false, got {self.sgt!r}")


def split_param_groups(named_params: Iterable[tuple[str, Any]], groups: Sequence[LrGroup], base_lr: float, *,
                       policy: str) -> list[dict[str, Any]]:
    """The optimizer's ``param_groups``: one per :class:`LrGroup` with ``lr > 0`` that matched (in
    ``groups`` order, each with its ``lr``, ``"sgt"`` and ``"names"``), then the unmatched parameters at
    ``base_lr`` (``sgt`` True); parameters with ``requires_grad = False`` are skipped, empty groups dropped.

    Raises :class:`ConfigError` naming ``policy`` when a group matches no trainable parameter (a typo in
    the glob would otherwise silently train everything at ``base_lr``).
    """
    buckets: list[list[tuple[str, Any]]] = [[] for _ in groups]
    rest: list[tuple[str, Any]] = []
    for name, p in named_params:
        if not p.requires_grad:
            continue
        i = next((i for i, g in enumerate(groups) if fnmatchcase(name, g.match)), None)
        (rest if i is None else buckets[i]).append((name, p))
    out = []
    for g, b in zip(groups, buckets, strict=True):
        if not b:
            raise ConfigError(f"policy {policy!r}: train.lr_groups match {g.match!r} matches no trainable "
                              f"parameter (or an earlier group took them all); fix the glob (names look like "
                              f"'model.norm.weight')")
        if g.lr > 0:
            out.append({"params": [p for _, p in b], "lr": g.lr, "sgt": g.sgt, "names": [n for n, _ in b]})
    if rest:
        out.append({"params": [p for _, p in rest], "lr": base_lr, "sgt": True, "names": [n for n, _ in rest]})
    if not out and any(g.lr == 0 for g in groups):
        raise ConfigError(f"policy {policy!r}: train.lr_groups freeze every parameter; give at least one "
                          f"group (or train.lr) a rate > 0")
    return out
