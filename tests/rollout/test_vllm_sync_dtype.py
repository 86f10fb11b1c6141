"""What the vLLM engine's weight sync hands its workers (issue 38 item 6), without starting vLLM: floating-point
tensors in the engine's dtype (a bf16 engine gets the fp32 masters cast, never fp32), and tensors received already
in that dtype (a split policy's rollout actor's) go in as they are, not re-derived from the model."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from mrl_llm.rollout.vllm_engine import VLLMEngine, state_dict_for_sync
from tests.rollout.test_engine_support import model  # noqa: F401 - the fixture


def _engine(dtype: str, sent: list) -> VLLMEngine:
    eng = VLLMEngine.__new__(VLLMEngine)  # the sync path alone: a stand-in for vLLM's LLM
    eng.engine_args, eng.drift, eng.weights_version, eng._sleeping, eng.sleep_mode = {"dtype": dtype}, None, 0, set(), False

    def write(state):
        sent.append(dict(state))
        return []

    eng._write_buckets = write
    eng._llm = SimpleNamespace(collective_rpc=lambda name, args: [len(sent[-1])], reset_prefix_cache=lambda: True)
    return eng


def test_a_bf16_engine_gets_the_masters_cast_and_received_tensors_as_they_are(model):  # noqa: F811
    sent: list = []
    masters = state_dict_for_sync(model)
    _engine("bfloat16", sent).sync_weights(model)
    assert sent[0].keys() == masters.keys()
    assert all(v.dtype == torch.bfloat16 and torch.equal(v, masters[k].to(torch.bfloat16)) for k, v in sent[0].items())
    received = {k: v.to(torch.bfloat16) for k, v in masters.items()}
    _engine("bfloat16", sent).sync_weights(model, received)
    assert all(sent[1][k] is received[k] for k in received)  # no copy, no round trip through the fp32 model
    _engine("float32", sent).sync_weights(model)
    assert {v.dtype for v in sent[2].values()} == {torch.float32}
    empty = torch.nn.Module()
    _engine("bfloat16", sent).sync_weights(empty)  # a model without weights sends nothing
    assert sent[3] == {}
