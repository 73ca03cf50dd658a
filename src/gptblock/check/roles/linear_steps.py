"""From an assignment of a block's linear parts to roles, the block's steps and their names.

``linears.assign_linears`` chooses which part is q, k, v (or the packed qkv), proj, fc1 and fc2;
this module turns a chosen ``Candidate`` into what the checker runs (``build_parts``: q/k/v, the
output projection and the MLP's two layers as callables, per head, packed, separate or read from
an ``nn.MultiheadAttention``'s weights) and into the names its report prints (``role_names``).

Shapes: B batch, T time, C channels, D attention width, E an MHA's width, hs head size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

from ..mistakes.steps import QKV, Parts, SubLayer
from .parts import Part

__all__ = [
    "LINEAR_ROLES",
    "Candidate",
    "Heads",
    "NotABlock",
    "attention_module",
    "build_parts",
    "describe_roles",
    "role_names",
]

Tensor = torch.Tensor
Heads = list[tuple[Part, Part, Part]]  # per head, its (q, k, v) modules
LINEAR_ROLES = ("q", "k", "v", "qkv", "proj", "fc1", "fc2")


class NotABlock(Exception):
    """The parts do not make a pre-norm block, or cannot be told apart; the message says why."""


@dataclass(frozen=True)
class Candidate:
    """One assignment of the block's linear parts to roles, and its score (``linears``)."""

    form: str
    roles: dict[str, Part]
    in_out: bool  # raw matrices read as stored (in, out)
    score: float


def build_parts(c: Candidate, heads: Heads, mhas: list[Part], C: int) -> Parts:
    """The block's q/k/v, proj, fc1 and fc2 as callables, as assignment ``c`` reads its parts."""
    lin = {r: p.linear(c.in_out) for r, p in c.roles.items()}
    if c.form == "mha":
        qkv, proj, D = _mha(attention_module(mhas[0]))
    elif c.form == "heads":
        fs = [tuple(p.linear() for p in group) for group in heads]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            outs = [[f(h) for f in group] for group in fs]  # nh x 3 x (B, T, hs)
            q, k, v = (torch.cat([o[i] for o in outs], dim=-1) for i in range(3))  # (B, T, D)
            return q, k, v

        proj, D = lin["proj"], sum(q.shape[0] for q, _, _ in heads if q.shape)
    elif c.form == "packed":
        packed = lin["qkv"]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            q, k, v = packed(h).chunk(3, dim=-1)  # (B, T, 3D) -> 3 x (B, T, D)
            return q, k, v

        proj, D = lin["proj"], c.roles["qkv"].shape_as(c.in_out)[0] // 3  # type: ignore[index]
    else:
        fq, fk, fv = lin["q"], lin["k"], lin["v"]

        def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return fq(h), fk(h), fv(h)

        proj, D = lin["proj"], c.roles["q"].shape_as(c.in_out)[0]  # type: ignore[index]
    return Parts(C, D, qkv, proj, lin["fc1"], lin["fc2"], None, None)


def attention_module(part: Part) -> nn.MultiheadAttention:
    if not isinstance(part.module, nn.MultiheadAttention):
        raise TypeError(f"{part.name} is not an nn.MultiheadAttention")
    return part.module


def _mha(mha: nn.MultiheadAttention) -> tuple[QKV, SubLayer, int]:
    """q/k/v and the output projection of an nn.MultiheadAttention, from its weights."""
    if getattr(mha, "bias_k", None) is not None or getattr(mha, "add_zero_attn", False):
        raise NotABlock(
            "nn.MultiheadAttention with add_bias_kv / add_zero_attn attends to an extra learned "
            "position: not the lessons' block"
        )
    E = int(mha.embed_dim)
    if mha._qkv_same_embed_dim:
        w = mha.in_proj_weight.detach()  # (3E, E)
    else:
        w = torch.cat([mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight]).detach()
    b = mha.in_proj_bias.detach() if mha.in_proj_bias is not None else None
    wo = mha.out_proj.weight.detach()  # (E, E)
    bo = mha.out_proj.bias.detach() if mha.out_proj.bias is not None else None

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        bias = b.to(h.dtype) if b is not None else None
        q, k, v = F.linear(h, w.to(h.dtype), bias).chunk(3, dim=-1)  # (B, T, 3E) -> 3 x (B, T, E)
        return q, k, v

    def proj(y: Tensor) -> Tensor:
        return F.linear(y, wo.to(y.dtype), bo.to(y.dtype) if bo is not None else None)

    return qkv, proj, E


def role_names(c: Candidate, heads: Heads, mhas: list[Part]) -> dict[str, str]:
    """Each role's parameter name(s) as the report prints them (a glob for per-head modules)."""
    names: dict[str, str] = {}
    if c.form == "mha":
        names["qkv"] = f"{_prefix(mhas[0].name)}in_proj_weight"
        names["proj"] = f"{_prefix(mhas[0].name)}out_proj"
    if c.form == "heads":
        for i, role in enumerate(("q", "k", "v")):
            names[role] = _pattern([g[i].name for g in heads])
    for role in LINEAR_ROLES:
        if role in c.roles:
            part = c.roles[role]
            names[role] = part.name + (" (in, out)" if part.kind == "matrix" and c.in_out else "")
    return names


def describe_roles(c: Candidate, heads: Heads, mhas: list[Part]) -> str:
    return ", ".join(f"{r}={n}" for r, n in role_names(c, heads, mhas).items())


def _prefix(name: str) -> str:
    return f"{name}." if name else ""


def _pattern(names: list[str]) -> str:
    """'sa.heads.*.query' for 'sa.heads.0.query', 'sa.heads.1.query', ..."""
    split = [n.split(".") for n in names]
    if len({len(s) for s in split}) != 1:
        return ", ".join(names)
    common = [parts[0] if len(set(parts)) == 1 else "*" for parts in zip(*split, strict=True)]
    return ".".join(common)
