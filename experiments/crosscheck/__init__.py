"""Cross-check: calibrate the bandit from LLM runs, fit it on GRPO, predict the other regimes, compare.

``python -m experiments.crosscheck --llm-runs DIR --out DIR``. Pieces, in the order they run:
:mod:`~experiments.crosscheck.llm_runs` (read the runs), :mod:`bandit_sim.calibrate`
(step-0 success rates -> a scenario), :mod:`bandit_sim.fit` (the mirrored bandit run,
the fit), :mod:`bandit_sim.stats` (rank correlation, permutation p-values, precision /
recall), :mod:`~experiments.crosscheck.pipeline` (the numbers), :mod:`~experiments.crosscheck.report`.
"""
