"""What the block's process sent (``plain``), checked (``decode``), traced to the values the
checker chose and built back into parts run by the checker's own code (``unpack_readings``,
``unpack_modern``). C channels, D = nh * hs, K = nkv * hs, H the MLP's width.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..mistakes.report import one_line, text
from ..mistakes.steps import CORRECT, Parts, Rope, SubLayer, affine, parallel, run_steps
from ..serve.subject import Probed
from .modern_parts import DENSE, GATED
from .plain import KEY, LESSON, MODERN, NORM_KINDS, QK, NotPlain, norm_function
from .provenance import Traced, trace
from .readings import Readings

__all__ = ["Received", "from_plain", "receive", "unpack_modern", "unpack_readings"]

Tensor = torch.Tensor
MAX_WIDTH = 1 << 16  # D, K and H at most this: a claim of more is not a block's


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
        if self.n_head:  # a modern block: its MLP's hidden function; one norm, or two
            act, up = (GATED if self.gated else DENSE)[self.activation], lin.get("mlp1")
            fc1 = lambda h: act(lin["mlp0"](h)) * (up(h) if up else 1)  # noqa: E731
            norm.setdefault("ln2", norm["ln1"])
        qkv = lambda h: (lin["q"](h), lin["k"](h), lin["v"](h))  # noqa: E731
        return Parts(self.C, self.D, qkv, lin["proj"], fc1, fc2, norm["ln1"], norm.get("ln2"))

    def run(self, x: Tensor) -> Tensor:
        qk = (self.roles["lnq"][0], self.roles["lnk"][0]) if "lnq" in self.roles else None
        steps = replace(CORRECT, wiring=parallel) if self.parallel else CORRECT
        return run_steps(self.parts(), x.double(), self.n_head, None, steps, self.rope, qk)


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
    for role in ("ln1", "ln2"):
        n = meta.get(role)
        if n is None and role == "ln2":
            continue
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
    return Received(C, widths["D"], roles, norms)


def from_plain(meta: object, tensors: Mapping[str, Tensor], key: str, C: int) -> Parts:
    return decode(meta, tensors, key, C, LESSON).parts()


def unpack_readings(
    meta: dict[str, Any],
    tensors: dict[str, Tensor],
    subject: Probed,
    chosen: Mapping[str, Tensor],
    notes: list[str],
) -> tuple[Readings, list[dict[str, list[Tensor]]]] | str:
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
    why = ""
    read = [g.roles for g in got]  # each reading's weights by role
    kept = [i for i, r in enumerate(read) if not (why := trace(r, chosen, subject.dtype).why)]
    if not kept:
        return why
    main = [i for i in kept if i < count] or kept  # no main reading left: the fallback's it is
    rest = [i for i in kept if i not in main]
    described = [shown[i] for i in main + rest].__getitem__
    kept_parts = (tuple(parts[i] for i in main), tuple(parts[i] for i in rest))
    readings = Readings(*kept_parts, heads, x.to(torch.float64), described)
    return readings, [read[i] for i in main + rest]


def receive(meta: Any, tensors: Mapping[str, Tensor], C: int) -> Received:
    try:
        n_head, gated, activation = meta["n_head"], meta["gated"] is True, meta["activation"]
        rope, is_parallel = meta["rope"], meta.get("parallel") is True
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
    if "ln2" not in got.norms and not is_parallel:  # one norm for both branches: GPT-J's only
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
    return replace(
        got, n_head=n_head, activation=activation, gated=gated, parallel=is_parallel, rope=rope
    )


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
    hs = parts.D // parts.n_head
    heads = {r: parts.roles[r][0].shape[0] // hs for r in ("q", "k", "v")}
    traced = trace(parts.roles, chosen, dtype, heads, measured=True)
    return traced.why or (replace(parts, roles=traced.roles), traced)
