"""One rank of a policy, in parts that :class:`mrl_llm.worker.LLMPolicyWorker` composes.

* :mod:`.model` — the trainable state: the fp32 master model (FSDP2-sharded over the rank's group), the
  reference model, the rollout copy, the optimizer and its parameter groups; :meth:`PolicyModel.update`
  is one training step's update;
* :mod:`.engine` — the rollout engine (HF or vLLM): sampling, and the weight sync after an update with
  its drift check;
* :mod:`.prompts` — the policy's rendered prompts (template applied, encoded, cached by prompt id);
* :mod:`.rollouts` — a step's samples turned into scored :class:`~shared_interfaces.records.ExperienceRecord`;
* :mod:`.alignment` — peers' records in this policy's tokens (THL, cached by record id);
* :mod:`.scoring` — the verifiers, built once per name; :mod:`.evaluation` — the fixed eval protocol;
* :mod:`.checkpoint` — exports and checkpoints (full fp32 weights, gathered optimizer state, RNG state);
* :mod:`.seeds` — the seeds every part derives from (run seed, policy, purpose, ...);
* :mod:`.config` — :class:`~mrl_llm.rank.config.WorkerConfig`, what a rank is built from.

The parts import nothing from :mod:`mrl_llm.worker`; they are tested alone in ``tests/llm/rank/``.
"""
