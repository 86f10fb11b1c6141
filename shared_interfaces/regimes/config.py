"""Typed regime configuration: ``grpo``, ``xgrpo``, ``prp_snapshot``, ``prp_thl``, ``sgt`` and ``+`` combinations.

A regime name is one *base* (how the learner's policy-gradient batch and advantages are built) plus an
optional ``sgt`` term:

=================  ==============================================================================
``grpo``           own samples, advantages normalised within the learner's own group
``xgrpo``          own samples, advantages normalised with reward statistics pooled over all policies
``prp_snapshot``   own + peer samples, pooled-group advantages, peer ratio denominator = learner snapshot
``prp_thl``        own + peer samples, pooled-group advantages, peer denominator = THL-aligned peer trace
``sgt``            adds the success-gated NLL term; alone it sits on the ``grpo`` base
=================  ==============================================================================

Names combine with ``+`` in any order (``sgt+xgrpo`` == ``xgrpo+sgt``); :attr:`RegimeSpec.name` is the
canonical (sorted) form. Two bases cannot combine (``prp_thl+xgrpo`` is refused: PRP's pooled-group
advantages already are XGRPO's statistics). ``grpo+sgt`` is accepted and means ``sgt``.

These names are the same in every command line and file of the project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from shared_interfaces.config_io import ConfigError, from_mapping, to_mapping

BASES = ("grpo", "xgrpo", "prp_snapshot", "prp_thl")
ADDONS = ("sgt",)
REGIME_COMPONENTS = BASES + ADDONS
#: The five regimes every backend and demo runs.
STANDARD_REGIMES = ("grpo", "xgrpo", "prp_snapshot", "prp_thl", "sgt")

SelectionRule = Literal["shortest", "first", "random"]
SGTNormalize = Literal["batch", "prompt"]
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@dataclass(frozen=True)
class AdvantageConfig:
    """Group-normalised advantages ``A = (r - mean) / (std + eps)``; ``scale_by_std=False`` is Dr.GRPO's
    ``A = r - mean``."""

    eps: float = 1e-6
    scale_by_std: bool = True

    def __post_init__(self) -> None:
        if not self.eps > 0:
            raise ConfigError(f"advantage.eps must be > 0, got {self.eps}")


@dataclass(frozen=True)
class PRPConfig:
    """Peer Rollout Pooling.

    ``peer_weight`` scales every peer sample's policy-gradient term. ``ratio_cap`` truncates the
    behaviour correction ``c_t = pi_old(y_t) / mu(y_t)`` of a peer token (truncated importance sampling;
    see :func:`shared_interfaces.regimes.math.behaviour_correction`). ``max_peer_samples`` caps how
    many peer samples per prompt join the learner's batch (None: all, in canonical order); the pooled
    advantage statistics still use every policy's samples of the prompt (SPEC's pooled group, XGRPO's).
    """

    peer_weight: float = 1.0
    ratio_cap: float = 2.0
    max_peer_samples: int | None = None

    def __post_init__(self) -> None:
        if not self.peer_weight >= 0:
            raise ConfigError(f"prp.peer_weight must be >= 0, got {self.peer_weight}")
        if not self.ratio_cap > 0:
            raise ConfigError(f"prp.ratio_cap must be > 0, got {self.ratio_cap}")
        if self.max_peer_samples is not None and self.max_peer_samples < 0:
            raise ConfigError(f"prp.max_peer_samples must be >= 0, got {self.max_peer_samples}")


@dataclass(frozen=True)
class SGTConfig:
    """Success-Gated Transfer.

    ``weight`` is lambda; ``successes_per_prompt`` how many verified peer successes are transferred per
    rescued prompt; ``selection`` which ones: ``shortest`` (fewest tokens, ties in canonical order),
    ``first`` (canonical order) or ``random`` (uniform without replacement, from the caller's seeded
    generator). ``normalize`` says how lambda is shared among the step's K rescued prompts
    (:func:`shared_interfaces.losses.sgt_nll_loss`):

    * ``batch`` (default): ``L_SGT = -lambda * mean over all the batch's SGT tokens of log pi`` — a total
      weight of lambda per step whatever K; each rescued prompt gets about lambda / K (in proportion to
      its targets' tokens). The SGT term's size stays comparable to the policy-gradient term (also a
      mean), so one lambda works across batch sizes and gate rates; a prompt's pull weakens as more
      prompts are rescued.
    * ``prompt``: ``L_SGT = -lambda * sum over rescued prompts of (mean over that prompt's SGT tokens of
      log pi)`` — lambda per rescued prompt, a total of K * lambda: each rescue pulls as hard however
      many others happen in the step, and the term grows linearly with K (lower lambda, or expect larger
      steps, when many prompts open the gate). A prompt's mean is over its SGT tokens in the whole step (so it
      holds however the rows are split over micro-batches and ranks); when the LLM trainer cuts a step into
      several optimizer updates (``train.grad_accum``), a prompt whose SGT rows fall into two updates gives
      each the part of its mean that lies there.
    """

    weight: float = 1.0
    successes_per_prompt: int = 1
    selection: SelectionRule = "shortest"
    normalize: SGTNormalize = "batch"

    def __post_init__(self) -> None:
        if not self.weight >= 0:
            raise ConfigError(f"sgt.weight must be >= 0, got {self.weight}")
        if self.successes_per_prompt < 1:
            raise ConfigError(f"sgt.successes_per_prompt must be >= 1, got {self.successes_per_prompt}")
        if self.normalize not in ("batch", "prompt"):
            raise ConfigError(f"sgt.normalize must be 'batch' or 'prompt', got {self.normalize!r}")


@dataclass(frozen=True)
class LossConfig:
    """The clipped surrogate shared by every regime: separate low/high clip, aggregation, k3 KL.

    ``max_response_len`` is the constant divisor of Dr.GRPO's ``seq-mean-token-sum-norm`` (the generation
    budget). ``None`` (the default) means: the backend's own — the LLM backend sets it per learner to that
    policy's ``max_new_tokens``; the core, and the bandit (one-token responses), use 1
    (:attr:`dr_grpo_len`).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: LossAgg = "token-mean"
    kl_coef: float = 0.0
    max_response_len: int | None = None

    def __post_init__(self) -> None:
        if not (0 <= self.clip_low < 1):
            raise ConfigError(f"loss.clip_low must be in [0, 1), got {self.clip_low}")
        if not self.clip_high >= 0:
            raise ConfigError(f"loss.clip_high must be >= 0, got {self.clip_high}")
        if not self.kl_coef >= 0:
            raise ConfigError(f"loss.kl_coef must be >= 0, got {self.kl_coef}")
        if self.max_response_len is not None and self.max_response_len < 1:
            raise ConfigError(f"loss.max_response_len must be >= 1 (or null), got {self.max_response_len}")

    @property
    def dr_grpo_len(self) -> int:
        """The divisor ``seq-mean-token-sum-norm`` uses: ``max_response_len``, 1 when unset."""
        return 1 if self.max_response_len is None else self.max_response_len


