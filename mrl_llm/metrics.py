"""Metric logs: ``metrics.jsonl`` / ``eval.jsonl`` rows and TensorBoard scalars (when tensorboard is installed).

``metrics.jsonl`` rows (one per step and policy; ``kind`` says which)::

    {"kind": "train", "step": s, "policy": ..., "regime": ..., <the worker's step metrics>,
     "generation_s", "scoring_s", "exchange_thl_s", "update_s", "sync_s", "step_s",
     "publish_s", "fetch_s", "plan_s", "thl_s", "peer_check_s", "peer_verdict_rejected", "peer_reward_refused",
     "cum_samples", "cum_gen_tokens", "cum_train_tokens", "cum_flops"}
    {"kind": "eval", "step": t, "policy": ..., "eval_accuracy", "pass_at_k", "peer_exclusive_accuracy", ...}

A train row may carry ``"rolled_back": true`` (Ray runtime): its update was lost when the policy's
actor died and was restored from an older checkpoint (:func:`mark_rolled_back`); readers skip it.

A train row's ``step`` s is the step index (the policy has then taken s + 1 training steps); an eval
row's ``step`` t is the number of training steps taken (t = 0: before training). Non-finite numbers are
written as ``null`` (JSON has no NaN).

Train-row diagnostics (as verl logs them) are measured on the step's batch during its update, at the
weights that sampled it (before the step's optimizer update): ``entropy`` = mean token entropy of the
policy on its own sampled response tokens; ``kl_to_ref`` = mean per-token k3 estimate of
KL(pi || pi_ref) on the same tokens (pi_ref = the frozen initial weights; null when no reference is
kept); ``clip_fraction`` over the policy-gradient tokens; ``prp_ratio_var`` = Var[pi_old / mu] over
the PRP peer tokens (mu = the peer's THL-aligned trace, before truncation); ``prp_coef`` = the mean
truncated correction on ``thl`` rows; ``sgt_activations`` = prompts whose SGT gate opened;
``thl_*`` = the THL residual of the aligned peer records (:func:`mrl_llm.batch.thl_metrics`);
``logprob_drift_max`` = max |engine log-prob - trainer log-prob| on own tokens; ``padding_waste`` =
padded / real prompt + response tokens of the step's micro-batches (:mod:`mrl_llm.micro_batches`);
``drift_mean_abs`` / ``drift_exceeded`` = the vLLM engine's drift probe after the step's weight sync
(:mod:`mrl_llm.rollout.drift`); ``drift_reload_err`` / ``drift_reload_move`` / ``drift_reload_exceeded`` = the
reload check of an engine or copy with weights of its own (its log-prob movement over the sync against the
trainer's, on a fixed probe); ``peer_verdict_rejected`` / ``peer_reward_refused`` = peer records the
learner left out of the step because its own verifier disagrees with their claimed reward / their reward
is outside [0, 1] (:mod:`mrl_llm.peer_check`).

FLOPs are estimated with the usual dense-transformer rule: ``2 N`` per token for a forward pass and
``6 N`` for forward + backward, N = the parameters doing multiply-adds (all but the input embedding
table; attention's sequence-length term is left out): generation ``2 N (prompt + generated tokens)``,
update ``6 N`` per trained token plus ``2 N`` per token through the reference or snapshot passes.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("mrl_llm.metrics")


#: The parts a step's time is split into (they sum to ``step_s``): sampling, verifying, publishing +
#: fetching + planning + THL/batch building, the optimizer update, and pushing the new weights into the
#: rollout engine (0 for the HF engine, which samples from the trainer's own model).
TIMES = ("generation_s", "scoring_s", "exchange_thl_s", "update_s", "sync_s")
#: Every wall-clock column of a train row (what differs between two runs that are otherwise identical).
TIMING_KEYS = frozenset({*TIMES, "step_s", "peer_wait_s", "publish_s", "fetch_s", "plan_s", "thl_s", "peer_check_s"})


def train_row(step: int, policy: str, regime: str, gen: Mapping[str, Any], res: Mapping[str, Any]) -> dict[str, Any]:
    """A ``metrics.jsonl`` train row from one policy's step results: ``gen`` is what
    :meth:`PolicyActor.generate <mrl_llm.distributed.actors.PolicyActor.generate>` returned, ``res``
    what its ``train`` returned (the same in one process and under Ray). ``exchange_thl_s`` is
    everything of the step that is neither sampling, scoring, the update nor the weight sync: publish,
    fetch, the core's plans, THL and batch building. ``peer_wait_s`` (asynchronous mode: waiting for the
    peers' generation of the step) is idle time, reported apart and not part of ``step_s``.
    ``exchange_thl_s`` in detail (not summed again): ``publish_s`` (the policy's records into the
    exchange: sending them, plus, with pipelined publishing on Ray, waiting at the start of training
    until they are written), ``fetch_s`` (the peers' records out of it, including waiting for them to
    arrive), ``peer_check_s`` (re-scoring the peers' records, :mod:`mrl_llm.peer_check`), ``plan_s``
    (the core's regime plans) and
    ``thl_s`` (THL alignment and the training batch's token rows)."""
    g, m, t = gen["timings"], res["metrics"], res["timings"]
    c = res.get("counters") or {}
    update, sync = float(m.get("update_s", 0.0)), float(m.get("sync_s", 0.0))
    row = {"kind": "train", "step": step, "policy": policy, "regime": regime, **m,
           "stale_dropped": res["stale_dropped"], "peer_verdict_rejected": res.get("peer_verdict_rejected", 0),
           "peer_reward_refused": res.get("peer_reward_refused", 0), "peer_check_s": t.get("peer_check_s", 0.0),
           "generation_s": g["generation_s"], "scoring_s": g["scoring_s"],
           "exchange_thl_s": max(0.0, g["publish_s"] + t["fetch_plan_s"] + t["train_step_s"] - update - sync),
           "update_s": update, "sync_s": sync, "peer_wait_s": t.get("peer_wait_s", 0.0),
           "publish_s": g["publish_s"] + t.get("publish_wait_s", 0.0), "fetch_s": t.get("fetch_s"), "plan_s": t.get("plan_s"),
           **{k: g[k] for k in ("samples", "gen_tokens", "skipped_samples", "empty_responses", "truncated_responses")},
           "cum_samples": c.get("samples"), "cum_gen_tokens": c.get("gen_tokens"),
           "cum_train_tokens": c.get("train_tokens"), "cum_flops": c.get("flops")}
    row["step_s"] = sum(row[k] for k in TIMES)
    return row


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats -> None, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


class MetricsLog:
    """Appends rows to ``DIR/metrics.jsonl`` and ``DIR/eval.jsonl`` and mirrors scalars to TensorBoard."""

    def __init__(self, out_dir: str | Path, *, tensorboard: bool = True) -> None:
        self.out = Path(out_dir)
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(log_dir=str(self.out / "tensorboard"))
            except ImportError:
                log.info("tensorboard is not installed; writing metrics.jsonl only")

    def _append(self, name: str, rows: list[Mapping[str, Any]]) -> None:
        if not rows:
            return
        with open(self.out / name, "a", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps(clean(dict(r)), allow_nan=False) + "\n")

    def metrics(self, rows: list[Mapping[str, Any]]) -> None:
        self._append("metrics.jsonl", rows)
        if self.tb is None:
            return
        for r in rows:
            step = int(r["step"]) + (1 if r.get("kind") == "train" else 0)
            for k, v in r.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and math.isfinite(v):
                    self.tb.add_scalar(f"{r['policy']}/{r.get('kind', 'train')}/{k}", v, step)

    def eval_rows(self, rows: list[Mapping[str, Any]]) -> None:
        self._append("eval.jsonl", rows)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_metrics(path: str | Path, *, rolled_back: bool = False,
                 check: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``, without the train rows marked ``"rolled_back": true`` (see
    :func:`mark_rolled_back`) unless ``rolled_back=True``. A line that is not a JSON object is an error naming
    the file and line; so is a returned row that ``check`` refuses (it raises ``ValueError`` with the reason)."""
    p = Path(path)
    if not p.is_file():
        return []
    rows = []
    for k, line in enumerate(p.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{p}, line {k}: not a JSON row ({err}); repair or remove the line") from None
        if not isinstance(row, dict):
            raise ValueError(f"{p}, line {k}: not a JSON object; repair or remove the line")
        if not rolled_back and row.get("rolled_back"):
            continue
        if check is not None:
            try:
                check(row)
            except ValueError as err:
                raise ValueError(f"{p}, line {k}: {err}; repair or remove the line") from None
        rows.append(row)
    return rows


def mark_rolled_back(path: str | Path, policy: str, steps: Collection[int]) -> int:
    """Mark ``policy``'s train rows of ``steps`` in ``metrics.jsonl`` with ``"rolled_back": true``
    (the file is rewritten atomically); returns how many rows were marked.

    The rule (Ray runtime): when a policy's actor dies and is restored from its checkpoint of step
    ``c``, the updates of the steps after ``c`` that it had taken before it died (``c < t < f``, ``f``
    the step whose call failed) are gone from its weights; their train rows no longer describe the
    policy and are marked. Rows stay in the file for the record (the ``rejoin`` event in
    ``events.jsonl`` lists the steps); :func:`read_metrics`, and so reports and summaries, skip them.
    TensorBoard scalars already written are not retracted."""
    p, steps = Path(path), set(steps)
    if not p.is_file() or not steps:
        return 0
    lines = p.read_bytes().split(b"\n")
    marked, out = 0, []
    for line in lines[:-1]:
        if line.strip():
            r = json.loads(line)
            if r.get("kind", "train") == "train" and r.get("policy") == policy and r.get("step") in steps \
                    and not r.get("rolled_back"):
                r["rolled_back"] = True
                line = json.dumps(r).encode("utf-8")
                marked += 1
        out.append(line + b"\n")
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_bytes(b"".join(out) + lines[-1])
    os.replace(tmp, p)
    return marked
