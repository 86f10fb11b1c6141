"""The drift check: does the rollout engine sample from the trainer's current weights?

After a weight sync the engine samples a few short probe responses; the trainer recomputes their
log-probs (:func:`mrl_llm.logprobs.response_logprobs`) and the check compares, token by token,

    drift = mean_t | l_engine(y_t) - l_trainer(y_t) |

over all probe tokens. At equal weights and dtype this is float error (~1e-6 in fp32); a bf16 engine
against an fp32 trainer is ~1e-2; stale or mis-loaded weights give O(1). The mean is logged at every
sync. Above ``threshold`` (or not a number: a NaN log-prob on either side), ``on_exceed = "stop"`` raises :class:`DriftError`, naming the fix, and
``"warn"`` logs a warning and returns the report with ``exceeded`` set (the policy default for bf16,
whose few-token probe is noisy: one noisy probe must not end a two-day run).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from mrl_llm.rollout.base import RolloutEngine, SamplingConfig

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

    def __post_init__(self) -> None:
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
        if cfg.on_exceed == "stop":
            raise DriftError(msg + "; drift.on_exceed: warn keeps training")
        log.warning("%s; training goes on (drift.on_exceed: warn)", msg)
        report = replace(report, exceeded=True)
    return report
