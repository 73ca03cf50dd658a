"""The input checks every block form and the configs share: each raises a ``UserError`` naming
the bad value and what was expected (never ``assert``, which ``python -O`` removes)."""

from __future__ import annotations

import torch

from ..errors import UserTypeError, UserValueError


def check_positive_int(name: str, value: object) -> int:
    """Return ``value`` if it is an int >= 1 (not a bool: True as a head count is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise UserValueError(f"{name} must be a positive int, got {value}")
    return value


MAX_SEED = 2**63 - 1  # torch's generators take 64 bits; the trainer adds offsets to the seed


def check_seed(value: object, name: str = "seed") -> int:
    """Return ``value`` if it is an int seed in [0, 2**63 - 1]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if not 0 <= value <= MAX_SEED:
        raise UserValueError(f"{name} must be an int in [0, 2**63 - 1], got {value}")
    return value


def check_within(name: str, value: object, within: str) -> float:
    """Return ``value`` as a float if it is a number in the interval ``within`` ("[0, 1)")."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserTypeError(f"{name} must be a float, got {value!r}")
    low, high = (float(end) for end in within[1:-1].split(","))
    above = low < value if within[0] == "(" else low <= value
    below = value < high if within[-1] == ")" else value <= high
    if not (above and below):  # nan is neither
        raise UserValueError(f"{name} must be in {within}, got {value}")
    return float(value)


def check_dropout(value: object, name: str = "dropout") -> float:
    return check_within(name, value, "[0, 1)")


def check_norm_eps(value: object) -> float:
    return check_within("norm_eps", value, "(0, inf)")


MAX_SOFTCAP = 1e4  # logits never come near it (a cap past them is no cap); float32 holds it


def check_softcap(value: object) -> float | None:
    """Return ``value`` as a float if it is a logit soft-cap: None (no cap) or in (0, 1e4]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserTypeError(f"logit_softcap must be None or a float, got {value!r}")
    if not 0 < value <= MAX_SOFTCAP:  # nan fails this too
        raise UserValueError(
            f"logit_softcap must be None or a float in (0, {MAX_SOFTCAP:g}], got {value}"
        )
    return float(value)


def check_heads(
    d_model: int, n_heads: int, *, names: tuple[str, str] = ("d_model", "n_heads")
) -> int:
    """Return the head size ``d_model // n_heads``, refusing a remainder (with which the lesson
    silently builds heads narrower than the stream)."""
    check_positive_int(names[0], d_model)
    check_positive_int(names[1], n_heads)
    if d_model % n_heads != 0:
        raise UserValueError(
            f"{names[0]}={d_model} is not divisible by {names[1]}={n_heads}: "
            f"each head must get an equal share of the channels"
        )
    return d_model // n_heads


def check_input(
    x: object, d_model: int, block_size: int | None = None, like: torch.Tensor | None = None
) -> tuple[int, int, int]:
    """Return ``(B, T, C)`` of ``x`` if it is a (B, T, C) tensor with C == ``d_model`` and T <=
    ``block_size``, and with ``like`` (a parameter) on its device and, unless autocast is on
    there, of its dtype (PyTorch's own message, "mixed dtype (CPU)", names neither)."""
    if not isinstance(x, torch.Tensor):
        raise UserTypeError(
            f"expected a torch.Tensor of shape (B, T, {d_model}), got {type(x).__name__}"
        )
    if not x.is_floating_point():
        raise UserTypeError(
            f"expected a floating-point input (B, T, {d_model}), got dtype {x.dtype} "
            f"(token ids go through an embedding first)"
        )
    if like is not None and x.device != like.device:
        raise UserValueError(
            f"the input is on {x.device} but the block's parameters are on {like.device}; "
            f"move one of them (x.to({str(like.device)!r}))"
        )
    if like is not None and x.dtype != like.dtype and not _autocast_on(x.device.type):
        raise UserTypeError(
            f"the input has dtype {x.dtype} but the block's parameters are {like.dtype}; "
            f"convert the input (x.to({like.dtype})) or the block (block.to({x.dtype}))"
        )
    if x.dim() != 3 or x.shape[-1] != d_model or x.numel() == 0:
        raise UserValueError(
            f"expected input of shape (B, T, {d_model}) (batch, time, channels), non-empty, "
            f"got {tuple(x.shape)}"
        )
    B, T, C = x.shape
    if block_size is not None and T > block_size:
        raise UserValueError(f"sequence length T={T} exceeds block_size={block_size}")
    return B, T, C


def _autocast_on(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # torch < 2.4 has no device argument
        cpu = device_type == "cpu"
        return bool(torch.is_autocast_cpu_enabled() if cpu else torch.is_autocast_enabled())


def check_positions(
    positions: object, B: int, T: int, device: torch.device, limit: int | None = None
) -> torch.Tensor:
    """Return ``positions`` if they are T token positions, (T,) or (B, T) ints on ``device``, in
    [0, ``limit``) (a learned table's rows). Reads min and max on the host: once per call.

    Example:
        >>> check_positions(torch.arange(3, 6), 2, 3, torch.device("cpu")).tolist()
        [3, 4, 5]
        >>> check_positions(torch.arange(3), 2, 4, torch.device("cpu"))
        Traceback (most recent call last):
        ...
        gptblock.errors.UserValueError: positions must have shape (4,) or (2, 4) (one per new position), got (3,)
    """
    if not isinstance(positions, torch.Tensor) or positions.is_floating_point() or (
        positions.dtype in (torch.bool, torch.complex64, torch.complex128)
    ):  # fmt: skip
        got = positions.dtype if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise UserTypeError(f"positions must be a tensor of integer positions, got {got}")
    if tuple(positions.shape) not in ((T,), (B, T)):
        raise UserValueError(
            f"positions must have shape ({T},) or ({B}, {T}) (one per new position), got "
            f"{tuple(positions.shape)}"
        )
    if positions.device != device:
        raise UserValueError(f"positions are on {positions.device} but the input is on {device}")
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or (limit is not None and hi >= limit):
        bound = f"[0, {limit})" if limit is not None else ">= 0"
        raise UserValueError(f"positions must be in {bound}, got {lo if lo < 0 else hi}")
    return positions