@dataclass(frozen=True)
class RegimeSpec:
    """A parsed regime: its base, its optional SGT term and their settings."""

    base: str = "grpo"
    sgt_enabled: bool = False
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    prp: PRPConfig = field(default_factory=PRPConfig)
    sgt: SGTConfig = field(default_factory=SGTConfig)

    def __post_init__(self) -> None:
        if self.base not in BASES:
            raise ConfigError(f"regime base {self.base!r} is not one of {BASES}")

    @property
    def name(self) -> str:
        parts = [self.base] if (self.base != "grpo" or not self.sgt_enabled) else []
        if self.sgt_enabled:
            parts.append("sgt")
        return "+".join(sorted(parts))

    @property
    def pooled_advantages(self) -> bool:
        """XGRPO and PRP normalise with statistics pooled over all policies' groups for the prompt."""
        return self.base in ("xgrpo", "prp_snapshot", "prp_thl")

    @property
    def uses_peer_samples(self) -> bool:
        return self.base in ("prp_snapshot", "prp_thl")

    @property
    def random_plan(self) -> bool:
        """The plan draws random numbers (SGT's ``random`` selection): it needs a generator, and is not a
        function of the rewards alone."""
        return self.sgt_enabled and self.sgt.selection == "random"

    @property
    def denominator(self) -> Literal["snapshot", "thl"] | None:
        """The PRP ratio denominator, or None when the regime trains on no peer samples."""
        return {"prp_snapshot": "snapshot", "prp_thl": "thl"}.get(self.base)  # type: ignore[return-value]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "advantage": to_mapping(self.advantage)}
        if self.uses_peer_samples:
            d["prp"] = to_mapping(self.prp)
        if self.sgt_enabled:
            d["sgt"] = to_mapping(self.sgt)
        return d


