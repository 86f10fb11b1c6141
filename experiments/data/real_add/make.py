"""Writes the data of ``experiments/configs/real_cpu.yaml`` here: the ``add`` family (a + b, a, b in 0..19; issue 41,
item 2) split as the study splits it (``ArithmeticTask(("add",), eval_fraction=0.2, seed=0)``: 320 training, 80
held-out problems), in the default JSONL schema:

* ``pool.jsonl`` -- the RL pool: 64 training problems (``mrl_llm.demo.setup.rl_pool``, pool seed 0, the study's
  pool size per family);
* ``eval.jsonl`` -- what every evaluation scores: the pool, then the 80 held-out problems (the study's protocol:
  a prompt in the pool is ``train`` in the success matrix, the rest ``heldout``);
* ``examples.jsonl`` -- the few-shot examples (``few_shot.data``): the other 256 training problems, neither in the
  pool nor held out.

Run from the repository root: ``python experiments/data/real_add/make.py``; it writes the same files every time."""

from pathlib import Path

from mrl_llm.data import write_jsonl
from mrl_llm.demo.setup import rl_pool
from mrl_llm.rewards import ArithmeticTask

POOL_SIZE, POOL_SEED = 64, 0

if __name__ == "__main__":
    here = Path(__file__).parent
    task = ArithmeticTask(families=("add",), eval_fraction=0.2, seed=0)
    pool = rl_pool(task, POOL_SIZE, POOL_SEED)
    in_pool = {p.prompt_id for p in pool}
    examples = [p for p in task.problems("train") if p.prompt_id not in in_pool]
    for name, rows in (("pool", pool), ("eval", pool + task.problems("eval")), ("examples", examples)):
        path = write_jsonl(rows, here / f"{name}.jsonl")
        print(path, len(rows))
