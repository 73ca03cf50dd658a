"""Small GPTs for the gptblock.lens tests, one per block form, with weights worth looking at.

A fresh GPT has zero biases and near-uniform attention (its weights are normal(0, 0.02)), which
would let a wrong bias term or a swapped head pass unnoticed. These models add unit-scale noise
to every parameter: nonzero biases, LayerNorm gains away from 1, sharp attention patterns.
"""

import torch

from gptblock import GPT, GPTConfig

FORMS = ("fused", "mha", "lesson")
V = 13


def lens_gpt(form="fused", *, seed=0, dtype=torch.float64, n_layer=2, n_head=2, **kw):
    config = dict(vocab_size=V, block_size=12, n_layer=n_layer, n_head=n_head, n_embd=16)
    config.update(kw)
    if form == "lesson":
        config["activation"] = "relu"
    torch.manual_seed(seed)
    model = GPT(GPTConfig(block=form, **config)).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def prompt(B=2, T=9, seed=1):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))
