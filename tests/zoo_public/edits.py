"""Edits that make the wiring mistakes in the many blocks whose forward reads like the lessons'.

A block module's ``MISTAKES`` may take these from ``residual`` instead of spelling them out: its
forward pass has the two lines ``x = x + sa(ln1(x))`` and ``x = x + ffwd(ln2(x))`` (whatever the
names), and each mistake is what a learner writes instead of one or both of them.
"""

from __future__ import annotations


def residual(sa: str, ln1: str, ffwd: str, ln2: str, x: str = "x") -> dict[str, list]:
    """The wiring mistakes as edits of ``{x} = {x} + {sa}({ln1}({x}))`` and its MLP twin.

    Example:
        >>> residual("self.attn", "self.ln_1", "self.mlp", "self.ln_2")["no_residual:attn"]
        [('x = x + self.attn(self.ln_1(x))', 'x = self.attn(self.ln_1(x))')]
    """
    attn = f"{x} = {x} + {sa}({ln1}({x}))"
    mlp = f"{x} = {x} + {ffwd}({ln2}({x}))"
    return {
        "post_norm": [
            (attn, f"{x} = {ln1}({x} + {sa}({x}))"),
            (mlp, f"{x} = {ln2}({x} + {ffwd}({x}))"),
        ],
        "no_residual:attn": [(attn, f"{x} = {sa}({ln1}({x}))")],
        "no_residual:mlp": [(mlp, f"{x} = {ffwd}({ln2}({x}))")],
        "no_residual:both": [(attn, f"{x} = {sa}({ln1}({x}))"), (mlp, f"{x} = {ffwd}({ln2}({x}))")],
        "shared_norm": [(mlp, f"{x} = {x} + {ffwd}({ln1}({x}))")],
        "inplace": [(attn, f"{x} += {sa}({ln1}({x}))"), (mlp, f"{x} += {ffwd}({ln2}({x}))")],
    }
