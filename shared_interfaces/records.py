"""Typed experience records: what crosses the Shared Experience Exchange (SEE).

A record is one sampled response of one policy to one prompt at one step. It is a frozen dataclass,
validated at construction; every error names the field and the producing policy. Serialisation is
JSON (one object a line in logs): floats are written with ``repr`` and read back bit-exactly, so the
round trip is lossless. Nothing here unpickles or evaluates anything read from disk or from a peer.

Views computed from rollout records (never stored in them): :class:`RewardStats` and
:func:`verified_successes`. THL-aligned traces are made by the consumer and cached by
``(record_id, target_tokenizer_id)`` in :class:`TraceCache`.
"""

from __future__ import annotations

import json
import math
import operator
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

try:  # orjson parses and writes the same JSON ~4x / ~2x faster; the stdlib is the fallback (same records)
    import orjson as _orjson
except ImportError:  # pragma: no cover - e.g. the GPU smoke path on a machine without it
    _orjson = None

SCHEMA_VERSION = 1
KNOWN_SCHEMA_VERSIONS = frozenset({1})

#: A sampled reward at or above this counts as a success (rewards are 0/1 from verifiers; partial
#: credit in [0, 1] counts only when it reaches the threshold).
SUCCESS_THRESHOLD = 0.5

#: The lowest behaviour log-prob a record may carry. Lower values are refused, not clamped: no sampler
#: draws a token of probability below ``e^-10000`` (float32 log-softmax bottoms out near -104), and a
#: finite value near ``-1e308`` overflows to ``-inf`` once two are added (THL pools a word's log-probs),
#: which turns THL's residual into NaN.
LOGPROB_FLOOR = -1e4

FinishReason = Literal["stop", "length"]
FINISH_REASONS = ("stop", "length")


#: Types refused where a number is expected (Python would convert them: ``float("1")``, ``int(True)``).
_NOT_NUMBERS = (str, bytes, bytearray, bool)
_NOT_NUMBER_TYPES = frozenset(_NOT_NUMBERS)
#: What a line that is not JSON raises: a syntax error, bytes that are not UTF-8, arrays nested too deep.
_BAD_JSON = (json.JSONDecodeError, UnicodeDecodeError, RecursionError)


class RecordValidationError(ValueError):
    """A record failed validation; the message names the field and the producing policy."""


def make_record_id(policy_id: str, step: int, prompt_id: str, sample_index: int) -> str:
    """The canonical id of the ``sample_index``-th response of ``policy_id`` to ``prompt_id`` at ``step``."""
    return f"{policy_id}/{step}/{prompt_id}/{sample_index}"


