"""A bias-free linear layer written ``torch.baddbmm(x.new_zeros(...), x, W^T, beta=0)`` (the
``baddbmm`` rewrite of ``tests/rewrites.py``) is not a product with a weight to the dataflow:
``new_zeros`` reads ``x``, so its zeros count as data, and the product has two data operands.

    PYTHONPATH=src python tests/rewrite_repros/baddbmm_new_zeros.py

prints ``weight_input`` of the recorded ``baddbmm``: None without a bias, x's node (0) with one."""

import torch

from gptblock.check.roles.dataflow import weight_input
from gptblock.check.roles.trace import record


class Linear(torch.nn.Module):
    def __init__(self, C, bias):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(C, C, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.zeros(C, dtype=torch.float64)) if bias else None

    def forward(self, x):
        B, T, C = x.shape
        Wt = self.W.t().expand(B, C, C)
        if self.b is None:
            return torch.baddbmm(x.new_zeros(B, T, C), x, Wt, beta=0.0)
        return torch.baddbmm(self.b.expand(B, T, C), x, Wt)


if __name__ == "__main__":
    for bias in (False, True):
        trace = record(Linear(8, bias), torch.randn(5, 7, 8, dtype=torch.float64))
        (op,) = [op for op in trace.ops if op.name == "baddbmm"]
        data = [trace.nodes[n].data for n in op.inputs]
        print(f"bias={bias}: operands data={data}, weight_input={weight_input(trace, op)}")
