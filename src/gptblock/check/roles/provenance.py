"""The weights the checker chooses (``choose``) and the weights read back traced to them
(``trace``): each entry a chosen one (or exactly 0 or 1), no two norms made of the same entries.
docs/checker.md, "How it decides" ("The block cannot break the checker", provenance).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

__all__ = ["Traced", "choose", "nearest", "snap", "sorted_values", "trace", "unread"]

Tensor = torch.Tensor
RELATIVE = {torch.float64: 1e-9, torch.float32: 1e-6}  # a read entry's distance, x its role's scale
SHARED = 0.5  # two roles sharing more than this fraction of their entries are one part read twice
SNAP = 1e-3  # a gain read as a ratio is this close (x its scale) to the value the checker chose
READ = 1e-6  # a matrix measured from traced values (a float32 step on the way) is this close
REPEATED = 0.05  # a role's entries repeated more than this: one weight read twice (not by chance)


def choose(current: Mapping[str, Tensor], C: int, g: torch.Generator) -> dict[str, Tensor]:
    """Matrices N(0, 1/C), so that a scale mistake shows; vectors moved by ~0.1, so that a wrong
    norm or a dropped bias shows (a fresh LayerNorm is the identity, many biases 0); a mask kept
    as it is."""
    chosen = {}
    for name, value in current.items():
        if _mask(value):  # kept: no weight, and random values would unmask the future
            chosen[name] = value.to(torch.float64, copy=True)  # (in process: the parameter's own)
            continue
        noise = torch.randn(value.shape, generator=g, dtype=torch.float64) if value.dim() else 0.0
        matrix = sum(n > 1 for n in value.shape) >= 2
        chosen[name] = noise * C**-0.5 if matrix else value.to(torch.float64) + noise * 0.1
    return chosen


def _mask(value: Tensor) -> bool:
    """A causal mask held as a parameter (s96 unseen set: ``nn.Parameter(mask, requires_grad=
    False)``): non-finite entries, or a triangle of one value and the rest another (not an
    identity or a zero matrix, which a weight may start as)."""
    if not bool(value.isfinite().all()):
        return True
    if value.dim() < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
        return False
    same = value == value[..., :1, :1]
    ones = torch.ones(value.shape[-2:], dtype=torch.bool, device=value.device)
    return bool((same == ones.tril()).all() or (same == ones.triu()).all())


def _search(values: Tensor, t: Tensor, right: bool = False) -> Tensor:
    """``torch.searchsorted``, ``t``'s entries searched in order (3x as fast for millions of
    entries: each search starts where the last one's memory is)."""
    ordered, perm = t.flatten().sort()
    at = torch.empty_like(perm)
    at[perm] = torch.searchsorted(values, ordered, right=right)
    return at.reshape(t.shape)


def nearest(values: Tensor, t: Tensor) -> Tensor:
    at = _search(values, t)
    below, above = (at - 1).clamp(0, len(values) - 1), at.clamp(0, len(values) - 1)
    return torch.where((t - values[below]).abs() <= (values[above] - t).abs(), below, above)


def snap(
    t: Tensor, values: Tensor, tol: float, shifts: tuple[float, ...] = (0.0,)
) -> tuple[Tensor, Tensor] | None:
    """``t`` (float64), each entry the nearest of ``values`` (plus a shift: 1 for a gain stored
    as ``gain - 1``) within ``tol``, exact 0s and 1s kept; and each one's index (-1: kept)."""
    g = t.to(torch.float64).contiguous()  # searchsorted copies (and warns on) any other
    found = (g == 0.0) | (g == 1.0)
    best, at = g.clone(), torch.full(g.shape, -1, dtype=torch.long)
    for shift in shifts:
        i = nearest(values, g - shift)
        fits = ((values[i] + shift - g).abs() <= tol) & ~found
        best, at = torch.where(fits, values[i] + shift, best), torch.where(fits, i, at)
        found = found | fits
    return (best, at) if bool(found.all()) else None


