"""Factories for every block form, so one test can check a claim on all of them.

Each factory takes (d_model, n_heads, dropout) and returns a module mapping (B, T, C) to
(B, T, C), with ``attention_weights(x) -> (B, nh, T, T)``.
"""

import torch

from gptblock import FusedBlock, TransformerBlock, lesson

MAX_T = 32  # block_size for the forms that need one


def make_lesson(d_model, n_heads, dropout=0.0):
    return lesson.Block(d_model, n_heads, MAX_T, dropout=dropout)


def make_mha(d_model, n_heads, dropout=0.0):
    return TransformerBlock(d_model, n_heads, dropout=dropout)


def make_fused(d_model, n_heads, dropout=0.0):
    return FusedBlock(d_model, n_heads, dropout=dropout)


FORMS = {"lesson": make_lesson, "mha": make_mha, "fused": make_fused}


def lesson_block_state_as_mha(src):
    """A lesson Block's weights in TransformerBlock's names: per-head q/k/v packed into in_proj."""
    heads = src.sa.heads
    q = torch.cat([h.query.weight for h in heads], dim=0)  # nh x (hs, C) -> (C, C)
    k = torch.cat([h.key.weight for h in heads], dim=0)  # (C, C)
    v = torch.cat([h.value.weight for h in heads], dim=0)  # (C, C)
    w = torch.cat([q, k, v], dim=0).detach().clone()  # (3C, C)
    state = {
        "self_attn.in_proj_weight": w,
        "self_attn.in_proj_bias": torch.zeros(w.shape[0], dtype=w.dtype),  # the lesson has none
    }
    for ours, theirs in [
        ("self_attn.out_proj", src.sa.proj),
        ("norm1", src.ln1),
        ("norm2", src.ln2),
        ("linear1", src.ffwd.net[0]),
        ("linear2", src.ffwd.net[2]),
    ]:
        for k2, v2 in theirs.state_dict().items():
            state[f"{ours}.{k2}"] = v2.clone()
    return state
