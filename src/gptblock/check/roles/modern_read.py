"""A modern block's parts read from one recorded forward pass: every weight (q, k, v before any
rotation or repeat of key/value heads) and the rotation. docs/checker.md, "The modern block".
B batch, T time, C channels, nh heads, hs head size, r rotated channels of each head.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..mistakes.report import CAUGHT
from ..mistakes.steps import Rope, rms
from .cores import Core, cores
from .dataflow import Role, Unread, as_rows, back, find_roles, static_names, to_weight
from .trace import Trace, replay
from .weights import find_norms, measure, order_norms

__all__ = ["THETAS", "ModernRead", "Source", "Turn", "measure_turn", "qk_gains", "read_modern", "ropes"]  # fmt: skip

Tensor = torch.Tensor
THETAS = (10000.0, 1e6, 500000.0, 100000.0)  # GPT-NeoX / Llama 2, Qwen2, Llama 3, others
Linear = tuple[Tensor, Tensor]  # weight (out, in), bias (out,)


def heads(
    core: Tensor, B: int, nh: int, T: int, hs: int, key: bool = False, heads_first: bool = False
) -> Tensor | None:
    """The scores' operand as (B, nh, T, hs), from (..., T, hs) or a ``key``'s (..., hs, T); the
    heads before the batch where the shape says so, (nh, B, ...), or ``heads_first``."""
    if core.numel() != B * nh * T * hs or core.dim() < 2:
        return None
    rows, last = core.shape[-2:]
    if (rows, last) == (hs, T) and (key or (rows, last) != (T, hs)):
        core = core.transpose(-2, -1)
    elif (rows, last) not in ((T, hs), (nh * T, hs)):  # (B, nh * T, hs): multi-query's folded q
        return None
    if heads_first or (core.dim() == 4 and core.shape[:2] == (nh, B) != (B, nh)):
        return core.reshape(nh, B, T, hs).transpose(0, 1)
    return core.reshape(B, nh, T, hs)


@dataclass(frozen=True)
class Turn:
    dim: int  # r
    theta: float
    fits: bool
    # "halves", "adjacent"; "spread": pairs turned alike laid out otherwise (modded-nanogpt's
    # (i, i + hs/2) on a quarter of the head); "other": i turned into j unlike j into i
    pairing: str
    pairs: tuple[tuple[int, int], ...] = ()  # the turned channels of head 0, (i, j) with i < j


def measure_turn(
    trace: Trace, source: int, core: int, B: int, nh: int, T: int, hs: int
) -> Turn | None:
    """The rotation from q's projection ``source`` to the scores' operand, on head 0."""
    if T < 2:
        return None
    nh = min(nh, trace.nodes[core].value.numel() // (B * T * hs))  # 1: head 0's own core
    try:
        run = replay(trace, source, core)
        like = trace.nodes[source].value
        rows = as_rows(like, B, T)  # (B * T, F): the product may be channels first

        def response(lit: Tensor) -> Tensor | None:  # (``replay`` runs without gradients)
            return heads(run(as_rows(lit, B, T, tuple(like.shape))), B, nh, T, hs)

        # less what zeros give: a bias added after the product (an einsum's) turns too
        if (zero := response(torch.zeros_like(rows))) is None:
            return None
        leaks: dict[int, tuple[int, float]] = {}  # channel of head 0 -> (partner, sin w)
        for unit in torch.eye(rows.shape[-1], dtype=rows.dtype, device=rows.device):  # each channel
            if (out := response(unit.expand_as(rows))) is None:  # lit at every position
                return None
            out = out - zero
            at0, at1 = out[0, :, 0].double(), out[0, :, 1].double()  # (nh, hs)
            head, i = divmod(int(at0.abs().argmax()), hs)
            if head == 0 and float(at0.abs().max()) != 0.0 and i not in leaks:
                other = at1[0].clone()
                other[i] = 0.0
                j = int(other.abs().argmax())
                leaks[i] = (j, float(other[j].abs() / at0[0, i].abs()))
    except CAUGHT:
        return None
    turned = {i: (j, s) for i, (j, s) in leaks.items() if s > 1e-9}
    r = len(turned)
    if r < 2 or r % 2:
        return None
    halves = all(j == (i + r // 2) % r for i, (j, _) in turned.items())
    adjacent = all(j == i ^ 1 for i, (j, _) in turned.items())
    # a rotation turns i into j as much as j into i; gains after it (HunYuan's qk norm) do not
    even = all(abs(s - turned.get(j, (i, 0.0))[1]) <= 1e-4 * s for i, (j, s) in turned.items())
    pairing = "halves" if halves else "adjacent" if adjacent else "spread"
    theta = _ladder(sorted({round(math.asin(min(s, 1.0)), 12) for _, s in turned.values()}), r)
    pairs = tuple(sorted((i, j) for i, (j, _) in turned.items() if i < j))
    return Turn(r, theta or 0.0, theta is not None, pairing if even else "other", pairs)


def _ladder(w: list[float], r: int) -> float | None:  # theta where w are theta ** (-2p / r)
    distinct: list[float] = []
    for x in reversed(w):  # fast to slow; within 1e-6 of each other, one (float32 tables)
        if not distinct or abs(distinct[-1] - x) > 1e-6 * distinct[-1]:
            distinct.append(x)
    if len(distinct) != r // 2 or abs(distinct[0] - 1.0) > 1e-4:
        return None
    if r == 2:
        return 10000.0  # one pair turns one radian per position whatever the base
    each = [math.exp(-math.log(x) * r / (2 * p)) for p, x in enumerate(distinct) if p]
    theta = sorted(each)[len(each) // 2]
    if any(abs(t - theta) > 1e-3 * theta for t in each):
        return None
    rounded = (float(f"{theta:.{digits}e}") for digits in range(6))  # 8e6, 10000
    return next((near for near in rounded if abs(near - theta) <= 1e-4 * theta), theta)


def ropes(hs: int, rotated: bool, turn: Turn | None = None) -> list[Rope | None]:
    """Every rotary embedding a correct block may use: the measured ``turn``'s, else common ones."""
    if not rotated or (turn is not None and not turn.fits):
        return [None]
    dims = [d for d in (hs, hs // 2, hs // 4) if d >= 2 and d % 2 == 0]
    dims, thetas = ([turn.dim], [turn.theta]) if turn else (dims, list(THETAS))
    found = itertools.product(dims, ("halves", "adjacent"), (1.0, -1.0), thetas)
    # what happens between projection and scores may be a qk norm only: None last
    return [*(Rope(theta, dim, pair, pair, sign) for dim, pair, sign, theta in found), None]


@dataclass
class ModernRead:
    n_head: int
    roles: dict[str, Role]  # as ``find_roles`` found them: q k v proj fc1 (fc3) fc2
    q: Linear
    k: Linear
    v: Linear
    proj: Linear
    mlp: list[Linear]  # fc1 (and a gated MLP's fc3), then fc2
    norm1: Callable[[Tensor], Tensor]  # the stream -> h1, as the block computes it
    norm2: Callable[[Tensor], Tensor]  # the stream the MLP reads -> h2
    parallel: bool  # the MLP reads the block's input, not the stream after attention
    rotated: bool  # q or k reach the core through more than reshapes and scalar factors
    norm_params: tuple[tuple[str, ...], ...]  # what each norm reads (ln1, ln2)
    norms: list[Callable[[Tensor], Tensor]]  # the block's norms where they run, ln1 and ln2
    turn: Turn | None  # the rotation measured on q (``measure_turn``), None: not measured
    trace: Trace  # the forward pass, for what the comparison cannot explain (``unmodelled``)
    core: Core
    ends: tuple[int, int, int]  # the outputs of q's product (a rotation's start), proj, the MLP

    def rows(self, what: str) -> Tensor:
        """The input ``x``, output ``y`` or a role's input (q's: h1, fc1's: h2, proj's: the heads
        merged, fc2's: the MLP's hidden values) as (B, T, F), as the block computed it."""
        t = self.trace
        node = self.roles[what].put if what in self.roles else {"x": t.input, "y": t.output}[what]
        B, T = t.nodes[t.input].shape[:2]
        return as_rows(t.nodes[node].value, B, T).double().reshape(B, T, -1)


@dataclass(frozen=True)
class Source:
    """What the modern comparison asks of the block (of its process: the answers are data)."""

    trace_of: Callable[[Tensor], Trace]
    call: Callable[[Tensor], object]
    cache: Callable[[Tensor], tuple[dict[str, Any], dict[str, Tensor]]]


def read_modern(trace: Trace) -> ModernRead | None:
    """``None`` for no core, or one a sequence; Unread: parts that cannot be read."""
    B, T, _ = trace.nodes[trace.input].shape
    if not (found := cores(trace)):
        return None
    try:
        roles, nh = find_roles(trace, B, T)
    except Unread:
        if len(found) > 1:
            return None  # one a sequence (a loop over them): ``check_modern`` reads B = 1
        raise
    if len(found) not in (1, nh):
        return None
    core = found[0]  # head 0's where each head has its own (a module a head)
    if roles["proj"].put == roles["proj"].get[0]:
        raise Unread("no output projection reads the attention's output")
    h1, h2 = roles["q"].put, roles["fc1"].put
    # the stream the MLP's norm reads: the latest residual sum after the attention's output
    # ``after``; the block's input in a parallel block
    after, behind, shape = roles["proj"].get[0], trace.ancestors(h2), trace.nodes[trace.input].shape
    sums = [
        n for n in behind
        if (op := trace.producer(n)) is not None and op.base == "add"
        and trace.nodes[n].shape == shape and sum(trace.nodes[i].data for i in op.inputs) == 2
        and after in trace.ancestors(n)
    ]  # fmt: skip
    stream = max(sums, default=after) if after in behind else trace.input
    norm1, norm2 = replay(trace, trace.input, h1), replay(trace, stream, h2)
    rotated = roles["q"].turned or roles["k"].turned
    try:  # ln1 and ln2 where they run, for a post-norm block's
        norms = [n.function for n in order_norms(find_norms(trace, B, T), h1, h2)]
    except Unread:
        norms = []
    read = measure(trace, roles, B, T)
    D, K = read["q"][0].shape[0], read["k"][0].shape[0]
    if D % nh or K != read["v"][0].shape[0] or D % K:
        raise Unread(
            f"q, k, v map to {D}, {K}, {read['v'][0].shape[0]} channels: "
            f"not {nh} query heads and a divisor of them as key/value heads"
        )
    if (made := to_weight(trace, roles["q"].get[0])) is None:  # q's product: the rotation's start
        raise Unread("q is not read at its matrix product")
    ends = (made[0].outputs[0], roles["proj"].get[0], roles["fc2"].get[0])
    ins = ((trace.input, h1), (stream, h2))
    params = tuple(tuple(static_names(trace, trace.between(*p))) for p in ins)
    turn = measure_turn(trace, ends[0], core.q, B, nh, T, D // nh) if rotated else None
    q, k, v, proj, *mlp = (w[:2] for w in read.values())
    parallel = stream == trace.input
    return ModernRead(
        nh, roles, q, k, v, proj, mlp, norm1, norm2, parallel, rotated, params, norms, turn, trace,
        core, ends,
    )  # fmt: skip


def qk_gains(read: ModernRead, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor] | None:
    """A qk norm's gains (an RMSNorm per head), read at position 0 where nothing turns."""
    B, T, _ = q.shape
    hs = q.shape[-1] // read.n_head
    gains = []
    for key, (lin, n) in enumerate(((q, read.core.q), (k, read.core.k))):  # as the scores read
        value, factor, m = read.trace.nodes[n].value.double(), 1.0, n
        while (step := back(read.trace, m)) is not None:  # a scalar factor after the norm: the
            m, factor = step[0], factor * step[1]  # scores' scale split onto q and k, not a gain
        at0 = lin[:, 0]  # (B, D): position 0; head 0 its first hs channels, or split strided
        bases = [rms(h0, factor, 1e-6) for h0 in (at0[:, :hs], at0.reshape(B, hs, -1)[..., 0])]
        nh = value.numel() // (B * T * hs)  # k's: the key/value heads (SDPA's enable_gqa)
        found = []  # (spread over the batch, gains): (B * nh, T, hs) may be (nh * B, T, hs)
        for first, base in itertools.product((False, True), bases):
            if (core := heads(value, B, nh, T, hs, key == 1, first)) is not None:
                ratio = core[:, 0, 0] / base  # (B, hs)
                spread = float(ratio.std(dim=0, correction=0).sum())
                found.append((spread, ratio.median(dim=0).values))
        if not found:
            return None
        gains.append(min(found, key=lambda f: f[0])[1])  # (hs,)
    return gains[0], gains[1]
