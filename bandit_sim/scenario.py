"""Scenarios: P softmax policies' initial logits over C contexts x K arms, and the arms' rewards.

A :class:`Scenario` holds ``init_logits [P, C, K]`` (policy i's initial policy is
``pi_i0(.|c) = softmax(init_logits[i, c])``) and ``rewards [C, K]`` in [0, 1]: pulling arm k on
context c gives ``r ~ Bernoulli(rewards[c, k])``, and the arm counts as *correct* when
``rewards[c, k] >= SUCCESS_THRESHOLD`` (0.5). Scenarios are stored as ``.npz`` files with exactly
these two arrays (plus optional ``policy_names [P]`` and ``features [C, K, D]`` for the log-linear
model), so that they can be calibrated from measured LLM success rates.

:func:`generate_scenario` builds one from a :class:`ScenarioSpec`: contexts are split into a region
every policy is competent on (share ``overlap``), regions only one policy is competent on (round-robin
over the policies) and an ``unsolved`` region; on a context where only a peer is competent, a share
``hard_fraction`` gets *hard support* (``log pi_i0(correct) = hard_log_mass``, e.g. 1e-17) and the
rest soft support (``pi_i0(correct)`` in ``soft_mass``). Those hard contexts form the **rescue set**
(:func:`rescue_sets`): the learner (almost) never samples a correct arm there while a peer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared_interfaces.config_io import ConfigError
from shared_interfaces.records import SUCCESS_THRESHOLD


class ScenarioError(ValueError):
    """A scenario file or array is malformed; the message says what to fix."""


@dataclass(frozen=True)
class Scenario:
    """Validated scenario arrays (float64). ``features`` is only used by the log-linear model, ``kernel``
    ``[P, C, C]`` (symmetric, each policy's transfer between contexts, :class:`bandit_sim.models.KernelModel`) only
    by the kernel model. ``train`` ``[C]`` bool: the contexts a step draws its batch from (the LLM run's training
    pool); the others are only evaluated (held-out). None: every context is trained on."""

    init_logits: np.ndarray
    rewards: np.ndarray
    policy_names: tuple[str, ...]
    features: np.ndarray | None = None
    kernel: np.ndarray | None = None
    train: np.ndarray | None = None

    def __post_init__(self) -> None:
        init, rew = validate_arrays(self.init_logits, self.rewards, where="scenario")
        object.__setattr__(self, "init_logits", init)
        object.__setattr__(self, "rewards", rew)
        if len(self.policy_names) != init.shape[0]:
            raise ScenarioError(
                f"scenario: {len(self.policy_names)} policy names for {init.shape[0]} policies in init_logits"
            )
        if len(set(self.policy_names)) != len(self.policy_names):
            raise ScenarioError(f"scenario: policy names {list(self.policy_names)} repeat a name; give each policy "
                                "its own (the metrics are keyed by name)")
        if self.features is not None:
            feats = np.asarray(self.features, dtype=np.float64)
            if feats.ndim != 3 or feats.shape[:2] != rew.shape:
                raise ScenarioError(
                    f"scenario: features must have shape [C, K, D] = [{rew.shape[0]}, {rew.shape[1]}, D], "
                    f"got {feats.shape}"
                )
            if not np.isfinite(feats).all():
                raise ScenarioError("scenario: features contain NaN or inf")
            object.__setattr__(self, "features", feats)
        P, C = init.shape[:2]
        if self.kernel is not None:
            ker = np.asarray(self.kernel, dtype=np.float64)
            if ker.shape != (P, C, C):
                raise ScenarioError(f"scenario: kernel must have shape [P, C, C] = [{P}, {C}, {C}], got {ker.shape}")
            if not np.isfinite(ker).all():
                raise ScenarioError("scenario: kernel contains NaN or inf")
            if not (ker.diagonal(axis1=1, axis2=2) > 0).all():
                raise ScenarioError("scenario: every kernel diagonal K(x, x) must be > 0 (a context's step on itself "
                                    "moves it); measure the kernel again (python -m mrl_llm kernel)")
            object.__setattr__(self, "kernel", ker)
        if self.train is not None:
            tr = np.asarray(self.train)
            if tr.shape != (C,) or tr.dtype != bool:
                raise ScenarioError(f"scenario: train must be a [C] = [{C}] bool mask, got {tr.dtype} {tr.shape}")
            if not tr.any():
                raise ScenarioError("scenario: train marks no context; a run needs at least one training context")
            object.__setattr__(self, "train", tr.copy())

    @property
    def train_index(self) -> np.ndarray:
        """The contexts a step draws from (:attr:`train`; all when None), ascending."""
        return np.arange(self.n_contexts) if self.train is None else np.flatnonzero(self.train)

    @property
    def n_policies(self) -> int:
        return self.init_logits.shape[0]

    @property
    def n_contexts(self) -> int:
        return self.init_logits.shape[1]

    @property
    def n_arms(self) -> int:
        return self.init_logits.shape[2]

    @property
    def correct(self) -> np.ndarray:
        """``[C, K]`` bool: arms whose reward probability reaches the success threshold."""
        return self.rewards >= SUCCESS_THRESHOLD

    def init_probs(self) -> np.ndarray:
        z = self.init_logits - self.init_logits.max(axis=-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=-1, keepdims=True)

    def correct_mass(self) -> np.ndarray:
        """``[P, C]``: each policy's initial probability of pulling a correct arm."""
        return (self.init_probs() * self.correct).sum(axis=-1)


#: The largest |init logit| a scenario may hold: softmax probabilities saturate long before (exp(-60) ~ 1e-26), and
#: beyond float32's range (3.4e38) a logit would be inf.
MAX_ABS_LOGIT = 1e6


def validate_arrays(init_logits, rewards, *, where: str = "scenario") -> tuple[np.ndarray, np.ndarray]:
    """Check shapes and values; return float64 copies. Errors name the array and the fix."""
    init, rew = (_real_array(a, name, where) for a, name in ((init_logits, "init_logits"), (rewards, "rewards")))
    if init.ndim != 3:
        raise ScenarioError(f"{where}: init_logits must have shape [P, C, K] (policies, contexts, arms), got {init.shape}")
    if rew.ndim != 2:
        raise ScenarioError(f"{where}: rewards must have shape [C, K] (contexts, arms), got {rew.shape}")
    if init.shape[1:] != rew.shape:
        raise ScenarioError(
            f"{where}: init_logits {init.shape} and rewards {rew.shape} disagree on [C, K]; "
            "init_logits[p] must be rewards-shaped"
        )
    P, C, K = init.shape
    if P < 1 or C < 1 or K < 2:
        raise ScenarioError(f"{where}: need P >= 1 policies, C >= 1 contexts and K >= 2 arms, got {init.shape}")
    if not np.isfinite(init).all():
        raise ScenarioError(
            f"{where}: init_logits contain NaN or inf; use a large negative finite logit (e.g. -60) for "
            "an arm the policy never pulls"
        )
    if np.abs(init).max() > MAX_ABS_LOGIT:
        raise ScenarioError(
            f"{where}: init_logits reach {np.abs(init).max():.3g}, beyond +-{MAX_ABS_LOGIT:g} (the simulator may "
            "compute in float32); use a large negative finite logit (e.g. -60) for an arm the policy never pulls"
        )
    if not np.isfinite(rew).all():
        raise ScenarioError(f"{where}: rewards contain NaN or inf")
    if rew.min() < 0.0 or rew.max() > 1.0:
        raise ScenarioError(
            f"{where}: rewards must be success probabilities in [0, 1], got range [{rew.min()}, {rew.max()}]"
        )
    return init.copy(), rew.copy()


def _real_array(a, name: str, where: str) -> np.ndarray:
    """``a`` as a float64 array, or a :class:`ScenarioError` naming ``name`` (text, complex numbers)."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "biuf":
        raise ScenarioError(f"{where}: {name} must hold real numbers, got dtype {arr.dtype} "
                            f"({'complex' if arr.dtype.kind == 'c' else 'not numbers'}); save float arrays")
    return arr.astype(np.float64)


def save_scenario(path: str | Path, scenario: Scenario) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "init_logits": scenario.init_logits,
        "rewards": scenario.rewards,
        "policy_names": np.array(scenario.policy_names, dtype=str),
    }
    if scenario.features is not None:
        arrays["features"] = scenario.features
    with open(p, "wb") as fh:
        np.savez(fh, **arrays)
    return p


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario ``.npz`` (``init_logits [P, C, K]``, ``rewards [C, K]``; optional ``policy_names``,
    ``features``). Never unpickles: object arrays are refused."""
    p = Path(path)
    if not p.exists():
        raise ScenarioError(f"scenario file {p} does not exist; pass --scenario FILE.npz or --preset NAME")
    if p.is_dir():
        raise ScenarioError(f"scenario {p} is a directory; pass --scenario FILE.npz")
    with open(p, "rb") as fh:
        magic = fh.read(4)
    if magic != b"PK\x03\x04":  # an .npz is a zip archive
        raise ScenarioError(f"scenario file {p} is {'empty' if not magic else 'not an .npz (a zip archive)'}; "
                            "write one with numpy.savez(path, init_logits=..., rewards=...) or bandit_sim scenario")
    try:
        with np.load(p, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError as err:
        raise ScenarioError(f"scenario file {p} is not a plain .npz of numeric arrays: {err}") from err
    except OSError as err:
        raise ScenarioError(f"scenario file {p} cannot be read as .npz: {err}") from err
    missing = [k for k in ("init_logits", "rewards") if k not in arrays]
    if missing:
        raise ScenarioError(f"scenario file {p} lacks array(s) {missing}; it must hold init_logits [P, C, K] and rewards [C, K]")
    unknown = sorted(set(arrays) - {"init_logits", "rewards", "policy_names", "features"})
    if unknown:
        raise ScenarioError(f"scenario file {p} has unknown array(s) {unknown}; known: init_logits, rewards, policy_names, features")
    init, rew = validate_arrays(arrays["init_logits"], arrays["rewards"], where=f"scenario file {p}")
    names = arrays.get("policy_names")
    if names is not None and names.ndim != 1:
        raise ScenarioError(f"scenario file {p}: policy_names must be a 1-D array of names, got shape {names.shape}")
    names_t = tuple(str(n) for n in names.tolist()) if names is not None else default_names(init.shape[0])
    return Scenario(init, rew, names_t, arrays.get("features"))


def default_names(n: int) -> tuple[str, ...]:
    return tuple(f"policy{i}" for i in range(n))


@dataclass(frozen=True)
class ScenarioSpec:
    """Generator settings (see the module docstring). Masses are probabilities of a correct arm."""

    n_contexts: int = 256
    n_arms: int = 32
    n_policies: int = 2
    n_correct: int = 1
    overlap: float = 0.5
    unsolved: float = 0.1
    hard_fraction: float = 0.5
    competent_mass: tuple[float, float] = (0.3, 0.7)
    soft_mass: tuple[float, float] = (0.01, 0.05)
    hard_log_mass: float = -40.0
    logit_scale: float = 1.0
    correct_reward: float = 1.0
    wrong_reward: float = 0.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_contexts < 1 or self.n_arms < 2 or self.n_policies < 1:
            raise ConfigError("scenario: need n_contexts >= 1, n_arms >= 2, n_policies >= 1")
        if not 1 <= self.n_correct < self.n_arms:
            raise ConfigError(f"scenario.n_correct must be in [1, n_arms), got {self.n_correct}")
        for name in ("overlap", "unsolved", "hard_fraction"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"scenario.{name} must be in [0, 1], got {v}")
        if self.overlap + self.unsolved > 1.0:
            raise ConfigError(f"scenario.overlap + unsolved must be <= 1, got {self.overlap + self.unsolved}")
        if self.seed < 0:
            raise ConfigError(f"scenario.seed must be >= 0, got {self.seed}")
        for name in ("competent_mass", "soft_mass"):
            if len(getattr(self, name)) != 2:
                raise ConfigError(f"scenario.{name} must be a range [lo, hi] of two numbers, got "
                                  f"{list(getattr(self, name))}")
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi < 1.0:
                raise ConfigError(f"scenario.{name} must be a range 0 < lo <= hi < 1, got {(lo, hi)}")
        if not self.logit_scale >= 0:
            raise ConfigError(f"scenario.logit_scale must be >= 0 (the spread of the random logits), got "
                              f"{self.logit_scale}")
        if not self.hard_log_mass < 0:
            raise ConfigError(f"scenario.hard_log_mass must be < 0 (a log-probability), got {self.hard_log_mass}")
        if not (self.correct_reward >= SUCCESS_THRESHOLD > self.wrong_reward >= 0.0 and self.correct_reward <= 1):
            raise ConfigError(
                f"scenario: need 0 <= wrong_reward < {SUCCESS_THRESHOLD} <= correct_reward <= 1, got "
                f"{self.wrong_reward}, {self.correct_reward}"
            )


def competence_regions(spec: ScenarioSpec, rng: np.random.Generator) -> np.ndarray:
    """``[P, C]`` bool: which policies are competent on each context (random context order)."""
    C, P = spec.n_contexts, spec.n_policies
    n_over = int(round(spec.overlap * C))
    n_uns = int(round(spec.unsolved * C))
    perm = rng.permutation(C)
    comp = np.zeros((P, C), dtype=bool)
    comp[:, perm[:n_over]] = True
    exclusive = perm[n_over : C - n_uns]
    for n, c in enumerate(exclusive):
        comp[n % P, c] = True
    return comp


def _logits_with_mass(z: np.ndarray, correct: np.ndarray, log_p: float) -> np.ndarray:
    """Shift the correct arms' logits so that their softmax mass is exactly ``exp(log_p)``."""
    log_a = np.logaddexp.reduce(np.where(correct, z, -np.inf))
    log_w = np.logaddexp.reduce(np.where(correct, -np.inf, z))
    log_1mp = np.log1p(-np.exp(log_p))
    delta = log_p - log_1mp - log_a + log_w
    return np.where(correct, z + delta, z)


def generate_scenario(spec: ScenarioSpec, names: tuple[str, ...] | None = None) -> Scenario:
    """A random scenario per ``spec`` (deterministic in ``spec.seed``)."""
    rng = np.random.default_rng(spec.seed)
    P, C, K = spec.n_policies, spec.n_contexts, spec.n_arms
    correct = np.zeros((C, K), dtype=bool)
    for c in range(C):
        correct[c, rng.choice(K, size=spec.n_correct, replace=False)] = True
    rewards = np.where(correct, spec.correct_reward, spec.wrong_reward)
    comp = competence_regions(spec, rng)
    peer_comp = np.stack([np.delete(comp, i, axis=0).any(axis=0) for i in range(P)]) if P > 1 else np.zeros_like(comp)
    hard = np.zeros((P, C), dtype=bool)
    for i in range(P):
        cand = np.flatnonzero(~comp[i] & peer_comp[i])
        n_hard = int(round(spec.hard_fraction * cand.size))
        hard[i, rng.choice(cand, size=n_hard, replace=False)] = True
    init = rng.normal(0.0, spec.logit_scale, size=(P, C, K))
    for i in range(P):
        for c in range(C):
            if comp[i, c]:
                log_p = np.log(rng.uniform(*spec.competent_mass))
            elif hard[i, c]:
                log_p = spec.hard_log_mass
            else:
                log_p = np.log(rng.uniform(*spec.soft_mass))
            init[i, c] = _logits_with_mass(init[i, c], correct[c], log_p)
    init -= init.max(axis=-1, keepdims=True)  # same policies, bounded logits
    return Scenario(init, rewards, names or default_names(P))


def rescue_sets(scenario: Scenario, eps: float = 1e-6, peer_min: float = 0.05) -> np.ndarray:
    """``[P, C]`` bool: policy i's rescue set — contexts where ``pi_i0(correct) < eps`` while some peer
    ``j != i`` has ``pi_j0(correct) >= peer_min``. Empty for a single policy."""
    mass = scenario.correct_mass()
    P = mass.shape[0]
    out = np.zeros(mass.shape, dtype=bool)
    for i in range(P):
        peers = np.delete(mass, i, axis=0)
        if peers.size:
            out[i] = (mass[i] < eps) & (peers.max(axis=0) >= peer_min)
    return out


def load_features(scenario: Scenario, dim: int, seed: int) -> np.ndarray:
    """The log-linear model's shared features ``[C, K, D]``: the scenario's own, or ``N(0, 1/D)`` draws
    from ``seed`` (the same for every policy, so an update on one context moves the others)."""
    if scenario.features is not None:
        return scenario.features
    rng = np.random.default_rng(seed)
    return rng.normal(0.0, 1.0 / np.sqrt(dim), size=(scenario.n_contexts, scenario.n_arms, dim))
