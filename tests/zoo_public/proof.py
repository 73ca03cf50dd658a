"""The proof that a zoo block computes the lessons' block: gptblock's own, with its weights.

``reference(spec, block)`` builds ``gptblock.blocks.mha.TransformerBlock`` (the second lesson's block;
with ``activation="relu"`` the first lesson's ``lesson.Block`` computes the same function) and
loads into it the weights that the block module's ``weights(block)`` reads out of the block, in
the lessons' roles. ``max_error`` runs both on one input; the tests require float64 rounding.

Shapes: B batch, T time, C channels, nh heads.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from gptblock.blocks.mha import TransformerBlock

ROLES = ("ln1", "q", "k", "v", "proj", "ln2", "fc1", "fc2")


def reference(spec, block: nn.Module) -> TransformerBlock:
    """gptblock's block holding ``block``'s weights, as ``spec.weights`` maps them."""
    w = spec.weights(block)
    missing = set(ROLES) - set(w)
    if missing:
        raise ValueError(f"{spec.__name__}.weights gives no {sorted(missing)}")
    C = w["proj"][0].shape[0]
    kwargs = {k: v for k, v in spec.REFERENCE.items() if k != "n_head"}
    ref = TransformerBlock(C, spec.REFERENCE["n_head"], **kwargs)
    like = next(t for pair in w.values() for t in pair if t is not None)
    ref = ref.to(like.dtype).eval()

    def vec(t, fill, n):
        return torch.full((n,), fill, dtype=like.dtype) if t is None else t.detach().reshape(n)

    def mat(t, shape):
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{spec.__name__}.weights: a weight of shape {tuple(t.shape)}, expected {shape}"
            )
        return t.detach()

    H = w["fc1"][0].shape[0]
    attn = ref.self_attn
    with torch.no_grad():
        for name, role in (("norm1", "ln1"), ("norm2", "ln2")):
            getattr(ref, name).weight.copy_(vec(w[role][0], 1.0, C))
            getattr(ref, name).bias.copy_(vec(w[role][1], 0.0, C))
        attn.in_proj_weight.copy_(torch.cat([mat(w[r][0], (C, C)) for r in "qkv"]))
        attn.in_proj_bias.copy_(torch.cat([vec(w[r][1], 0.0, C) for r in "qkv"]))
        attn.out_proj.weight.copy_(mat(w["proj"][0], (C, C)))
        attn.out_proj.bias.copy_(vec(w["proj"][1], 0.0, C))
        ref.linear1.weight.copy_(mat(w["fc1"][0], (H, C)))
        ref.linear1.bias.copy_(vec(w["fc1"][1], 0.0, H))
        ref.linear2.weight.copy_(mat(w["fc2"][0], (C, H)))
        ref.linear2.bias.copy_(vec(w["fc2"][1], 0.0, C))
    return ref


def randomised(block: nn.Module, seed: int = 0) -> nn.Module:
    """``block`` in float64 and eval mode with every parameter drawn afresh (norm gains and
    biases off 1 and 0, as after training), so that a weight read from the wrong place shows."""
    block = block.double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype) + (p.dim() == 1) * 0.5)
    return block


def max_error(spec, block: nn.Module, B: int = 2, T: int = 5, seed: int = 1) -> float:
    """The largest difference between ``block`` and gptblock's block with its weights, relative
    to the largest entry of the output (as the checker measures it)."""
    ref = reference(spec, block)
    C = ref.config.d_model
    x = torch.randn(B, T, C, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    with torch.no_grad():
        y, want = block(x.clone()), ref(x.clone())
    if y.shape != want.shape:
        raise ValueError(f"output {tuple(y.shape)}, expected {tuple(want.shape)}")
    return float((y.double() - want).abs().max() / want.abs().max())
