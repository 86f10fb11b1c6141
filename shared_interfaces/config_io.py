"""Typed configs from plain mappings (YAML safe-loaded): unknown keys are errors naming the key.

``from_mapping(Cls, data, where="policies[0]")`` builds a (possibly nested) dataclass from a dict,
checking every key and converting lists to tuples where the field is a tuple. Numbers are checked on
the way: a ``float`` field takes finite numbers only (``.inf`` / ``.nan`` are refused; no field of the
project's configs means "unbounded" by infinity: write a large finite number), an ``int`` field takes
values that fit a signed 64-bit integer (what numpy and torch accept).

YAML is only ever read with :func:`load_yaml`: safe-loaded (no tags execute) and without anchors or
aliases (``&a`` / ``*a`` / ``<<: *a``), which are refused with an error naming the file and line: an
alias is shared when loaded but expanded when a config is written out, so a 2 KB "billion laughs" file
would otherwise grow to gigabytes. A key given twice in one mapping is refused too (YAML keeps the last one
silently). Numbers in exponent form without a dot (``lr: 1e-6``, ``1E3``) are floats,
as in YAML 1.2 and JSON (PyYAML's YAML 1.1 reads them as strings). The number forms YAML 1.1 reads as other
numbers than they look like are refused, naming the file and line: a leading zero (``010`` is octal 8) and
base 60 (``1:30`` is 90); so are integers of more digits than Python reads (4300) and nesting too deep to parse.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

#: The range of an ``int`` field: a signed 64-bit integer.
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class ConfigError(ValueError):
    """A config value or key is wrong; the message names the key path."""


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last_err: Exception | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ConfigError as err:
                last_err = err
        raise ConfigError(str(last_err))
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if _is_dataclass_type(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {type(value).__name__}")
        return from_mapping(tp, value, where=where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        item_tp = args[0] if args else Any
        items = [_convert(item_tp, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            out = float(value)
        except OverflowError:
            out = math.inf
        if not math.isfinite(out):
            raise ConfigError(f"{where}: {value!r} is not a finite number; give a finite value")
        return out
    if tp is int:
        if isinstance(value, float) and value.is_integer() and INT_MIN <= value <= INT_MAX:
            raise ConfigError(f"{where}: expected an integer, got {value!r}; write it as {int(value)}")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if not INT_MIN <= value <= INT_MAX:  # (str() of an int over 4300 digits raises: name its size instead)
            shown = value if value.bit_length() <= 256 else f"an integer of {value.bit_length()} bits"
            raise ConfigError(f"{where}: {shown} does not fit a signed 64-bit integer (|value| < 2**63)")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    return value


def from_mapping(cls: type[T], data: Mapping[str, Any], *, where: str = "config") -> T:
    """Build dataclass ``cls`` from ``data``; unknown keys raise :class:`ConfigError` naming them."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    flds = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(flds))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {unknown}; known keys of {cls.__name__}: {sorted(flds)}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, f"{where}.{name}")
    missing = [
        n
        for n, f in flds.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing} for {cls.__name__}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as err:  # the dataclass's own checks: said where in the config
        if str(err).startswith(where):
            raise
        raise ConfigError(f"{where}: {err}") from err