@dataclass(frozen=True)
class Traced:
    """A role reading chosen values twice, or two sharing them, is the block's doing (two norms
    sharing them, refused: the reading's, as one norm is read once)."""

    why: str = ""  # why they are not the values chosen ("" when they are: only then the rest count)
    repeats: tuple[str, ...] = ()
    used: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))  # (N,): the
    # chosen values read, by their positions in sorted_values
    roles: dict[str, list[Tensor]] = field(default_factory=dict)  # the weights, snapped to them
    at: dict[str, Tensor] = field(default_factory=dict)  # a matrix's: where each entry was read
    shared: tuple[str, ...] = ()  # the repeats two roles make
    # a matrix's: each row's parameter and output index in it, (D, 2) (-1: read otherwise)
    rows: dict[str, Tensor] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # the parameters, as ``rows`` numbers them
    strided: tuple[str, ...] = ()  # q, k or v heads that take a parameter's rows by strides

    def with_heads(self, heads: Mapping[str, int]) -> Traced:
        """The repeats again, a head that reads another's named (``heads``: role -> count), and
        the heads that take their rows of a parameter by strides."""
        own = [r for role, at in self.at.items() for r in _repeats(role, at, heads.get(role, 0))]
        found = {r: s for r, rows in self.rows.items() if (s := _strided(rows, heads.get(r, 0)))}
        said = []
        for (step, param, hs), roles in itertools.groupby(found, key=lambda r: found[r][:3]):
            who = list(roles)
            a = found[who[0]][3]
            named = " and ".join([", ".join(who[:-1]), who[-1]] if len(who) > 1 else who)
            said.append(
                f"{named}'s heads each take one row in {step} of {self.names[param]} "
                f"({who[0]}'s head 1: rows {a}, {a + step}, {a + 2 * step}, ...), where the lessons' "
                f"head h takes a run of {hs} rows: a split by view(B, T, hs, nh)"
            )
        return replace(self, repeats=(*own, *self.shared), strided=tuple(said))


