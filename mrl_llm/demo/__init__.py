"""The CPU demo (``python -m mrl_llm demo``): two heterogeneous tiny policies with complementary skills,
mutual RL under every standard regime, a table and a plot. See :mod:`mrl_llm.demo.run`."""
