"""Progress of runs in flight, read from their ``metrics.jsonl`` (nothing in a run is touched).

A run directory's progress is the number of distinct steps its ``metrics.jsonl`` holds train rows for
(every policy of a step writes one row; a step counts when any of them is there). A missing file is
0 steps (the run has not started training yet); a line being written (not yet valid JSON) or a
non-train row is skipped, so a run can be polled while it writes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path


def steps_done(run_dir: str | Path) -> int:
    """How many training steps the run in ``run_dir`` has logged (module docstring)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and row.get("kind") == "train" and isinstance(row.get("step"), int):
            steps.add(row["step"])
    return len(steps)


def progress_line(runs: Mapping[str, str | Path], total_steps: int, elapsed_s: float, *,
                  sfts: Sequence[str] = ()) -> str:
    """One line: ``progress after 95 s: seed0/grpo 40/100, seed0/sgt 38/100`` for ``{label: run_dir}``, with
    the SFTs still running named first (``SFT running: seed1/qwen-add; ...``)."""
    parts = [f"{label} {min(steps_done(d), total_steps)}/{total_steps}" for label, d in runs.items()]
    head = f"progress after {elapsed_s:.0f} s: "
    sft = f"SFT running: {', '.join(sfts)}" if sfts else ""
    if not parts:
        return head + (sft or "nothing in flight")
    return head + (sft + "; " if sft else "") + ", ".join(parts)
