"""The vLLM worker extension for in-place weight sync (loaded by name inside vLLM's worker processes).

vLLM mixes this class into its worker (``worker_extension_cls``), so its methods run in every worker;
the engine calls them through ``LLM.collective_rpc``. Weights travel as safetensors files in shared
memory (``/dev/shm``; RPC arguments are msgpack, which does not bring tensors back as tensors) and go
through vLLM's in-place ``reload_weights``: the model's own ``load_weights`` maps checkpoint names to
fused parameters (``q/k/v_proj`` -> ``qkv_proj``, ``gate/up_proj`` -> ``gate_up_proj``, tied
embeddings) and the backend's weight processing (e.g. the CPU backend's packed linear layers) is
redone layer by layer. A plain ``model.load_weights`` after start-up fails on such processed layers.

This module imports nothing from vLLM: it is imported only in processes that already run vLLM.
"""

from __future__ import annotations


class WeightSyncExtension:
    """Methods added to vLLM's worker (``self`` is the worker)."""

    def mrl_reload_weights(self, paths: list[str]) -> int:
        """Reload the weights in the safetensors files ``paths`` (Hugging Face checkpoint names) in
        place, in one ``reload_weights`` call (a layer must not be split across calls); returns the
        number of tensors read."""
        from safetensors import safe_open

        count = 0

        def weights():
            nonlocal count
            for path in paths:
                with safe_open(path, framework="pt", device="cpu") as f:
                    for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                        count += 1
                        yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=weights(), is_checkpoint_format=True)
        return count
