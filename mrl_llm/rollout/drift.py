"""The drift checks: does the rollout engine sample from the trainer's current weights?

**The sample check** (:func:`check_drift`, the vLLM engine's, after every weight sync): the engine samples a few
short probe responses; the trainer recomputes their log-probs (:func:`mrl_llm.logprobs.response_logprobs`) and
the check compares, token by token,

    drift = mean_t | l_engine(y_t) - l_trainer(y_t) |

over all probe tokens. At equal weights and dtype this is float error (~1e-6 in fp32); a bf16 engine
against an fp32 trainer is ~1e-2; stale or mis-loaded weights give O(1). The mean is logged at every
sync. Above ``threshold`` (or not a number: a NaN log-prob on either side), ``on_exceed = "stop"`` raises :class:`DriftError`, naming the fix, and
``"warn"`` logs a warning and returns the report with ``exceeded`` set (the policy default for bf16,
whose few-token probe is noisy: one noisy probe must not end a two-day run).

It cannot see a reload that did not take effect: one update at lr 1e-6 moves the log-probs by ~1e-3 nats, far
below a bf16 engine's ~1e-2 of dtype noise. **The reload check** (:func:`reload_check`, every engine and copy
that holds weights of its own: a vLLM engine, a k > 1 rank's HF rollout copy, a split policy's rollout actors)
measures the engine's *movement* against the trainer's instead. On a fixed probe ``P`` (:func:`reload_probe`:
seeded token ids, the same in every process of the policy), scored at temperature 1 in the engine's compute
dtype (the trainer: its weights under the precision's autocast, as the HF engine samples),

    e_old, e_new = the engine's log-probs of P before and after the reload
    r_old, r_new = the trainer's log-probs of P at the previous sync and now
    move = mean_t | r_new - r_old |        engine_move = mean_t | e_new - e_old |
    err  = mean_t | (e_new - e_old) - (r_new - r_old) |

    exact engine:  exceeded iff err > max(reload_floor, RELOAD_RATIO * move)
    otherwise:     exceeded iff move > reload_floor and engine_move < RELOAD_MAGNITUDE_RATIO * move
    (and either way when a value is NaN)

An *exact* engine computes what the trainer's reference computes (an HF engine's copy: the same weights through
the same code under the same autocast; an fp32 vLLM engine: float rounding apart): a reload that took effect moves
it as the trainer moved (``err`` ~ 0), one that did not leaves ``e_new = e_old``, so ``err = move`` — caught
whenever the update moved the probe by more than ``reload_floor`` (default 1e-5 nats); a partial reload shows too.
A low-precision engine with weights of its own (a bf16 vLLM engine) rounds a small update into scattered one-ulp
flips, and its kernels turn them into a movement of the right size but not the trainer's direction (measured on
the CPU at lr 1e-6: ``err`` ~ ``move`` ~ ``engine_move`` ~ 4e-4 nats): there the check is that the engine moved
at all as much as a quarter of the trainer's movement — a reload that did not take effect leaves a deterministic
engine exactly where it was (``engine_move = 0``). An update the compute dtype rounds away entirely moves
nothing and cannot be told from no reload. The dtype's static offset cancels in the differences. ``on_exceed`` as
above.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

from mrl_llm.rollout.base import RolloutEngine, SamplingConfig

#: a check's report (:class:`DriftReport` or :class:`ReloadReport`)
R = TypeVar("R", "DriftReport", "ReloadReport")

log = logging.getLogger(__name__)


class DriftError(RuntimeError):
    """The engine's log-probs disagree with the trainer's beyond the configured threshold."""


@dataclass(frozen=True)
class DriftConfig:
    threshold: float = 0.05  # mean |delta| in nats; fp32 engine + fp32 trainer: use ~1e-3
    n_prompts: int = 2
    max_new_tokens: int = 8
    temperature: float = 1.0
    seed: int = 1234
    enabled: bool = True
    on_exceed: str = "stop"  # stop | warn
    reload_floor: float = 1e-5  # the reload check's absolute floor in nats (module docstring)

    def __post_init__(self) -> None:
        if not self.reload_floor > 0:
            raise ValueError(f"drift reload_floor must be > 0 (nats), got {self.reload_floor}")
        if self.on_exceed not in ("stop", "warn"):
            raise ValueError(f"drift on_exceed must be 'stop' or 'warn', got {self.on_exceed!r}")
        if not self.threshold > 0:
            raise ValueError(f"drift threshold must be > 0, got {self.threshold}")
        if self.n_prompts < 1 or self.max_new_tokens < 1:
            raise ValueError("drift check: n_prompts and max_new_tokens must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"drift temperature must be > 0 (the policy's sampling temperature), got {self.temperature}")


@dataclass(frozen=True)
class DriftReport:
    mean_abs: float
    max_abs: float
    n_tokens: int
    version: int = 0
    exceeded: bool = False  # mean_abs > threshold or NaN (only ever True with on_exceed = "warn")


def logprob_drift(
    engine_lps: Sequence[Sequence[float]], trainer_lps: Sequence[Sequence[float]], *, version: int = 0
) -> DriftReport:
    """Mean and max ``|engine - trainer|`` over all tokens (responses must have equal lengths)."""
    if len(engine_lps) != len(trainer_lps):
        raise ValueError(f"{len(engine_lps)} engine responses but {len(trainer_lps)} trainer responses")
    diffs = []
    for i, (a, b) in enumerate(zip(engine_lps, trainer_lps, strict=True)):
        if len(a) != len(b):
            raise ValueError(f"response {i}: {len(a)} engine log-probs but {len(b)} trainer log-probs")
        diffs.extend(abs(float(x) - float(y)) for x, y in zip(a, b, strict=True))
    if not diffs:
        raise ValueError("no tokens to compare; the probe responses are empty")
    t = torch.tensor(diffs, dtype=torch.float64)
    return DriftReport(float(t.mean()), float(t.max()), len(diffs), version)


def check_drift(
    engine: RolloutEngine,
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    cfg: DriftConfig,
    *,
    pad_id: int,
    version: int = 0,
) -> DriftReport:
    """Sample probe responses from ``engine``, recompute them with ``model``, log and check the drift."""
    from mrl_llm.logprobs import response_logprobs

    probes = [list(p) for p in prompts[: cfg.n_prompts]]
    if not probes:
        raise ValueError("drift check: no probe prompts; pass at least one prompt (token ids)")
    sp = SamplingConfig(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    samples = [group[0] for group in engine.generate(probes, 1, sp)]
    again = response_logprobs(model, probes, [s.token_ids for s in samples], pad_id=pad_id,
                              temperature=cfg.temperature)
    report = logprob_drift([s.logprobs for s in samples], again, version=version)
    log.info("rollout drift after weight sync v%d: mean |dlogp| %.3g (max %.3g) over %d tokens",
             version, report.mean_abs, report.max_abs, report.n_tokens)
    if not report.mean_abs <= cfg.threshold:  # NaN too: a NaN log-prob must not pass the check
        msg = (f"rollout engine log-probs differ from the trainer's by {report.mean_abs:.3g} nats per token on "
               f"average (max {report.max_abs:.3g}, {report.n_tokens} tokens) after weight sync v{version}, "
               f"above the threshold {cfg.threshold:g}: the engine is sampling from stale or mis-loaded weights "
               "(check the weight names the sync sends), or runs in another dtype than the trainer "
               "(raise drift.threshold for a bf16 engine against an fp32 trainer)")
        if math.isnan(report.mean_abs):
            msg = (f"the log-probs of the {report.n_tokens} probe tokens are not all finite (NaN) after weight sync "
                   f"v{version}: the trainer's (or the engine's) weights hold NaN/inf (training diverged: restore a "
                   "checkpoint, lower the learning rate)")
        report = exceeded(report, msg, cfg)
    return report


def exceeded(report: R, msg: str, cfg: DriftConfig) -> R:
    """A check past its bound: ``on_exceed: stop`` raises :class:`DriftError` with ``msg``; ``warn`` logs it and
    returns ``report`` marked ``exceeded``."""
    if cfg.on_exceed == "stop":
        raise DriftError(msg + "; drift.on_exceed: warn keeps training")
    log.warning("%s; training goes on (drift.on_exceed: warn)", msg)
    return replace(report, exceeded=True)


#: The reload check's relative bound for an exact engine: its movement may miss the trainer's by this share of it.
RELOAD_RATIO = 0.5
#: The reload check's bound for a low-precision engine: it must move at least this share of the trainer's movement.
RELOAD_MAGNITUDE_RATIO = 0.25
#: The reload probe's prompt length in tokens (its responses are ``DriftConfig.max_new_tokens`` long).
RELOAD_PROMPT_LEN = 8


@dataclass(frozen=True)
class ReloadProbe:
    """Fixed probe rows for the reload check: ``prompts`` and ``responses`` (token ids)."""

    prompts: tuple[tuple[int, ...], ...]
    responses: tuple[tuple[int, ...], ...]


def reload_probe(vocab_size: int, cfg: DriftConfig) -> ReloadProbe:
    """``cfg.n_prompts`` rows of :data:`RELOAD_PROMPT_LEN` prompt and ``cfg.max_new_tokens`` response token ids,
    uniform over ``[0, vocab_size)`` from ``cfg.seed``: every process of a policy builds the same probe, so the
    trainers' log-probs of it can travel with the weights. Arbitrary tokens move under an update as sampled ones do."""
    if vocab_size < 1:
        raise ValueError(f"reload probe: vocab_size must be >= 1, got {vocab_size}")
    g = torch.Generator().manual_seed(cfg.seed)
    rows = torch.randint(0, vocab_size, (cfg.n_prompts, RELOAD_PROMPT_LEN + cfg.max_new_tokens), generator=g)
    return ReloadProbe(tuple(tuple(r[:RELOAD_PROMPT_LEN].tolist()) for r in rows),
                       tuple(tuple(r[RELOAD_PROMPT_LEN:].tolist()) for r in rows))