def _split_name(name: str) -> tuple[str, bool]:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"regime name must be a non-empty string like 'sgt+xgrpo', got {name!r}")
    parts = [p.strip() for p in name.split("+")]
    unknown = [p for p in parts if p not in REGIME_COMPONENTS]
    if unknown:
        raise ConfigError(
            f"unknown regime component(s) {unknown} in {name!r}; known: {list(REGIME_COMPONENTS)} "
            "(combine with '+', e.g. 'sgt+xgrpo')"
        )
    if len(set(parts)) != len(parts):
        raise ConfigError(f"regime {name!r} names a component twice")
    bases = [p for p in parts if p in BASES]
    non_grpo = [b for b in bases if b != "grpo"]
    if len(non_grpo) > 1 or (len(bases) > 1 and "grpo" in bases):
        raise ConfigError(
            f"regime {name!r} combines bases {bases}; use one of {list(BASES)} plus optionally 'sgt' "
            "(PRP's pooled-group advantages already are XGRPO's statistics)"
        )
    return (bases[0] if bases else "grpo"), ("sgt" in parts)


def parse_regime(name: str, settings: Mapping[str, Any] | None = None) -> RegimeSpec:
    """Parse ``name`` (e.g. ``"sgt+xgrpo"``) with optional ``settings`` sections.

    ``settings`` may hold ``advantage``, ``prp`` and ``sgt`` mappings (and a ``name`` key equal to
    ``name`` or absent). Sections for components the regime does not use are validated and ignored,
    so one config file can serve a sweep over regimes. Unknown keys are errors.
    """
    base, sgt_enabled = _split_name(name)
    settings = dict(settings or {})
    given_name = settings.pop("name", None)
    if given_name is not None and _split_name(given_name) != (base, sgt_enabled):
        raise ConfigError(f"regime settings name {given_name!r} disagrees with regime {name!r}")
    known = {"advantage", "prp", "sgt"}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"regime: unknown key(s) {unknown}; known: {sorted(known | {'name'})}")

    def section(key: str) -> Any:  # an empty section (``sgt:``) is the defaults; ``sgt: false`` is an error
        return {} if settings.get(key) is None else settings[key]

    return RegimeSpec(
        base=base,
        sgt_enabled=sgt_enabled,
        advantage=from_mapping(AdvantageConfig, section("advantage"), where="regime.advantage"),
        prp=from_mapping(PRPConfig, section("prp"), where="regime.prp"),
        sgt=from_mapping(SGTConfig, section("sgt"), where="regime.sgt"),
    )


def parse_regime_config(data: Mapping[str, Any]) -> RegimeSpec:
    """Parse a ``regime:`` config section that carries its own ``name``."""
    if "name" not in data:
        raise ConfigError("regime: missing key 'name' (e.g. name: sgt+xgrpo)")
    rest = dict(data)
    return parse_regime(rest.pop("name"), rest)


def with_overrides(spec: RegimeSpec, **changes: Any) -> RegimeSpec:
    """A copy of ``spec`` with some sub-configs replaced, e.g. ``sgt=replace(spec.sgt, weight=0.5)``."""
    return replace(spec, **changes)


def idle_signal_warnings(spec: RegimeSpec, group_sizes: Mapping[str, int]) -> list[str]:
    """What in a run's setup leaves part of ``spec`` with nothing to do, one message each (empty: nothing).

    ``group_sizes`` maps each policy taking part to its group size ``G``.

    * **One policy.** There is no peer: XGRPO's pooled statistics are the policy's own group's, PRP pools
      no peer rollouts and SGT's gate never finds a peer success, so every regime trains as ``grpo``.
    * **A group of one under own-group statistics** (the ``grpo`` base, or any base with one policy):
      ``A_i = r_i - mean(r) = 0`` for the only sample, so the policy-gradient term is zero and only the KL
      (and an SGT) term moves the policy.

    These are warnings, not errors: a sweep may put them beside the regimes that do learn on purpose.
    """
    if not group_sizes:
        return []
    out: list[str] = []
    alone = len(group_sizes) == 1
    if alone and spec.name != "grpo":
        out.append(f"regime {spec.name}: the run has one policy and no peers, so it trains as grpo "
                   "(nothing to pool, no peer success for SGT); add a policy to share experience")
    if spec.base == "grpo" or alone:
        ones = sorted(name for name, g in group_sizes.items() if g == 1)
        if ones:
            out.append(f"regime {spec.name}: group_size 1 for {ones} under own-group statistics: every advantage "
                       "is r - mean(r) = 0, so the policy-gradient term is zero; set group_size >= 2"
                       + (" or use a pooled regime (xgrpo, prp_snapshot, prp_thl)" if not alone else ""))
    return out
