"""A block's parts as plain numbers: what may cross from the process that runs the block.

The process that decides the verdict must never run the block's code (its norm modules, its
``Conv1D``, a replay of its operators). ``to_plain`` reads every sub-layer, where the block
runs, into numbers: a linear role as a weight (out, in) and a bias, measured on zeros and basis
vectors and checked on random rows; a norm as one of ``NORM_KINDS`` (``layer``: nn.LayerNorm's;
``unbiased``: its unbiased variance; ``std``: the Annotated Transformer's ``(h - mean) / (std +
eps)``; ``rms``: RMSNorm's), its eps, gain and bias fitted and checked the same way (of
``layer`` and ``unbiased``, which fit the same functions, the one whose gain is the block's own).
``from_plain`` builds ``Parts`` back from the numbers alone, every shape checked against C.

Shapes: B batch, T time, C channels, D attention width, H the MLP's hidden width.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..mistakes.report import one_line, text
from ..mistakes.steps import Parts, SubLayer, affine
from ..serve.subject import Tested
from .provenance import snap, trace
from .readings import Readings

__all__ = ["NORM_KINDS", "NotPlain", "from_plain", "norm_function", "to_plain", "unpack_readings"]

Tensor = torch.Tensor
NORM_KINDS = ("layer", "unbiased", "std", "rms")
FIT = 1e-5  # a fitted sub-layer must reproduce the block's to this, relative (float32 ~1e-6)
MAX_WIDTH = 1 << 16  # D and H at most this: a claim of more is not a block's


class NotPlain(ValueError):
    """A sub-layer that cannot be read into numbers; the message says which and why."""


def norm_function(kind: str, weight: Tensor, bias: Tensor, eps: float) -> SubLayer:
    """The norm ``kind`` (one of ``NORM_KINDS``) over the last axis, as a sub-layer.

    Example:
        >>> C = 4
        >>> w, b = torch.ones(C, dtype=torch.float64), torch.zeros(C, dtype=torch.float64)
        >>> h = torch.randn(2, 3, C, dtype=torch.float64)
        >>> ours = norm_function("layer", w, b, 1e-5)(h)
        >>> torch.allclose(ours, torch.nn.functional.layer_norm(h, (C,)), atol=1e-12)
        True
    """
    if kind not in NORM_KINDS:
        raise NotPlain(f"unknown norm kind {kind!r}; expected one of {NORM_KINDS}")

    def norm(h: Tensor) -> Tensor:
        w, b = weight.to(h.dtype), bias.to(h.dtype)
        if kind == "rms":
            return w * h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps) + b
        centred = h - h.mean(-1, keepdim=True)
        if kind == "std":
            return w * centred / (centred.std(-1, keepdim=True) + eps) + b
        var = centred.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
        if kind == "unbiased":
            var = var * h.shape[-1] / (h.shape[-1] - 1)
        return w * centred / torch.sqrt(var + eps) + b

    return norm


# ----- where the block runs: its parts into numbers ------------------------------------------


def _rows_through(f: Callable[[Tensor], Any], rows: Tensor, like: Tensor) -> list[Tensor]:
    """``f`` applied to ``rows`` (N, F), fed in inputs shaped like ``like`` (B, T, .); each output
    back as rows (N, out). (Some read sub-layers only run on the traced input's B and T.)"""
    B, T = like.shape[0], like.shape[1]
    outs: list[list[Tensor]] = []
    for start in range(0, rows.shape[0], B * T):
        chunk = rows[start : start + B * T]
        padded = torch.zeros(B * T, rows.shape[1], dtype=like.dtype, device=like.device)
        padded[: chunk.shape[0]] = chunk
        with torch.no_grad():
            got = f(padded.reshape(B, T, -1))  # (B, T, F) -> (B, T, out), or a tuple of them
        got = got if isinstance(got, tuple) else (got,)
        for i, g in enumerate(got):
            if len(outs) <= i:
                outs.append([])
            outs[i].append(g.reshape(B * T, -1)[: chunk.shape[0]].to(torch.float64).cpu())
    return [torch.cat(o) for o in outs]


def _check_fit(name: str, ours: Tensor, theirs: Tensor) -> float:
    scale = float(theirs.abs().max()) + 1e-30
    error = float((ours - theirs).abs().max()) / scale
    if not error <= FIT:
        raise NotPlain(f"{name} is not what its numbers say (off by {error:.1e} of its scale)")
    return error


def _linear(name: str, f: Callable[[Tensor], Any], n_in: int, like: Tensor) -> list[Tensor]:
    """``f``'s outputs' weights and biases, [w0, b0, w1, b1, ...] (a qkv gives three)."""
    g = torch.Generator().manual_seed(7)
    probe = torch.randn(like.shape[0] * like.shape[1], n_in, generator=g, dtype=torch.float64)
    basis = torch.cat([torch.zeros(1, n_in, dtype=torch.float64), torch.eye(n_in).double()])
    rows = torch.cat([basis, probe]).to(like.dtype)  # (1 + in + BT, in)
    read: list[Tensor] = []
    for out in _rows_through(f, rows, like):
        bias = out[0]
        weight = (out[1 : 1 + n_in] - bias).T.contiguous()  # (out, in)
        _check_fit(name, probe @ weight.T + bias, out[1 + n_in :])
        read += [weight, bias.contiguous()]
    return read


def _centred_unit(C: int) -> Tensor:
    """A fixed (C,) vector with mean 0 and mean square 1 whose entries are all about +-1 (so that
    dividing by them loses no precision), in a fixed random order."""
    plus, minus = C // 2, C - C // 2
    u = torch.cat([torch.full((plus,), 1.0 / plus), torch.full((minus,), -1.0 / minus)]).double()
    u = u[torch.randperm(C, generator=torch.Generator().manual_seed(5))]
    return u / u.pow(2).mean().sqrt()


def _kinds(r: float, a: float, C: int) -> dict[str, tuple[float, float]]:
    """Each kind's (eps, d(1)) from r = d(a) / d(1), the ratio of its denominators at input
    scales a and 1 (for an input with mean 0 and mean square 1)."""
    k = math.sqrt(C / (C - 1))  # the unbiased std of that input
    eps = (a * a - r * r) / (r * r - 1)  # d(s) = sqrt(s^2 + eps)
    eps_std = k * (a - r) / (r - 1)  # d(s) = s * k + eps
    return {
        "layer": (eps, math.sqrt(1 + eps)),
        "rms": (eps, math.sqrt(1 + eps)),
        "unbiased": (eps * k * k, math.sqrt(k * k + eps * k * k)),
        "std": (eps_std, k + eps_std),
    }


def _norm(
    name: str, f: SubLayer, like: Tensor, known: Tensor | None
) -> tuple[dict[str, Any], Tensor, Tensor]:
    """The kind, eps, weight and bias of the norm ``f`` computes, checked on random rows; of two
    kinds that fit, the one whose weight is among the sorted values ``known``."""
    C = like.shape[-1]
    if C < 2:
        raise NotPlain(f"{name}: a norm over {C} channel cannot be read")
    u, a = _centred_unit(C), 1e-2
    g = torch.Generator().manual_seed(6)
    probe = torch.randn(like.shape[0] * like.shape[1], C, generator=g, dtype=torch.float64)
    probe = probe * torch.rand(probe.shape[0], 1, generator=g, dtype=torch.float64) * 3 + 0.5
    rows = torch.cat([torch.stack([u, -u, a * u, -a * u]), probe]).to(like.dtype)
    (out,) = _rows_through(f, rows, like)
    bias = (out[0] + out[1]) / 2
    bias = torch.where(bias.abs() <= 1e-9 * (float(out[0].abs().max()) + 1e-300), 0.0, bias)
    g1, ga = (out[0] - out[1]) / (2 * u), (out[2] - out[3]) / (2 * a * u)  # w / d(1), w / d(a)
    live = ga.abs() > 1e-12 * (ga.abs().max() + 1e-300)
    if not live.any():
        raise NotPlain(f"{name} does not depend on its input")
    r = float((g1[live] / ga[live]).median())  # d(a) / d(1)
    fitting = []
    for kind, (eps, d1) in _kinds(r, a, C).items():
        eps = 0.0 if abs(eps) < 1e-12 else eps
        if not (math.isfinite(eps) and 0.0 <= eps < 1.0):
            continue
        weight = g1 * d1
        weight = torch.where((weight - 1.0).abs() <= 1e-6, 1.0, weight).contiguous()  # no gain
        try:
            error = _check_fit(name, norm_function(kind, weight, bias, eps)(probe), out[4:])
        except NotPlain:
            continue
        fitting.append((error, ({"kind": kind, "eps": eps}, weight, bias.contiguous())))
    if not fitting:
        raise NotPlain(f"{name} computes none of the norms {', '.join(NORM_KINDS)} (to {FIT:g})")
    fitting.sort(key=lambda f: f[0])  # the closest first
    if known is not None and len(known):  # the kind whose gain is the block's, exactly
        for error, (meta, weight, b) in fitting:
            tol = max(1e-9, 10 * error) * float(weight.abs().max())  # the fit's own precision
            for offset in (0.0, 1.0):  # a gain stored as such, or as 1 + it (Gemma's RMSNorm)
                own = snap(weight - offset, known, tol)
                if own is not None:
                    snapped = snap(b, known, tol)
                    return meta, own + offset, b if snapped is None else snapped
    return fitting[0][1]


def to_plain(
    parts: Parts, like: Tensor, key: str, known: Tensor | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``parts`` as numbers: a JSON-able description and its tensors (named ``key.role.*``),
    the sub-layers called on inputs of the B and T of ``like``, the input they were read on; a
    norm is read in the kind whose gain is among ``known`` (the block's values, sorted).

    Raises:
        NotPlain: a sub-layer is not linear, or a norm none of ``NORM_KINDS``.
    """
    tensors: dict[str, Tensor] = {}
    wq, bq, wk, bk, wv, bv = _linear("q, k, v", parts.qkv, parts.C, like)
    wf1, bf1 = _linear("fc1", parts.fc1, parts.C, like)
    read = {
        "q": (wq, bq), "k": (wk, bk), "v": (wv, bv), "fc1": (wf1, bf1),
        "proj": tuple(_linear("proj", parts.proj, wq.shape[0], like)),
        "fc2": tuple(_linear("fc2", parts.fc2, wf1.shape[0], like)),
    }  # fmt: skip
    for role, (w, b) in read.items():
        tensors[f"{key}.{role}.weight"], tensors[f"{key}.{role}.bias"] = w, b
    meta: dict[str, Any] = {"C": parts.C, "D": parts.D}
    for role, f in (("ln1", parts.ln1), ("ln2", parts.ln2)):
        if f is None:
            meta[role] = None
            continue
        meta[role], tensors[f"{key}.{role}.weight"], tensors[f"{key}.{role}.bias"] = _norm(
            role, f, like, known
        )
    return meta, tensors


# ----- where the verdict is decided: numbers into parts, checked -----------------------------


def _tensor(tensors: Mapping[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    t = tensors.get(name)
    if not isinstance(t, Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, Tensor) else "nothing"
        raise NotPlain(f"{name}: expected a tensor of shape {shape}, got {got}")
    if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
        raise NotPlain(f"{name}: expected finite floating-point values")
    return t.to(torch.float64)


def from_plain(meta: object, tensors: Mapping[str, Tensor], key: str, C: int) -> Parts:
    """``to_plain``'s numbers back as ``Parts``, every shape checked against the width ``C``.

    Raises:
        NotPlain: the description or a tensor does not fit a block of width ``C``.

    Example:
        >>> from gptblock import lesson
        >>> from gptblock.check.roles.weights import read_block
        >>> block = lesson.Block(8, 2, 8, dropout=0.0).double().eval()
        >>> x = torch.randn(5, 7, 8, dtype=torch.float64)
        >>> meta, tensors = to_plain(read_block(block, x).parts, x, "0")
        >>> parts = from_plain(meta, tensors, "0", 8)
        >>> meta["ln1"]["kind"], parts.D, torch.allclose(parts.ln1(x), block.ln1(x))
        ('layer', 8, True)
    """
    if not isinstance(meta, dict) or meta.get("C") != C:
        raise NotPlain(f"a reading of a block of width {C} expected")
    D, H = meta.get("D"), tensors.get(f"{key}.fc1.bias")
    if not isinstance(D, int) or not 1 <= D <= MAX_WIDTH or not isinstance(H, Tensor):
        raise NotPlain("the attention width D or the MLP's width H is missing")
    H_ = H.shape[0] if H.dim() == 1 and 1 <= H.shape[0] <= MAX_WIDTH else 0
    shapes = {"q": (D, C), "k": (D, C), "v": (D, C), "proj": (C, D), "fc1": (H_, C), "fc2": (C, H_)}
    linear = {
        r: affine(_tensor(tensors, f"{key}.{r}.weight", s), _tensor(tensors, f"{key}.{r}.bias", s[:1]))
        for r, s in shapes.items()
    }  # fmt: skip
    norms: dict[str, SubLayer | None] = {}
    for role in ("ln1", "ln2"):
        n = meta.get(role)
        if n is None and role == "ln2":
            norms[role] = None
            continue
        if not isinstance(n, dict) or n.get("kind") not in NORM_KINDS:
            raise NotPlain(f"{role}: a norm kind expected")
        eps = n.get("eps")
        if not isinstance(eps, (int, float)) or not 0.0 <= eps < 1.0:
            raise NotPlain(f"{role}: eps {eps!r} is not in [0, 1)")
        w, b = (_tensor(tensors, f"{key}.{role}.{p}", (C,)) for p in ("weight", "bias"))
        norms[role] = norm_function(str(n["kind"]), w, b, float(eps))
    q, k, v = linear["q"], linear["k"], linear["v"]

    def qkv(h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return q(h), k(h), v(h)

    return Parts(
        C, D, qkv, linear["proj"], linear["fc1"], linear["fc2"], norms["ln1"], norms["ln2"]
    )


_ROLES = ("q", "k", "v", "proj", "fc1", "fc2", "ln1")  # and ln2, when the block has one


def unpack_readings(
    meta: dict[str, Any],
    tensors: dict[str, Tensor],
    subject: Tested,
    chosen: Mapping[str, Tensor],
    notes: list[str],
) -> tuple[Readings, list[dict[str, list[Tensor]]]] | str:
    """The readings ``Served.read`` sent, rebuilt from their numbers alone and checked: their
    shapes, and that their weights are the values the checker chose (``provenance``); with
    each reading's weights by role, in the order the comparison numbers the readings."""
    C = subject.C
    try:
        notes += [text(n) for n in meta.get("notes", [])]
        if "why" in meta:
            return text(meta["why"])
        x, heads, count = tensors["x"], tuple(meta["heads"]), int(meta["readings"])
        shown = [text(d) for d in meta["describe"]]
        parts = [from_plain(p, tensors, str(i), C) for i, p in enumerate(meta["parts"])]
        if (
            x.dim() != 3 or x.shape[-1] != C or not x.is_floating_point() or not parts
            or len(shown) != len(parts) or not 0 <= count <= len(parts) or not heads
            or not all(isinstance(h, int) and 1 <= h <= p.D for h in heads for p in parts)
            or not bool(torch.isfinite(x).all())
        ):  # fmt: skip
            raise NotPlain("the readings do not fit together")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return f"the block's process sent readings that do not check ({one_line(e)})"
    why = ""
    kept: list[int] = []  # the readings made of the values chosen
    read: list[dict[str, list[Tensor]]] = []  # each reading's weights by role
    for i, part in enumerate(parts):
        roles = _ROLES + (("ln2",) if part.ln2 is not None else ())
        read.append({r: [tensors[f"{i}.{r}.{p}"] for p in ("weight", "bias")] for r in roles})
        why = trace(read[-1], chosen, subject.dtype).why
        if not why:
            kept.append(i)
    if not kept:
        return why
    main = [i for i in kept if i < count] or kept  # no main reading left: the fallback's it is
    rest = [i for i in kept if i not in main]
    readings = Readings(
        tuple(parts[i] for i in main),
        tuple(parts[i] for i in rest),
        heads,
        x.to(torch.float64),
        [shown[i] for i in main + rest].__getitem__,
    )
    return readings, [read[i] for i in main + rest]
