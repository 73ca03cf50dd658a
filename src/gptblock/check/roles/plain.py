"""A block's parts as plain numbers, all that crosses from the block's process: written there
(``to_plain``: a lessons' reading; ``send``: a modern block's correct parts), checked and built
back here (``decode``, ``unpack_readings``, ``unpack_modern``). docs/checker.md, "How it decides"
("Read into numbers"). B batch, T time, C channels, D = nh * hs, K = nkv * hs, H the MLP's width.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn import functional as F

from ..mistakes.report import one_line, text
from ..mistakes.steps import CORRECT, Parts, Rope, SubLayer, affine, run_steps
from ..serve.subject import Probed
from .modern_parts import DENSE, GATED, NORM_KINDS, MlpRead, NormRead, norm_function, norm_of, ones
from .modern_read import Linear, ModernRead
from .provenance import Traced, trace
from .readings import Readings

__all__ = [
    "KEY", "LESSON", "MODERN", "QK", "NotPlain", "Received", "decode", "receive", "send",
    "to_plain", "unpack_modern", "unpack_readings",
]  # fmt: skip

Tensor = torch.Tensor
Roles = dict[str, tuple[Tensor | None, ...]]  # role -> (weight, bias), or (gain,), to send
FIT = 1e-5  # a fitted sub-layer must reproduce the block's to this, relative (float32 ~1e-6)
KEY = "0"  # the key of the one part ``send`` writes
MAX_WIDTH = 1 << 16  # D, K and H at most this: a claim of more is not a block's
# the format both sides use: each linear role's weight (out, in) in letters of the widths sent
# (``meta``); norms' gains and biases (C,), lnq/lnk's (hs,); mlp1 only in a gated MLP
LESSON = {"q": "DC", "k": "DC", "v": "DC", "proj": "CD", "fc1": "HC", "fc2": "CH"}
MODERN = {"q": "DC", "k": "KC", "v": "KC", "proj": "CD", "mlp0": "HC", "mlp1": "HC", "mlp2": "CH"}
QK = ("lnq", "lnk")


class NotPlain(ValueError):
    """A sub-layer that cannot be read into numbers, or numbers that do not fit."""


def _linear(name: str, f: Callable[[Tensor], Any], n_in: int, like: Tensor) -> list[Linear]:
    """Each of ``f``'s outputs as a weight and bias: ``f`` run on zeros, the basis vectors and
    random rows, checked on the random rows, B * T rows at a time as (B, T, in)."""
    B, T = like.shape[0], like.shape[1]
    g = torch.Generator().manual_seed(7)
    probe = torch.randn(B * T, n_in, generator=g, dtype=torch.float64)
    basis = torch.cat([torch.zeros(1, n_in, dtype=torch.float64), torch.eye(n_in).double()])
    rows = torch.cat([basis, probe]).to(like.device, like.dtype)  # (1 + in + BT, in)
    chunks: list[list[Tensor]] = []  # each chunk's outputs
    for chunk in torch.split(rows, B * T):
        chunk = F.pad(chunk, (0, 0, 0, B * T - len(chunk)))  # the last one padded with zeros
        with torch.no_grad():
            got = f(chunk.reshape(B, T, -1))  # (B, T, in) -> (B, T, out), or a tuple of them
        got = got if isinstance(got, tuple) else (got,)
        chunks.append([o.reshape(B * T, -1).to(torch.float64).cpu() for o in got])
    read: list[Linear] = []
    for out in (torch.cat(o)[: len(rows)] for o in zip(*chunks, strict=True)):
        bias, theirs = out[0], out[1 + n_in :]
        weight = (out[1 : 1 + n_in] - bias).T.contiguous()  # (out, in)
        error = float((probe @ weight.T + bias - theirs).abs().max() / (theirs.abs().max() + 1e-30))
        if not error <= FIT:
            raise NotPlain(f"{name} is not what its numbers say (off by {error:.1e} of its scale)")
        read.append((weight, bias.contiguous()))
    return read


def _norm(name: str, f: SubLayer, like: Tensor, known: Tensor | None) -> NormRead:
    """``norm_of``'s reading of one of ``NORM_KINDS``, in the kind whose gain is known."""
    if like.shape[-1] < 2:
        raise NotPlain(f"{name}: a norm over {like.shape[-1]} channel cannot be read")
    n = norm_of(f, like, known=known, kinds=NORM_KINDS)
    if n.gain is None:
        raise NotPlain(f"{name} computes none of the norms {', '.join(NORM_KINDS)} (to {FIT:g})")
    if not bool(n.gain.any()):
        raise NotPlain(f"{name} does not depend on its input")
    return n


