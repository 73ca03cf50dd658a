"""The errors a user's input causes, as opposed to a bug in gptblock.

Each is also the built-in exception it refines (``UserValueError`` is a ``ValueError``), so
``except ValueError`` keeps working; the command line prints them as one line (exit code 2) and
lets any other exception keep its traceback (docs/errors.md).

Example:
    >>> from gptblock import GPTConfig
    >>> try:
    ...     GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=3, n_embd=32)
    ... except UserError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    UserValueError True
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["UserError", "UserFileExistsError", "UserFileNotFoundError", "UserImportError"]
__all__ += ["UserIsADirectoryError", "UserNotADirectoryError", "UserPermissionError"]
__all__ += ["UserTypeError", "UserValueError", "checked"]


class UserError(Exception):
    """Base of the errors whose message tells the user what to change; never a bug."""


class UserValueError(UserError, ValueError):
    """A value out of range or inconsistent with another; the message names both."""


class UserTypeError(UserError, TypeError):
    """A value of the wrong type; the message names the type expected and the one given."""


class UserFileNotFoundError(UserError, FileNotFoundError):
    """A file or run the user named does not exist."""


class UserFileExistsError(UserError, FileExistsError):
    """Writing would replace something the user has not asked to replace."""


class UserIsADirectoryError(UserError, IsADirectoryError):
    """A directory where a file was expected."""


class UserImportError(UserError, ImportError):
    """An optional dependency the call needs is not installed; the message says what to run."""


class UserNotADirectoryError(UserError, NotADirectoryError):
    """A file (or a device, a pipe) where a directory was expected."""


class UserPermissionError(UserError, PermissionError):
    """The operating system refuses access to a file or directory the user named."""


F = TypeVar("F", bound=Callable[..., Any])


def checked(fn: F) -> F:
    """``fn``, refusing an argument of another type than its annotation with a ``UserTypeError``
    naming the function and the parameter (``gptblock.load(5)`` is one line, not a traceback).

    Shallow: a union's members, a class, a generic's origin, ``Literal``'s values; an ``int`` has
    ``__index__``, a ``float`` ``__float__`` (a bool neither). ``Any``, callables, protocols and
    unresolvable annotations take anything.

    Example:
        >>> @checked
        ... def scale(x: float, by: int | None = None) -> float:
        ...     return x * (by or 1)
        >>> scale(2.0, by=3)
        6.0
        >>> scale("2")
        Traceback (most recent call last):
        ...
        gptblock.errors.UserTypeError: scale: x must be a float, got '2' (str)
    """
    signature = inspect.signature(fn)
    hints: dict[str, Any] = {}

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not hints:
            hints.update(_hints(fn) or {"": None})
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as e:  # a missing or unknown argument: named by Python, one line
            raise UserTypeError(f"{fn.__name__}: {e}") from None
        for name, value in bound.arguments.items():
            kind = signature.parameters[name].kind
            hint = hints.get(name, Any)
            if kind not in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD) and not _matches(value, hint):
                raise UserTypeError(
                    f"{fn.__name__}: {name} must be {_describe(hint)}, got {value!r:.40} "
                    f"({type(value).__name__})"
                )
        return fn(*args, **kwargs)

    return typing.cast(F, wrapper)


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # a name imported for the type checker only: resolve them one by one
        found = {}
        for name, text in getattr(fn, "__annotations__", {}).items():
            try:
                found[name] = (
                    eval(text, getattr(fn, "__globals__", {})) if isinstance(text, str) else text
                )
            except Exception:
                continue
        return found


def _matches(value: object, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, h) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if hint is None or hint is type(None):
        return value is None
    if hint in (int, float):  # a number of that kind (a NumPy one, a 0-d tensor), no bool
        kind = "__index__" if hint is int else "__float__"
        number = isinstance(value, numbers.Real) if hint is float else False
        return (number or hasattr(type(value), kind)) and not isinstance(value, bool)
    cls = origin or hint
    if not isinstance(cls, type) or cls in (object, Callable) or hint is Any:
        return True
    try:
        return isinstance(value, cls)
    except TypeError:  # a protocol that cannot be checked at run time
        return True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_describe(h) for h in typing.get_args(hint))
    if hint is None or hint is type(None):
        return "None"
    cls = typing.get_origin(hint) or hint
    if cls is os.PathLike:
        return "a path"
    name = getattr(cls, "__qualname__", str(hint))
    home = getattr(cls, "__module__", "builtins").split(".")[0]
    name = name if home in ("builtins", "gptblock") else f"{home}.{name}"  # torch.device
    return f"{'an' if name[0] in 'aeiouAEIOU' else 'a'} {name}"