@dataclass(frozen=True)
class ExperienceRecord:
    """One rollout of one policy, as published to the exchange.

    ``token_ids`` are the response tokens in the producer's tokenizer (``tokenizer_id``) and
    ``token_logprobs`` the behaviour log-probs ``log mu(y_t | x, y_<t)`` of the producing policy
    version (log-softmax of logits / temperature over the full vocabulary), one per token.
    ``verified`` is True when ``reward`` was produced by a rule-based verifier named ``verifier``
    (not a learned judge); a *verified success* is ``verified and reward >= SUCCESS_THRESHOLD``.
    ``step`` is the exchange round (prompt batch) and ``policy_version`` the producer's weight
    version (optimizer steps taken); they differ only under asynchronous training.
    """

    record_id: str
    policy_id: str
    policy_version: int
    step: int
    prompt_id: str
    sample_index: int
    prompt_text: str
    response_text: str
    token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    tokenizer_id: str
    reward: float
    verified: bool
    verifier: str
    finish_reason: FinishReason
    advantage: float | None = None
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        # Normalise sequences to tuples so records are hashable and immutable. Values are converted only
        # when they are already of the right kind: a float token id (1.7), a string ("-0.5", or "12" for a
        # whole list) or a bool is refused, not coerced.
        object.__setattr__(self, "token_ids", self._sequence("token_ids", self.token_ids, operator.index,
                                                             "an integer"))
        object.__setattr__(self, "token_logprobs", self._sequence("token_logprobs", self.token_logprobs,
                                                                  float, "a number"))
        if isinstance(self.reward, _NOT_NUMBERS):
            self._fail("reward", f"= {self.reward!r} must be a number")
        try:
            object.__setattr__(self, "reward", float(self.reward))
        except (TypeError, ValueError, OverflowError):
            self._fail("reward", f"= {self.reward!r} must be a finite number")
        self._validate()

    def _sequence(self, name: str, values: Any, convert: Callable[[Any], Any], item: str) -> tuple:
        """``values`` as a tuple of ``convert``-ed items; a record validation error when ``values`` is not
        a sequence (a string, a mapping, a scalar) or holds a string, a bool or something ``convert`` refuses."""
        if isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
            self._fail(name, f"= {values!r:.80} must be a list, each item {item}")
        values = tuple(values)
        if not _NOT_NUMBER_TYPES.isdisjoint(map(type, values)):
            i = next(i for i, v in enumerate(values) if isinstance(v, _NOT_NUMBERS))
            self._fail(name, f"[{i}] = {values[i]!r:.80} must be {item}")
        try:
            return tuple(map(convert, values))
        except (TypeError, ValueError, OverflowError) as err:
            self._fail(name, f"holds an item that is not {item} ({err})")
            raise  # unreachable: _fail raises

    # -- validation -------------------------------------------------------------------------
    def _fail(self, fieldname: str, problem: str) -> None:
        raise RecordValidationError(
            f"experience record {self.record_id!r} from policy {self.policy_id!r}: field "
            f"'{fieldname}' {problem}"
        )

    def _validate(self) -> None:
        if type(self.schema_version) is not int or self.schema_version not in KNOWN_SCHEMA_VERSIONS:
            self._fail(
                "schema_version",
                f"= {self.schema_version} is unknown (this build reads {sorted(KNOWN_SCHEMA_VERSIONS)}); "
                "upgrade mutual-rl on the reading side",
            )
        for name in ("record_id", "policy_id", "prompt_id", "tokenizer_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                self._fail(name, f"= {value!r} must be a non-empty string")
        for name in ("prompt_text", "response_text", "verifier"):
            value = getattr(self, name)
            if not isinstance(value, str):
                self._fail(name, f"= {value!r} must be a string")
        for name in ("policy_version", "step", "sample_index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                self._fail(name, f"= {value!r} must be a non-negative integer")
        if not isinstance(self.verified, bool):
            self._fail("verified", f"= {self.verified!r} must be a bool")
        if self.finish_reason not in FINISH_REASONS:
            self._fail("finish_reason", f"= {self.finish_reason!r} must be one of {FINISH_REASONS}")
        if len(self.token_ids) != len(self.token_logprobs):
            self._fail(
                "token_logprobs",
                f"has {len(self.token_logprobs)} entries but token_ids has {len(self.token_ids)}; "
                "lengths must match (one behaviour log-prob per response token)",
            )
        ids, lps = self.token_ids, self.token_logprobs
        if ids and min(ids) < 0:  # the scans run in C; the index is looked up only on failure
            i = next(i for i, tok in enumerate(ids) if tok < 0)
            self._fail("token_ids", f"[{i}] = {ids[i]} is negative; token ids are non-negative")
        if not all(map(math.isfinite, lps)):
            i = next(i for i, lp in enumerate(lps) if not math.isfinite(lp))
            self._fail("token_logprobs", f"[{i}] = {lps[i]} is not finite")
        if lps and max(lps) > 0.0:
            i = next(i for i, lp in enumerate(lps) if lp > 0.0)
            self._fail("token_logprobs", f"[{i}] = {lps[i]} is positive; log-probs must be <= 0")
        if lps and min(lps) < LOGPROB_FLOOR:
            i = next(i for i, lp in enumerate(lps) if lp < LOGPROB_FLOOR)
            self._fail("token_logprobs", f"[{i}] = {lps[i]} is below {LOGPROB_FLOOR:g} (LOGPROB_FLOOR); no sampler "
                       "draws such a token: check the producer's log-prob computation")
        if not math.isfinite(self.reward):
            self._fail("reward", f"= {self.reward} is not finite")
        if self.advantage is not None and (isinstance(self.advantage, bool) or not isinstance(self.advantage, (int, float))):
            self._fail("advantage", f"= {self.advantage!r} must be a number or null")
        if self.advantage is not None and not _finite(self.advantage):
            self._fail("advantage", f"= {self.advantage} is not finite")

    # -- views ------------------------------------------------------------------------------
    @property
    def is_success(self) -> bool:
        """Reward at or above :data:`SUCCESS_THRESHOLD` (verified or not)."""
        return self.reward >= SUCCESS_THRESHOLD

    @property
    def is_verified_success(self) -> bool:
        """A success whose reward came from a rule-based verifier: the only kind SGT may transfer."""
        return self.verified and self.is_success

    # -- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``dataclasses.asdict`` without its recursive deep copy), sequences as lists."""
        d = {name: getattr(self, name) for name in _FIELD_NAMES}
        d["token_ids"] = list(self.token_ids)
        d["token_logprobs"] = list(self.token_logprobs)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperienceRecord:
        if not isinstance(data, dict):
            raise RecordValidationError(f"an experience record must be a JSON object (dict), got {type(data).__name__}")
        if data.keys() == _FIELD_SET:  # the common case: every field, nothing else
            return _fast_record(cls, data) or cls(**data)
        unknown = sorted(set(data) - _FIELD_SET)
        producer = data.get("policy_id", "?")
        if unknown:
            raise RecordValidationError(
                f"experience record {data.get('record_id', '?')!r} from policy {producer!r}: unknown "
                f"field(s) {unknown} (schema version {data.get('schema_version', '?')})"
            )
        missing = sorted(n for n in _FIELD_NAMES if n not in data and n not in ("advantage", "schema_version"))
        if missing:
            raise RecordValidationError(
                f"experience record {data.get('record_id', '?')!r} from policy {producer!r}: missing "
                f"field(s) {missing}"
            )
        return cls(**data)

    def to_json(self) -> str:
        """One JSON object, no newline, UTF-8 text unescaped. Floats are written as their shortest
        round-trip repr (``orjson``, else ``json`` with ``repr``): the round trip is bit-exact."""
        d = self.to_dict()
        if _orjson is not None:
            try:
                return _orjson.dumps(d).decode()
            except TypeError:  # a lone surrogate in a text: not UTF-8; the stdlib escapes it (\udXXX)
                return json.dumps(d, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return json.dumps(d, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str | bytes) -> ExperienceRecord:
        try:
            data = _orjson.loads(line) if _orjson is not None else json.loads(line)
        except _BAD_JSON as err:  # orjson.JSONDecodeError subclasses json's
            try:  # the stdlib also reads escaped lone surrogates, which orjson refuses
                data = json.loads(line)
            except _BAD_JSON:
                raise RecordValidationError(f"experience record line is not valid JSON: {err}") from err
        if not isinstance(data, dict):
            raise RecordValidationError("experience record line must hold a JSON object")
        return cls.from_dict(data)


def _finite(x: float) -> bool:
    """``math.isfinite``, False (not OverflowError) for an int too large for a float."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


_FIELD_NAMES: tuple[str, ...] = tuple(f.name for f in fields(ExperienceRecord))
_FIELD_SET = frozenset(_FIELD_NAMES)
_INT_TYPES = frozenset({int})
_NUMBER_TYPES = frozenset({int, float})


def _fast_record(cls: type[ExperienceRecord], data: dict[str, Any]) -> ExperienceRecord | None:
    """``cls(**data)`` for a record parsed from JSON, ~3x faster: when the token ids are a list of
    ints and the log-probs a list of numbers (what JSON gives), the instance is filled directly and
    validated as ``__post_init__`` would; anything else returns None (the caller takes the slow path,
    which converts or rejects it). Equal to ``cls(**data)`` whenever it returns a record."""
    ids, lps, reward = data["token_ids"], data["token_logprobs"], data["reward"]
    if (type(ids) is not list or type(lps) is not list or type(reward) not in _NUMBER_TYPES
            or not set(map(type, ids)) <= _INT_TYPES or not set(map(type, lps)) <= _NUMBER_TYPES):
        return None
    try:
        lps, reward = tuple(map(float, lps)), float(reward)
    except OverflowError:  # an int too large for a float: the slow path names the field
        return None
    rec = object.__new__(cls)
    d = rec.__dict__
    d.update(data)
    d["token_ids"] = tuple(ids)
    d["token_logprobs"] = lps
    d["reward"] = reward
    rec._validate()
    return rec


def dump_jsonl(records: Iterable[ExperienceRecord]) -> str:
    """Records as JSON lines (each line ends with a newline)."""
    return "".join(r.to_json() + "\n" for r in records)


def load_jsonl(text: str) -> list[ExperienceRecord]:
    """Parse JSON lines written by :func:`dump_jsonl`; blank lines are skipped.

    Lines are split on ``"\n"`` only: JSON escapes it inside strings, but not the other characters
    :meth:`str.splitlines` breaks on (U+2028, U+0085, ...), which may occur raw in a response text.
    """
    return [ExperienceRecord.from_json(line) for line in text.split("\n") if line.strip()]


def canonical_key(record: ExperienceRecord) -> tuple[str, int, str]:
    """Canonical order of records inside a prompt group: by policy id, then sample index, then id."""
    return (record.policy_id, record.sample_index, record.record_id)


@dataclass(frozen=True)
class RewardStats:
    """Reward statistics of a set of rollouts: ``n``, ``mean``, unbiased ``std`` (0 when n < 2),
    ``n_success`` and ``n_verified_success``."""

    n: int
    mean: float
    std: float
    n_success: int
    n_verified_success: int

    @classmethod
    def of(cls, records: Sequence[ExperienceRecord]) -> RewardStats:
        n = len(records)
        if n == 0:
            return cls(0, 0.0, 0.0, 0, 0)
        rewards = [r.reward for r in records]
        mean = math.fsum(rewards) / n
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in rewards) / (n - 1)) if n > 1 else 0.0
        return cls(
            n=n,
            mean=mean,
            std=std,
            n_success=sum(r.is_success for r in records),
            n_verified_success=sum(r.is_verified_success for r in records),
        )


def verified_successes(records: Iterable[ExperienceRecord]) -> list[ExperienceRecord]:
    """The verified successes among ``records``, in canonical order."""
    return sorted((r for r in records if r.is_verified_success), key=canonical_key)


@dataclass(frozen=True)
class PromptGroup:
    """All rollout records of one prompt at one step (as fetched from an exchange), canonical order."""

    prompt_id: str
    step: int
    records: tuple[ExperienceRecord, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "records", tuple(sorted(self.records, key=canonical_key)))

    @property
    def policy_ids(self) -> tuple[str, ...]:
        return tuple(sorted({r.policy_id for r in self.records}))

    def of_policy(self, policy_id: str) -> tuple[ExperienceRecord, ...]:
        return tuple(r for r in self.records if r.policy_id == policy_id)

    def excluding(self, policy_id: str) -> tuple[ExperienceRecord, ...]:
        return tuple(r for r in self.records if r.policy_id != policy_id)

    def reward_stats(self, policy_id: str | None = None) -> RewardStats:
        """Stats over one policy's records, or over the whole pooled group when ``policy_id`` is None."""
        return RewardStats.of(self.records if policy_id is None else self.of_policy(policy_id))

    def verified_successes(self, exclude_policy: str | None = None) -> list[ExperienceRecord]:
        pool = self.records if exclude_policy is None else self.excluding(exclude_policy)
        return verified_successes(pool)


@dataclass
class TraceCache:
    """A bounded LRU cache of consumer-made artefacts (THL-aligned traces) keyed by
    ``(record_id, target_tokenizer_id)``. Values are whatever the consumer computes."""

    max_entries: int = 100_000
    _data: OrderedDict[Hashable, Any] = field(default_factory=OrderedDict, repr=False)
    hits: int = 0
    misses: int = 0

    def get_or_compute(self, record_id: str, target_tokenizer_id: str, compute: Callable[[], Any]) -> Any:
        key = (record_id, target_tokenizer_id)
        if key in self._data:
            self.hits += 1
            self._data.move_to_end(key)
            return self._data[key]
        self.misses += 1
        value = compute()
        self._data[key] = value
        if len(self._data) > self.max_entries:
            self._data.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._data)
