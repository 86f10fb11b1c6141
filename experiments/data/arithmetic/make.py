"""Writes ``train.jsonl`` / ``eval.jsonl`` here: the synthetic arithmetic task (families add and mul, 20% of
each family held out, split seed 0) in the default JSONL schema. Run from the repository root:
``python experiments/data/arithmetic/make.py``."""

from pathlib import Path

from mrl_llm.data import write_jsonl
from mrl_llm.rewards import ArithmeticTask

if __name__ == "__main__":
    here = Path(__file__).parent
    task = ArithmeticTask(families=("add", "mul"), eval_fraction=0.2, seed=0)
    for split in ("train", "eval"):
        path = write_jsonl(task.problems(split), here / f"{split}.jsonl")
        print(path, sum(1 for _ in open(path)))
