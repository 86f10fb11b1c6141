"""THL, the Tokenizer Heterogeneity Layer: peer responses and behaviour traces in the learner's tokens.

``align_trace(source_tokenizer, target_tokenizer, source_ids, source_logprobs, *, prompt_text=None)``
returns an :class:`AlignedTrace`; :func:`align_traces` does a batch. The rule, the EOS contract and the
residual are documented in :mod:`mrl_llm.thl.align`; text adaptation in :mod:`mrl_llm.thl.adapt` (peer side) and :mod:`mrl_llm.thl.encode` (learner side).
``python -m mrl_llm.thl report --source DIR --target DIR --data FILE.jsonl`` prints a pair's residual.
"""

from mrl_llm.thl.adapt import THLInputError
from mrl_llm.thl.align import align_trace, align_traces
from mrl_llm.thl.trace import AlignedTrace, Residual
from mrl_llm.thl.vocab import same_vocabulary

__all__ = ["AlignedTrace", "Residual", "THLInputError", "align_trace", "align_traces", "same_vocabulary"]
