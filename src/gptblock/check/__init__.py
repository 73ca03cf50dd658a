"""The checker behind ``gptblock check``: ``check_block`` says what is wrong with a block, in this
process for code the caller trusts or (``isolate=True``) in child processes that only answer
requests. Its rooms (``serve``, ``mistakes``, ``building``, ``roles``, ``compare``,
``isolation``) import only those before them; docs/checker.md, "How it decides"."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch.nn as nn

from ..blocks.fused import FusedBlock
from ..blocks.mha import TransformerBlock
from ..errors import UserTypeError, UserValueError
from ..lesson import Block as LessonBlock
from .building.arguments import COMMON_ARGUMENTS, fill_common_arguments
from .building.target import load_target, parse_argument
from .isolation.check import DEFAULT_TIMEOUT, check_in_process, check_isolated
from .mistakes.catalogue import MISTAKES
from .mistakes.report import CheckReport, Finding
from .roles.mapping import ROLES
from .submissions import named

__all__ = [
    "COMMON_ARGUMENTS", "DEFAULT_TIMEOUT", "MISTAKES", "ROLES", "CheckReport", "Finding",
    "check_block", "check_isolated", "fill_common_arguments", "load_target", "own_blocks",
    "parse_argument",
]  # fmt: skip


def own_blocks() -> list[Callable[..., nn.Module]]:
    """gptblock's own block classes, which ``gptblock check`` checks when given no target.

    Example:
        >>> [b.__name__ for b in own_blocks()][:2]
        ['Block', 'TransformerBlock']
    """
    return [LessonBlock, TransformerBlock, FusedBlock]


def check_block(
    target: nn.Module | Callable[..., nn.Module] | str, /, *,
    roles: Mapping[str, str] | None = None, isolate: bool | None = None,
    timeout: float = DEFAULT_TIMEOUT, **kwargs: object,
) -> CheckReport:  # fmt: skip
    """Check a transformer block and diagnose its mistakes.

    Args:
        target: an ``nn.Module`` mapping (B, T, C) to (B, T, C), a class / factory that builds
            one (called with ``kwargs`` plus ``fill_common_arguments``'s defaults under
            ``torch.manual_seed(0)``, the caller's RNG state restored), or the text
            ``"FILE.py:NAME"`` / ``"package.module:NAME"`` naming one (``"FILE.py"`` alone: the
            block ``gptblock grade`` would find in it).
        roles: parts of the block by role where the checker cannot tell them itself:
            ``{"q": "attn.wq", "ln1": "norm_a", ...}`` (roles ``ln1 ln2 q k v qkv proj fc1
            fc2``; a name may be a glob such as ``"heads.*.query"`` or a slice and layout of a
            parameter such as ``"attn.c_attn.weight[:,0:32]:in_out"``).
        isolate: run the block in a child process, so that a block that exits, crashes or
            hangs yields a report. Default: only for a text target (``gptblock check`` always
            isolates).
        timeout: with ``isolate``, the seconds the block may take to load, build and check;
            then the child is killed and the report says where it hung.
        **kwargs: constructor arguments; only with a class / factory.

    Returns:
        A ``CheckReport``. The target itself is never changed: every check runs on a float64,
        eval-mode deep copy, with one intra-op thread (the caller's setting restored).

    Raises:
        UserValueError: the target cannot be loaded or built, its width C cannot be told, a
            role names no part, or ``timeout`` is not a positive number.
        UserTypeError: ``target`` is neither a module nor callable, or the factory returns a
            non-module, or constructor arguments come with a module instance.

    Example:
        >>> import torch.nn as nn
        >>> from gptblock import lesson
        >>> check_block(lesson.Block, n_embd=16, n_head=2).diagnosis
        []
        >>> class PostNorm(nn.Module):   # the encoder layer's default: norm after the residual
        ...     def __init__(self, d_model, nhead):
        ...         super().__init__()
        ...         self.layer = nn.TransformerEncoderLayer(d_model, nhead, 4 * d_model,
        ...                                                 batch_first=True)
        ...     def forward(self, x):
        ...         mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        ...         return self.layer(x, src_mask=mask, is_causal=True)
        >>> report = check_block(PostNorm, d_model=16, nhead=2)
        >>> report.passed, report.diagnosis
        (False, ['post_norm'])
    """
    if roles is not None and not (
        isinstance(roles, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in roles.items())
    ):
        raise UserTypeError(f"roles must map role names to part names (str to str), got {roles!r}")
    if not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):  # NaN too
        raise UserValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    given = dict(roles or {})
    target = named(target) if isinstance(target, str) else target
    if isolate or (isolate is None and isinstance(target, str)):
        return check_isolated([target], kwargs=kwargs, roles=given, timeout=timeout)[0]
    return check_in_process(
        load_target(target) if isinstance(target, str) else target, kwargs, given
    )
