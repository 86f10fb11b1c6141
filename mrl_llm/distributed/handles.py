"""In-process actors that look like Ray actor handles, so one driver schedule runs over either.

``LocalHandle(obj).method.remote(*args, **kwargs)`` runs ``obj.method(*args, **kwargs)`` at once, in the
caller's thread, and returns a :class:`LocalRef` holding its result or the exception it raised.
:func:`resolve` turns a :class:`LocalRef` or a Ray ``ObjectRef`` into its value: a local call's exception is
re-raised as itself (it is a bug or a user error of that call, never an actor failure Ray would restart).

Running each call when it is submitted, in submission order, is what Ray's per-actor FIFO order gives for
the driver's schedule (a policy's calls run in the order the driver sends them, and a call that needs a
peer's result is sent after that result's call), so an in-process run equals the Ray run of the same seed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LocalRef:
    """The outcome of one eager local call: its value, or the exception it raised (re-raised on :meth:`get`)."""

    __slots__ = ("_value", "_error")

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    @classmethod
    def of(cls, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> LocalRef:
        try:
            return cls(fn(*args, **kwargs))
        except Exception as err:  # kept for get(): the driver decides what a failed call means
            return cls(error=err)

    def get(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value


class _LocalMethod:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> LocalRef:
        return LocalRef.of(self.fn, *args, **kwargs)


class LocalHandle:
    """An object (e.g. a :class:`~mrl_llm.distributed.actors.PolicyActor`) behind a Ray-handle interface."""

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __getattr__(self, method: str) -> _LocalMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        fn = getattr(self.obj, method)
        if not callable(fn):
            raise AttributeError(f"{type(self.obj).__name__}.{method} is not a method")
        return _LocalMethod(fn)


def resolve(ref: Any, timeout: float | None = None) -> Any:
    """The value of ``ref``: a :class:`LocalRef`'s (its exception re-raised), else ``ray.get(ref)``."""
    if isinstance(ref, LocalRef):
        return ref.get()
    import ray

    return ray.get(ref, timeout=timeout)
