"""bandit_sim: a fast vectorised contextual-bandit simulator of the sharing regimes (GRPO, XGRPO, PRP, SGT).

Contexts stand for prompts and arms for responses; P softmax policies learn together under a regime of
:mod:`shared_interfaces.regimes`, whose math (advantages, gates, selections, weights, corrections) and
loss this package only calls. Entry points: ``python -m bandit_sim run | sweep | scenario``;
:func:`bandit_sim.runner.run_config`; the gymnasium id :data:`bandit_sim.env.ENV_ID` (registered when
:mod:`bandit_sim.env` is imported).
"""
