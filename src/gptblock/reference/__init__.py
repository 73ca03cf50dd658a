"""The NumPy oracle: the pre-norm block's forward pass and a hand-derived backward pass.

The second lesson's "the same computation without autograd", and the project's oracle: every
block form is tested against it, outputs and gradients. It imports NumPy and the standard library
only (a test loads it with torch made unimportable), so a bug in PyTorch or in gptblock's torch
code cannot leak into the answer it gives.

The block is ``modern``'s, with ``params`` named as ``TransformerBlock``'s state_dict.
Everything is in float64 whatever the input dtype: an oracle's job is to be right. An absent
bias key (``bias=False``) counts as zero and gets no gradient. Masks are bool, ``True`` = blocked.
``modern`` has the one forward pass, with options for the modern parts (``ModernOptions``).

Shapes: B batch, T time, C channels, nh heads, hs = C // nh head size, F = MLP hidden width.

Example:
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> C = 8
    >>> params = {"norm1.weight": np.ones(C), "norm2.weight": np.ones(C),
    ...           "self_attn.in_proj_weight": rng.standard_normal((3 * C, C)),
    ...           "self_attn.out_proj.weight": rng.standard_normal((C, C)),
    ...           "linear1.weight": rng.standard_normal((4 * C, C)),
    ...           "linear2.weight": rng.standard_normal((C, 4 * C))}
    >>> y, cache = block_forward(params, rng.standard_normal((2, 5, C)), n_head=2)
    >>> dx, grads = block_backward(np.ones_like(y), cache)  # the gradients of y.sum()
    >>> dx.shape, sorted(grads) == sorted(params)
    ((2, 5, 8), True)
"""

from __future__ import annotations

from .layout import PARAM_KEYS
from .modern import (
    BlockCache,
    ModernCache,
    ModernOptions,
    block_backward,
    block_forward,
    causal_head,
    modern_backward,
    modern_forward,
)
from .params import params_from_state_dict
from .pieces import softmax

__all__ = [
    "PARAM_KEYS",
    "BlockCache",
    "ModernCache",
    "ModernOptions",
    "block_backward",
    "block_forward",
    "causal_head",
    "modern_backward",
    "modern_forward",
    "params_from_state_dict",
    "softmax",
]
