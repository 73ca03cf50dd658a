"""Factories for every block form, so one test can check a claim on all of them.

Each factory takes (d_model, n_heads, dropout) and returns a module mapping (B, T, C) to
(B, T, C), with ``attention_weights(x) -> (B, nh, T, T)``.
"""

from gptblock import FusedBlock, TransformerBlock, lesson

MAX_T = 32  # block_size for the forms that need one


def make_lesson(d_model, n_heads, dropout=0.0):
    return lesson.Block(d_model, n_heads, MAX_T, dropout=dropout)


def make_mha(d_model, n_heads, dropout=0.0):
    return TransformerBlock(d_model, n_heads, dropout=dropout)


def make_fused(d_model, n_heads, dropout=0.0):
    return FusedBlock(d_model, n_heads, dropout=dropout)


FORMS = {"lesson": make_lesson, "mha": make_mha, "fused": make_fused}