def model_vocab_size(model: torch.nn.Module) -> int:
    """The token ids ``model`` takes: its config's ``vocab_size`` (its input embedding's rows when it names none)."""
    n = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(n) if n else int(model.get_input_embeddings().num_embeddings)


def probe_logprobs(model: torch.nn.Module, probe: ReloadProbe,
                   autocast: Callable[[], AbstractContextManager] = nullcontext) -> list[list[float]]:
    """``model``'s log-probs of ``probe``'s responses at temperature 1 under ``autocast`` (the compute dtype)."""
    from mrl_llm.logprobs import response_logprobs

    with autocast():
        return response_logprobs(model, probe.prompts, probe.responses, pad_id=0, temperature=1.0)


@dataclass(frozen=True)
class ReloadReport:
    """One reload check (module docstring): ``err``, ``move`` and ``engine_move`` in nats per token, ``exact`` (which
    bound applied), ``exceeded`` (only ever True with ``on_exceed = "warn"``)."""

    err: float
    move: float
    engine_move: float
    exact: bool
    n_tokens: int
    version: int = 0
    exceeded: bool = False


def _flat(lps: Sequence[Sequence[float]], what: str, n: int | None = None) -> torch.Tensor:
    t = torch.tensor([float(x) for row in lps for x in row], dtype=torch.float64)
    if n is not None and t.numel() != n:
        raise ValueError(f"reload check: {what} holds {t.numel()} log-probs, the others {n}; all four must score "
                         "the same probe")
    return t


