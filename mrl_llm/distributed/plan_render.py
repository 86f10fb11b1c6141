"""The MWRA plan as text: a per-policy placement table and a per-device memory table (GiB)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mrl_llm.distributed.memory import GiB

if TYPE_CHECKING:
    from mrl_llm.distributed.planner import PlacementPlan

MEM_COLUMNS = ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead", "total")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    fmt = lambda r: "  ".join(v.rjust(w) if c else v.ljust(w) for c, (v, w) in enumerate(zip(r, widths, strict=True)))  # noqa: E731
    return [fmt(header), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def _devs(names: tuple[str, ...]) -> str:
    if not names:
        return "-"
    return names[0] if len(names) == 1 else f"{names[0]}..{names[-1].split('/')[-1]} ({len(names)})"


def render_plan(plan: PlacementPlan) -> str:
    lines = [f"MWRA plan: mode={plan.mode} on {plan.cluster.describe()}", ""]
    rows = [
        [p.policy, f"{p.share:.2f}", f"{p.num_gpus:.2f}", _devs(p.train_devices), _devs(p.rollout_devices),
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
