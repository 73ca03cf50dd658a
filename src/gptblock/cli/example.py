"""``gptblock example``: the second lesson's worked example, run and checked."""

from __future__ import annotations

import argparse

import torch

from ..mha import TransformerBlock


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "example",
        help="run the lesson's worked example: which outputs change when one token changes",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seed", type=int, default=0, help="seed for the weights and the input")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    B, T, C, nh = 2, 5, 16, 2
    block = TransformerBlock(C, nh).double().eval()
    x = torch.randn(B, T, C, dtype=torch.float64)
    with torch.no_grad():
        y = block(x)
        print(
            f"TransformerBlock(d_model={C}, n_heads={nh}): input {tuple(x.shape)} -> output {tuple(y.shape)}"
        )
        print("change token t; which output positions move? (max |change| per position, float64)")
        print("  t | " + " ".join(f"pos {p:<6}" for p in range(T)))
        ok = True
        for t in range(T):
            x2 = x.clone()
            x2[:, t] += torch.randn(B, C, dtype=torch.float64)
            diff = (block(x2) - y).abs().amax(dim=(0, 2))  # (T,)
            ok &= bool((diff[:t] == 0).all() and (diff[t:] > 0).all())
            print(f"  {t} | " + " ".join(f"{d:<10.2e}" for d in diff.tolist()))
    print("PASS: positions before t never change" if ok else "FAIL: a position saw the future")
    return 0 if ok else 1
