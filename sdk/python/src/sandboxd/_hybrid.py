"""A method that works on the class and on an instance: Beam writes
``Sandbox().connect(id)`` and ``Image().from_registry(ref)``, and
``Sandbox.connect(id)`` reads better; both are supported."""

from __future__ import annotations

import functools
from typing import Any, Callable, Generic, Optional, TypeVar

R = TypeVar("R")


class hybridmethod(Generic[R]):
    """The function gets the instance, or the class when called on it."""

    def __init__(self, func: Callable[..., R]) -> None:
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, obj: Optional[Any], cls: Optional[type] = None) -> Callable[..., R]:
        target = obj if obj is not None else cls
        return functools.partial(self.func, target)
