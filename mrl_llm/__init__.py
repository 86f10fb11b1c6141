"""mrl_llm: the mutual-RL trainer for heterogeneous LLM policies (HF / vLLM engines, THL, Ray).

It calls the regime core in :mod:`shared_interfaces`; it never re-derives advantages, gates or weights.
"""