def to_plain(
    parts: Parts, like: Tensor, key: str, known: Tensor | None = None
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A norm is read in the kind whose gain is among ``known`` (the block's values, sorted)."""
    q, k, v = _linear("q, k, v", parts.qkv, parts.C, like)
    (fc1,) = _linear("fc1", parts.fc1, parts.C, like)
    (proj,) = _linear("proj", parts.proj, q[0].shape[0], like)
    (fc2,) = _linear("fc2", parts.fc2, fc1[0].shape[0], like)
    roles: Roles = {"q": q, "k": k, "v": v, "proj": proj, "fc1": fc1, "fc2": fc2}
    meta = {"C": parts.C, "D": parts.D, "H": fc1[0].shape[0], "parallel": parts.parallel}
    lns = (("ln1", parts.ln1), ("ln2", parts.ln2))
    norms = {r: _norm(r, f, like, known) for r, f in lns if f is not None}
    return _plain(key, meta, roles, norms)


def send(
    read: ModernRead,
    norms: list[NormRead],
    mlp: MlpRead,
    rope: Rope | None,
    qk_norm: tuple[Tensor, Tensor] | None,
    post: bool,
) -> tuple[dict[str, Any], dict[str, Tensor]] | None:
    """None where no standard form says it; ``mlp0``: the gate (or the dense first layer)."""
    if (
        post or mlp.activation is None
        or any(n.form not in ("rms", "layer") or n.gain is None for n in norms)
        or any(n.form == "layer" and n.bias is None for n in norms)
        or (rope is not None and rope.table != rope.pairing)
        # turned by something the forms do not name (q and k turned alike, which cancels, is
        # sent as no turn: the parent confirms it on fresh inputs)
        or (read.rotated and rope is None and qk_norm is not None)
    ):  # fmt: skip
        return None
    linear = (read.q, read.k, read.v, read.proj, *mlp.layers, read.mlp[-1])
    names = [r for r in MODERN if mlp.gated or r != "mlp1"]
    roles: Roles = dict(zip(names, linear, strict=True))
    (D, C), K, H = read.q[0].shape, read.k[0].shape[0], read.mlp[-1][0].shape[1]
    meta: dict[str, Any] = {
        "C": C, "D": D, "K": K, "H": H, "n_head": read.n_head, "activation": mlp.activation,
        "gated": mlp.gated, "parallel": read.parallel,
        "rope": None if rope is None else [rope.theta, rope.dim, rope.pairing, rope.sign],
    }  # fmt: skip
    if qk_norm is not None:
        roles.update({"lnq": (ones(qk_norm[0]),), "lnk": (ones(qk_norm[1]),)})
    # GPT-J's one norm read by both branches: sent once, as ln1 with no ln2 (the same values
    # twice would be read as one parameter read for two roles)
    sent = norms[:1] if read.parallel and _same(*norms) else norms
    return _plain(KEY, meta, roles, dict(zip(("ln1", "ln2"), sent, strict=False)))


def _plain(
    key: str, meta: dict[str, Any], roles: Roles, norms: dict[str, NormRead]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``meta`` with each norm's kind and eps (ln2 None where not sent), and every tensor (a
    norm's gains of 1 read as exactly 1: ``norm_of``)."""
    meta = {**meta, "ln2": None} | {r: {"kind": n.form, "eps": n.eps} for r, n in norms.items()}
    roles = roles | {r: (n.gain, n.bias) for r, n in norms.items()}
    tensors = {
        f"{key}.{role}.{p}": t.detach().cpu().contiguous()
        for role, ts in roles.items()
        for p, t in zip(("weight", "bias"), ts, strict=False)
        if t is not None
    }
    return meta, tensors


def _same(a: NormRead, b: NormRead) -> bool:
    if a.params and a.params == b.params:
        return True
    pairs = ((a.gain, b.gain), (a.bias, b.bias))
    return (a.form, a.eps) == (b.form, b.eps) and all(
        x is y or (x is not None and y is not None and torch.equal(x, y)) for x, y in pairs
    )


@dataclass(frozen=True)
class Received:
    """A block's parts as they arrived, checked, float64: ``roles`` role -> [weight (out, in),
    bias], a norm's [gain, bias?] or lnq/lnk's [gain (hs,)]; ``norms`` ln1 (ln2) -> (kind, eps)."""

    C: int
    D: int
    roles: dict[str, list[Tensor]]
    norms: dict[str, tuple[str, float]]
    n_head: int = 0  # 0: a lessons' block's reading; the rest is a modern block's
    activation: str = ""
    gated: bool = False
    parallel: bool = False
    rope: Rope | None = None

    def parts(self) -> Parts:
        lin = {r: affine(*ts) for r, ts in self.roles.items() if r not in (*self.norms, *QK)}
        norm: dict[str, SubLayer] = {}
        for r, (kind, eps) in self.norms.items():
            gain, *bias = self.roles[r]
            norm[r] = norm_function(kind, gain, bias[0] if bias else None, eps)
        fc1, fc2 = (lin["fc1"], lin["fc2"]) if "fc1" in lin else (lin["mlp0"], lin["mlp2"])
        if self.n_head:  # a modern block: its MLP's hidden function
            act, up = (GATED if self.gated else DENSE)[self.activation], lin.get("mlp1")
            fc1 = lambda h: act(lin["mlp0"](h)) * (up(h) if up else 1)  # noqa: E731
        qkv = lambda h: (lin["q"](h), lin["k"](h), lin["v"](h))  # noqa: E731
        ln1, ln2 = norm["ln1"], norm.get("ln2")
        return Parts(self.C, self.D, qkv, lin["proj"], fc1, fc2, ln1, ln2, self.parallel)

    def run(self, x: Tensor) -> Tensor:
        qk = (self.roles["lnq"][0], self.roles["lnk"][0]) if "lnq" in self.roles else None
        return run_steps(self.parts(), x.double(), self.n_head, None, CORRECT, self.rope, qk)


def _tensor(tensors: Mapping[str, Tensor], name: str, shape: tuple[int, ...]) -> Tensor:
    t = tensors.get(name)
    if not isinstance(t, Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, Tensor) else "nothing"
        raise NotPlain(f"{name}: expected a tensor of shape {shape}, got {got}")
    if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
        raise NotPlain(f"{name}: expected finite floating-point values")
    return t.to(torch.float64)


def decode(
    meta: object, tensors: Mapping[str, Tensor], key: str, C: int, shapes: Mapping[str, str],
) -> Received:  # fmt: skip
    if not isinstance(meta, dict) or meta.get("C") != C:
        raise NotPlain(f"a reading of a block of width {C} expected")
    sent: dict[str, Any] = {w: meta.get(w) for w in "DKH" if any(w in s for s in shapes.values())}
    if not all(isinstance(n, int) and 1 <= n <= MAX_WIDTH for n in sent.values()):
        raise NotPlain(f"the attention width D, keys' K or the MLP's H is missing ({sent})")
    widths: dict[str, int] = {"C": C, **sent}
    roles = {
        r: [_tensor(tensors, f"{key}.{r}.weight", (widths[s[0]], widths[s[1]])),
            _tensor(tensors, f"{key}.{r}.bias", (widths[s[0]],))]
        for r, s in shapes.items()
    }  # fmt: skip
    norms: dict[str, tuple[str, float]] = {}
    for role in ("ln1", "ln2")[: 1 + (meta.get("ln2") is not None)]:  # ln2 where sent
        n = meta.get(role)
        if not isinstance(n, dict) or n.get("kind") not in NORM_KINDS:
            raise NotPlain(f"{role}: a norm kind expected")
        eps = n.get("eps")
        if not isinstance(eps, (int, float)) or not 0.0 <= eps < 1.0:
            raise NotPlain(f"{role}: eps {eps!r} is not in [0, 1)")
        norms[role] = (str(n["kind"]), float(eps))
        biased = n["kind"] != "rms" or f"{key}.{role}.bias" in tensors  # an RMSNorm's may be 0
        roles[role] = [
            _tensor(tensors, f"{key}.{role}.{p}", (C,)) for p in ("weight", "bias")[: 1 + biased]
        ]
    return Received(C, widths["D"], roles, norms, parallel=meta.get("parallel") is True)


def unpack_readings(
    meta: dict[str, Any],
    tensors: dict[str, Tensor],
    subject: Probed,
    chosen: Mapping[str, Tensor],
    notes: list[str],
) -> tuple[Readings, list[Traced]] | str:
    C = subject.C
    try:
        notes += [text(n) for n in meta.get("notes", [])]
        if "why" in meta:
            return text(meta["why"])
        x, heads, count = tensors["x"], tuple(meta["heads"]), int(meta["readings"])
        shown = [text(d) for d in meta["describe"]]
        got = [decode(p, tensors, str(i), C, LESSON) for i, p in enumerate(meta["parts"])]
        parts = [g.parts() for g in got]
        if (
            x.dim() != 3 or x.shape[-1] != C or not x.is_floating_point() or not parts
            or len(shown) != len(parts) or not 0 <= count <= len(parts) or not heads
            or not all(isinstance(h, int) and 1 <= h <= p.D for h in heads for p in parts)
            or not bool(torch.isfinite(x).all())
        ):  # fmt: skip
            raise NotPlain("the readings do not fit together")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        return f"the block's process sent readings that do not check ({one_line(e)})"
    traced = [trace(g.roles, chosen, subject.dtype) for g in got]
    kept = [i for i, t in enumerate(traced) if not t.why]
    if not kept:
        return traced[-1].why
    main = [i for i in kept if i < count] or kept  # no main reading left: the fallback's it is
    order = main + [i for i in kept if i not in main]
    kept_parts = (tuple(parts[i] for i in main), tuple(parts[i] for i in order[len(main) :]))
    readings = Readings(*kept_parts, heads, x.double(), [shown[i] for i in order].__getitem__)
    return readings, [traced[i] for i in order]  # each reading's weights, traced


def receive(meta: Any, tensors: Mapping[str, Tensor], C: int) -> Received:
    try:
        n_head, gated, activation = meta["n_head"], meta["gated"] is True, meta["activation"]
        rope = meta["rope"]
        known = activation in (GATED if gated else DENSE)
    except (KeyError, TypeError) as e:
        raise NotPlain(f"the modern parts sent are incomplete ({one_line(e)})") from None
    if not (known and isinstance(n_head, int) and 1 <= n_head <= 4096):
        raise NotPlain("the modern parts sent do not describe a block")
    try:
        shapes = {r: s for r, s in MODERN.items() if gated or r != "mlp1"}
        got = decode(meta, tensors, KEY, C, shapes)
        hs, K = got.D // n_head, got.roles["k"][0].shape[0]
        qk = [r for r in QK if f"{KEY}.{r}.weight" in tensors]
        got.roles.update({r: [_tensor(tensors, f"{KEY}.{r}.weight", (hs,))] for r in qk})
    except NotPlain as e:
        raise NotPlain(f"the modern parts sent do not fit together ({e})") from None
    if "ln2" not in got.norms and not got.parallel:  # one norm for both branches: GPT-J's only
        raise NotPlain("the modern parts sent do not describe a block")
    if got.D % n_head or K % hs or n_head % (K // hs) or len(qk) == 1:
        raise NotPlain("the modern parts sent do not fit together")
    if rope is not None:
        if not (
            isinstance(rope, list) and len(rope) == 4 and rope[2] in ("halves", "adjacent")
            and isinstance(rope[1], int) and 2 <= rope[1] <= hs and rope[1] % 2 == 0
            and isinstance(rope[0], float) and 1.0 < rope[0] < 1e9 and rope[3] in (1.0, -1.0)
        ):  # fmt: skip
            raise NotPlain("the rotary embedding sent is not one the checker knows")
        rope = Rope(rope[0], rope[1], rope[2], rope[2], float(rope[3]))
    return replace(got, n_head=n_head, activation=activation, gated=gated, rope=rope)


def unpack_modern(
    modern: Mapping[str, Any], C: int, dtype: torch.dtype, chosen: Mapping[str, Tensor]
) -> tuple[Received, Traced] | str:
    """The modern parts sent, traced to the values the checker chose; else why they cannot be."""
    if not modern.get("parts"):
        return "its process sent no parts the checker can rebuild it from"
    try:
        parts = receive(modern["parts"], dict(modern.get("tensors") or {}), C)
    except NotPlain as e:
        return str(e)
    heads = {r: parts.roles[r][0].shape[0] * parts.n_head // parts.D for r in ("q", "k", "v")}
    traced = trace(parts.roles, chosen, dtype, heads, measured=True)
    return traced.why or (replace(parts, roles=traced.roles), traced)
