"""The MWRA plan as text: a per-policy placement table and a per-device memory table (GiB)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mrl_llm.distributed.memory import GiB

if TYPE_CHECKING:
    from mrl_llm.distributed.planner import PlacementPlan

MEM_COLUMNS = ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead", "total")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    fmt = lambda r: "  ".join(v.rjust(w) if c else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True)))  # noqa: E731
    return [fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


_DEVICE = re.compile(r"(?P<node>.*/)(?P<kind>[a-z]+)(?P<index>\d*)$")


def devices_text(names: tuple[str, ...]) -> str:
    """A policy's devices in one table cell: runs of consecutive GPUs of one node as ``node0/gpu2..gpu5``,
    a node's RAM named once, runs joined by ", " (the first and last when there are more than three), and the
    count when there is more than one device; ``-`` for none."""
    if not names:
        return "-"
    runs: list[list[str]] = []
    for name in names:
        if runs and _follows(runs[-1][-1], name):
            runs[-1].append(name)
        else:
            runs.append([name])
    parts = [r[0] if r[0] == r[-1] else f"{r[0]}..{r[-1].split('/')[-1]}" for r in runs]
    text = ", ".join(parts) if len(parts) <= 3 else f"{parts[0]}, ..., {parts[-1]}"
    return text if len(names) == 1 else f"{text} ({len(names)})"


def _follows(prev: str, name: str) -> bool:
    """``name`` continues a run ending in ``prev``: the same node's RAM, or the same node's next GPU."""
    a, b = _DEVICE.match(prev), _DEVICE.match(name)
    if a is None or b is None or (a["node"], a["kind"]) != (b["node"], b["kind"]):
        return prev == name
    if not a["index"] or not b["index"]:
        return a["index"] == b["index"]
    return int(b["index"]) == int(a["index"]) + 1


def render_plan(plan: PlacementPlan) -> str:
    lines = [f"MWRA plan: mode={plan.mode} on {plan.cluster.describe()}", ""]
    rows = [
        [p.policy, f"{p.share:.2f}", f"{p.num_gpus:.2f}", devices_text(p.train_devices), devices_text(p.rollout_devices),
         f"{p.num_cpus:.2f}", str(p.threads), str(p.rollouts_per_step), str(p.rollout_concurrency),
         str(p.rollout_waves)]
        for p in plan.policies
    ]
    lines += _table(
        ["policy", "share", "gpus", "train on", "rollout on", "cpus", "threads", "rollouts/step",
         "in flight/engine", "waves"],
        rows,
    )
    lines += ["", "ranks (one Ray actor per bundle; a policy's ranks form one torch.distributed group):"]
    lines += [f"  {line}" for p in plan.policies for line in p.plan_lines()]
    lines += ["", "per-device memory estimate (GiB; usable = capacity x usable_fraction):"]
    rows = []
    for load in plan.devices:
        for part in load.parts:
            g = part.memory.gib()
            rows.append([load.device.name, f"{part.policy}:{part.role}", *(f"{g[c]:.2f}" for c in MEM_COLUMNS), ""])
        rows.append([load.device.name, "= device", *([""] * (len(MEM_COLUMNS) - 1)),
                     f"{load.used_bytes / GiB:.2f}", f"{load.usable_bytes / GiB:.2f}"])
    lines += _table(["device", "policy:role", *MEM_COLUMNS, "usable"], rows)
    return "\n".join(lines)