def to_mapping(obj: Any) -> Any:
    """A dataclass (nested) as plain dicts/lists, for writing summaries and configs."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_mapping(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_mapping(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_mapping(v) for k, v in obj.items()}
    return obj


#: YAML 1.2 floats in exponent form that YAML 1.1 (PyYAML) reads as strings: ``1e-6``, ``-2E+3``, ``3.e4``.
_EXPONENT_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$")


def int_at_least(low: int) -> typing.Callable[[str], int]:
    """An ``argparse`` type: an integer >= ``low`` (argparse prints ``--flag: must be >= 1, got 0`` and exits 2)."""
    import argparse

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {n}")
        return n

    return parse


def _check_yaml11_number(text: str, path: Path, line: int) -> None:
    """Refuse the number forms YAML 1.1 (PyYAML) reads differently from YAML 1.2 and from what they look like: a
    leading zero (``010`` is octal 8) and base 60 (``1:30`` is 90); :class:`ConfigError` naming the file and line."""
    body = text.replace("_", "").lstrip("+-")
    if ":" in body:
        raise ConfigError(f"{path}:{line}: {text!r} is a base-60 number in YAML 1.1 (1:30 is 90); write the number "
                          "it means, or quote it if it is text")
    if len(body) > 1 and body[0] == "0" and body[1].isdigit() and "." not in body and "e" not in body.lower():
        raise ConfigError(f"{path}:{line}: {text!r} has a leading zero, which YAML 1.1 reads as an octal number; "
                          "write it without the leading zero (or quote it if it is text)")


def _no_alias_loader(path: Path) -> type:
    """A ``yaml.SafeLoader`` that refuses anchors and aliases and reads ``1e-6`` as a float (module docstring),
    naming ``path`` in its errors."""
    import yaml

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            anchor = getattr(event, "anchor", None)
            if isinstance(event, yaml.AliasEvent) or anchor is not None:
                what = f"alias *{anchor}" if isinstance(event, yaml.AliasEvent) else f"anchor &{anchor}"
                raise ConfigError(
                    f"{path}:{event.start_mark.line + 1}: YAML {what}: configs may not use anchors or aliases "
                    "(&name / *name / <<: *name); write the values out"
                )
            return super().compose_node(parent, index)

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, typing.Hashable) and key in seen:
                    raise ConfigError(f"{path}:{line}: key {key!r} is given twice (first on line {seen[key]}); "
                                      "keep one")
                if isinstance(key, typing.Hashable):
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

        def construct_yaml_int(self, node: Any) -> Any:
            text = str(self.construct_scalar(node))
            _check_yaml11_number(text, path, node.start_mark.line + 1)
            try:
                return super().construct_yaml_int(node)
            except ValueError as err:  # more digits than int() reads (sys.get_int_max_str_digits())
                raise ConfigError(f"{path}:{node.start_mark.line + 1}: the integer {text[:20]}... has {len(text)} "
                                  "digits, too many to read; give a number that fits 64 bits") from err

        def construct_yaml_float(self, node: Any) -> Any:
            _check_yaml11_number(str(self.construct_scalar(node)), path, node.start_mark.line + 1)
            return super().construct_yaml_float(node)

    NoAliasLoader.add_constructor("tag:yaml.org,2002:int", NoAliasLoader.construct_yaml_int)
    NoAliasLoader.add_constructor("tag:yaml.org,2002:float", NoAliasLoader.construct_yaml_float)
    NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT_FLOAT, list("-+0123456789"))
    return NoAliasLoader


def load_yaml(path: str | Path) -> Any:
    """Safe-load a YAML file (never executes tags; anchors and aliases refused, module docstring)."""
    import yaml

    p = Path(path)
    if not p.exists():
        raise ConfigError(f"config file {p} does not exist")
    if p.is_dir():
        raise ConfigError(f"{p} is a directory; give a YAML file")
    try:
        with open(p, encoding="utf-8") as fh:
            text = fh.read()
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise ConfigError(f"{p}:{line}: not valid UTF-8 (byte {err.object[err.start]:#04x}); save the file as UTF-8") from err
    try:
        return yaml.load(text, Loader=_no_alias_loader(p)) or {}  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        one_line = " ".join(str(err).split())
        hint = ("indent with spaces: YAML does not allow tabs" if "'\\t'" in one_line else
                "quote values that start with '{' or '$'")
        raise ConfigError(f"{p} is not valid YAML ({one_line}); {hint}") from err
    except RecursionError as err:
        raise ConfigError(f"{p}: YAML nested too deeply to read; a config needs a few levels: flatten it") from err
