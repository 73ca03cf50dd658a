"""The errors a user's input causes, as opposed to a bug in gptblock.

Every check of a value the user chose (a config field, a file, a tensor handed to a block, a
command-line flag) raises one of these. Each is also the built-in exception it refines
(``UserValueError`` is a ``ValueError``, ...), so ``except ValueError`` keeps working. The
command line prints these as one line on stderr and exits with code 2; any other exception is
a bug and keeps its traceback, so it can be reported. (Rejected: catching every
``ValueError``/``TypeError`` at the command line, which also turned real bugs into one
misleading line.)

Example:
    >>> from gptblock import GPTConfig
    >>> try:
    ...     GPTConfig(vocab_size=65, block_size=32, n_layer=2, n_head=3, n_embd=32)
    ... except UserError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    UserValueError True
"""

from __future__ import annotations

__all__ = [
    "UserError",
    "UserFileExistsError",
    "UserFileNotFoundError",
    "UserImportError",
    "UserIsADirectoryError",
    "UserNotADirectoryError",
    "UserPermissionError",
    "UserTypeError",
    "UserValueError",
]


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