def sorted_values(chosen: Mapping[str, Tensor], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    return torch.cat([v.to(dtype).to(torch.float64).flatten() for v in chosen.values()]).sort()


def trace(
    roles: Mapping[str, list[Tensor]],
    chosen: Mapping[str, Tensor],
    dtype: torch.dtype,
    heads: Mapping[str, int] | None = None,
    measured: bool = False,
) -> Traced:
    """``heads`` (role -> head count) names a head that repeats another's; a norm's gain may be
    1 + the chosen values; ``measured``: weights measured from traced values (SNAP, READ)."""
    values = sorted_values(chosen, dtype)[0] if chosen else torch.zeros(0)
    if not values.numel():
        return Traced("the block has no parameters to read weights from")
    used: dict[str, Tensor] = {}  # role -> (N,) bool
    shared: list[str] = []
    where: dict[str, Tensor] = {}  # a matrix's indices
    snapped: dict[str, list[Tensor]] = {}
    for role, tensors in roles.items():
        gain = role.startswith("ln")  # (gain,) or a LayerNorm's (gain, bias): read as ratios
        scale = max((float(t.abs().max()) for t in tensors if t.numel()), default=0.0)
        tol = RELATIVE[dtype] * scale + 1e-300
        found = [
            snap(t, values, (SNAP if gain else READ) * float(t.abs().max()) + 1e-300 if measured
                 else tol, (0.0, 1.0) if gain and i == 0 else (0.0,))
            for i, t in enumerate(tensors)
        ]  # fmt: skip
        got = [f for f in found if f is not None]
        if len(got) < len(found):
            why = f"the weights read for {role} are not the values the checker gave the block"
            return Traced(why)
        snapped[role] = [g[0] for g in got]
        # each value read, its equals (the dtype rounds them together) and every value at least
        # as near the read as it: which one was read cannot be told (not a fixed window: a value
        # merely near an exact read was not read, UnusedLinearBlock)
        at = torch.cat([g[1].flatten() for g in got])
        pairs = zip(tensors, got, strict=True)
        err = torch.cat([(t.to(torch.float64) - g[0]).flatten() for t, g in pairs])
        near, err = values[at[at >= 0]], err[at >= 0]
        lo = _search(values, torch.minimum(near, near + err - err.abs()))
        hi = _search(values, torch.maximum(near, near + err + err.abs()), right=True)
        edges = torch.zeros(len(values) + 1, dtype=torch.long)  # +1 at each lo, -1 at each hi
        edges.index_add_(0, lo, torch.ones_like(lo)).index_add_(0, hi, -torch.ones_like(hi))
        used[role] = edges.cumsum(0)[:-1] > 0  # in some [lo, hi)
        if tensors[0].dim() == 2:
            where[role] = got[0][1]
    counts = {role: int(mask.sum()) for role, mask in used.items()}  # once, not once a pair
    for a, b in itertools.combinations(used, 2):
        smaller, both = min(counts[a], counts[b]), used[a] & used[b]
        if smaller and int(both.sum()) > SHARED * smaller:
            if a.startswith("ln") or b.startswith("ln"):  # one norm: shared_norm's, not read so
                return Traced(f"{a} and {b} were read from the same parameters")
            shared.append(f"{a} and {b} read the same weights ({_holding(chosen, both, dtype)})")
    read = torch.zeros(len(values), dtype=torch.bool)
    for mask in used.values():
        read |= mask
    rows = {role: _rows(at, chosen, dtype) for role, at in where.items() if role in ("q", "k", "v")}
    traced = Traced("", (), read, snapped, where, tuple(shared), rows, tuple(chosen))
    return traced.with_heads(heads or {})


def _rows(at: Tensor, chosen: Mapping[str, Tensor], dtype: torch.dtype) -> Tensor:
    """For each row of a matrix read at ``at`` (D, C) (positions in ``sorted_values``), the
    parameter it was read from and its output index there, (D, 2): the index over the dims
    that stay the same along the row (a Linear's row, a Conv1D's column); -1 where it mixes."""
    order = sorted_values(chosen, dtype)[1]
    ends = torch.tensor([v.numel() for v in chosen.values()]).cumsum(0)
    known = at >= 0
    flat = order[at.clamp(min=0)]
    param = torch.searchsorted(ends, flat, right=True)  # (D, C)
    local = flat - torch.cat([torch.zeros(1, dtype=ends.dtype), ends])[param]
    out = torch.full((at.shape[0], 2), -1, dtype=torch.long)
    shapes = [v.shape for v in chosen.values()]
    for r in range(at.shape[0]):
        p, f = param[r][known[r]], local[r][known[r]]
        if not p.numel() or bool((p != p[0]).any()):
            continue
        shape = shapes[int(p[0])]
        index = torch.stack(torch.unravel_index(f, shape))  # (dims, n)
        fixed = [d for d in range(len(shape)) if bool((index[d] == index[d, 0]).all())]
        if len(fixed) == len(shape) and f.numel() > 1:
            continue  # one value read again and again: no row
        position = 0
        for d in fixed:
            position = position * shape[d] + int(index[d, 0])
        out[r] = torch.tensor([int(p[0]), position])
    return out


def _strided(rows: Tensor, heads: int) -> tuple[int, int, int, int] | None:
    """(step, parameter, hs, head 1's first row) where the role takes a run of a parameter's rows
    (q's third of a packed qkv, as ``split(C)`` takes it) and each head every step-th row of it
    (step > 1), where the lessons' head h takes rows h * hs to (h + 1) * hs: the view(B, T, hs,
    nh) split (s96 unseen set: einops' "b t (three d h)" for "(three h d)"). Not where the role's
    rows are spread over the parameter: a packing of its own (NeoX's "(h three d)", the
    self-attention-cv zoo block's "(d k h)", "(h d three)")."""
    if heads < 2 or rows.shape[0] % heads or bool((rows < 0).any()):
        return None
    per = rows.reshape(heads, -1, 2)  # (nh, hs, 2): each head's rows
    steps = per[:, 1:, 1] - per[:, :-1, 1]
    if per.shape[1] < 2 or bool((per[:, :, 0] != per[0, 0, 0]).any()):
        return None
    step, taken = int(steps[0, 0]), per[:, :, 1].flatten().sort().values
    if step <= 1 or bool((steps != step).any()):
        return None
    if not torch.equal(taken - taken[0], torch.arange(len(taken))):
        return None  # not a run of the parameter's rows (q's third): a packing of its own
    return step, int(per[0, 0, 0]), per.shape[1], int(per[1, 0, 1])


def _holding(chosen: Mapping[str, Tensor], at: Tensor, dtype: torch.dtype) -> str:
    """The parameters holding the values at positions ``at`` (N,) of ``sorted_values``."""
    flat = sorted_values(chosen, dtype)[1][at]
    ends = torch.tensor([v.numel() for v in chosen.values()]).cumsum(0)
    held, at_ends = list(chosen), torch.searchsorted(ends, flat, right=True).tolist()
    names = [held[i] for i in sorted(set(at_ends))]
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _repeats(role: str, at: Tensor, heads: int) -> list[str]:
    if heads > 1 and at.shape[0] % heads == 0:
        blocks = at.reshape(heads, -1)  # (nh, hs * in): head h's rows, laid end to end
        copies: dict[int, list[int]] = {}  # head -> the later heads that are it
        for h in range(1, heads):
            same = [g for g in range(h) if torch.equal(blocks[h], blocks[g])]
            if same and bool((blocks[h] >= 0).any()):
                copies.setdefault(same[0], []).append(h)
        if copies:
            return [
                f"{role}'s head{'s' if len(hs) > 1 else ''} {', '.join(map(str, hs))} "
                f"{'are' if len(hs) > 1 else 'is'} its head {g}'s weights again"
                for g, hs in copies.items()
            ]
    real = at[at >= 0]
    repeated = real.numel() - int(torch.unique(real).numel())
    if real.numel() and repeated > REPEATED * real.numel():
        return [f"{role} reads {repeated} of its {real.numel()} weights twice"]
    return []


def unread(chosen: Mapping[str, Tensor], used: Tensor, dtype: torch.dtype) -> dict[str, Tensor]:
    if not chosen:
        return {}
    order = sorted_values(chosen, dtype)[1]
    read = torch.zeros(order.numel(), dtype=torch.bool)
    if len(used) == len(order):  # (else nothing was read: ``trace`` said why)
        read[order[used]] = True
    pieces = torch.split(~read, [v.numel() for v in chosen.values()])
    masks = {n: m.reshape(v.shape) for (n, v), m in zip(chosen.items(), pieces, strict=True)}
    return {n: m for n, m in masks.items() if bool(m.any())}