def reload_check(engine_old: Sequence[Sequence[float]], engine_new: Sequence[Sequence[float]],
                 ref_old: Sequence[Sequence[float]], ref_new: Sequence[Sequence[float]], cfg: DriftConfig, *,
                 exact: bool = True, version: int = 0, where: str = "the rollout engine") -> ReloadReport:
    """The reload check of the module docstring on the probe's log-probs (each a list of rows); ``exact``: the engine
    computes what the reference computes (else a low-precision engine of its own weights); ``where`` names the
    engine or copy in the message. Raises :class:`DriftError` above the bound with ``on_exceed: stop``."""
    e0 = _flat(engine_old, "engine_old")
    if e0.numel() == 0:
        raise ValueError("reload check: the probe has no tokens; DriftConfig.max_new_tokens must be >= 1")
    e1, r0, r1 = (_flat(x, w, e0.numel()) for x, w in ((engine_new, "engine_new"), (ref_old, "ref_old"),
                                                         (ref_new, "ref_new")))
    err = float(((e1 - e0) - (r1 - r0)).abs().mean())
    move = float((r1 - r0).abs().mean())
    engine_move = float((e1 - e0).abs().mean())
    report = ReloadReport(err, move, engine_move, exact, int(e0.numel()), version)
    log.info("reload check after weight sync v%d (%s): trainer movement %.3g, engine movement %.3g, error %.3g",
             version, where, move, engine_move, err)
    if exact:
        ok = err <= max(cfg.reload_floor, RELOAD_RATIO * move)
        why = (f"its log-probs moved {err:.3g} nats per token away from the trainer's movement of {move:.3g} (bound "
               f"max(drift.reload_floor {cfg.reload_floor:g}, {RELOAD_RATIO:g} x movement))")
    else:
        ok = not move > cfg.reload_floor or engine_move >= RELOAD_MAGNITUDE_RATIO * move
        why = (f"its log-probs moved {engine_move:.3g} nats per token where the trainer's moved {move:.3g} (at least "
               f"{RELOAD_MAGNITUDE_RATIO:g} x that expected above drift.reload_floor {cfg.reload_floor:g})")
    if not ok or any(math.isnan(x) for x in (err, move, engine_move)):
        msg = (f"{where} did not take weight sync v{version}: {why} on {report.n_tokens} probe tokens: the reload left "
               "stale weights (check that the sync reaches the engine's own tensors and their names)")
        if any(math.isnan(x) for x in (err, move, engine_move)):
            msg = (f"the reload check's log-probs after weight sync v{version} ({where}) are not all finite (NaN): "
                   "the weights hold NaN/inf (training diverged: restore a checkpoint, lower the learning rate)")
        report = exceeded(report, msg, cfg)
    return report
