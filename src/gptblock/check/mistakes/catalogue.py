"""The mistakes ``gptblock check`` can name, each row its one home: its id, its text, what it
explains and its ways as changes to the steps (``Deviation``), with their combinations
(``variants``). Lesson 1 is "Reimplement the transformer block", lesson 2 "A Transformer Block
as nn.Module". docs/checker.md, "The catalogue"."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, replace
from functools import reduce

import torch
import torch.nn.functional as F

from .steps import CORRECT, Deviation, Steps, way

__all__ = ["DEVIATIONS", "LESSONS", "MISTAKES", "MODERN", "Mistake", "compose", "searched"]


@dataclass(frozen=True)
class Mistake:
    """One entry of the catalogue."""

    id: str  # stable, reported in ``CheckReport.diagnosis``, e.g. "post_norm"
    title: str  # one line: what is wrong
    explanation: str  # why it is wrong and what it does to the block
    fix: str  # what to change
    lesson: str  # the lesson's line it deviates from, quoted for a learner to compare with
    explains: tuple[str, ...] = ()  # probe failures it causes, then not diagnosed apart
    ways: tuple[Deviation, ...] = ()  # none: a probe proves it, or the modern comparison finds it
    forms: tuple[str, ...] = ()  # the norm forms (``steps.NORM_FORMS``' keys) that make it
    # black-box probes that every way of it fails, whatever else is wrong: a block that passes
    # all of them is not searched for it (``searched``)
    ruled_out_by: tuple[str, ...] = ()


# a leak of the future moves an earlier position (causality) where attention runs along time; along
# the batch (batch_mixing, which batch independence rules out) it moves the other sequences instead
_LEAKS = ("causality", "batch independence")

# fmt: off
_ENTRIES = (
    Mistake("shape", "the block does not map a (B, T, C) input to a (B, T, C) output",
        "A block is stacked on top of itself, so its output must have exactly its input's shape: "
        "one C-vector per position of every sequence. A block that fails here cannot be stacked.",
        "Return the residual stream x itself, shape (B, T, C); concatenate heads along the "
        "channel axis (dim=-1) and project back to C channels.",
        "lesson 2: With d_model = 16 and 2 heads, a (2, 5, 16) input gives a (2, 5, 16) output."),
    Mistake("future_leak", "a position attends to later positions (no causal mask, or a wrong one)",
        "A language model predicts token t+1 from tokens <= t. If position t can read later "
        "tokens, training loss drops by copying the answer and generation breaks.",
        "Mask the scores above the diagonal with -inf before the softmax (or pass "
        "attn_mask=causal_mask(T) / is_causal=True).",
        'lesson 1: wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))', ruled_out_by=_LEAKS,
        ways=(way("no causal mask: every position attends to every position, later ones included",
                  blocked=lambda T, device: torch.zeros(T, T, dtype=torch.bool, device=device)),)),
    Mistake("mask_reversed",
        "the attention mask blocks the allowed positions and allows the blocked ones",
        "nn.MultiheadAttention reads a bool mask as True = may NOT attend. A mask with True on "
        "the allowed positions (torch.tril) makes every position attend to the future and not "
        "to itself; the last position has nothing left to attend to and becomes NaN. "
        "(F.scaled_dot_product_attention reads a bool mask the other way round: True = allowed; "
        "wei.masked_fill(mask, -inf) hides where the mask is True.)",
        "Use torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1) with "
        "nn.MultiheadAttention (gptblock.causal_mask(T)), or its negation with "
        "F.scaled_dot_product_attention; with masked_fill, hide where tril == 0, not == 1.",
        'lesson 2: torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1). True means "may not attend".',
        explains=("future_leak", "nonfinite"), ruled_out_by=_LEAKS,
        ways=(way("the mask blocks the positions <= t (True on the allowed positions, read as True = "
                  "blocked): each position attends only to later ones",
                  blocked=lambda T, device: ~CORRECT.blocked(T, device)),  # torch.tril
              way("the mask is transposed (the upper triangle where the lower belongs): each "
                  "position attends to itself and the later ones, never the earlier",
                  blocked=lambda T, device: CORRECT.blocked(T, device).T))),
    Mistake("mask_zero",
        "the future positions are masked with 0 instead of -inf before the softmax",
        "The softmax turns a score of 0 into weight exp(0) = 1 relative to the others, so a "
        "future position filled with 0 still gets a large share of the attention: the block "
        "sees the future. Only -inf (or a very negative number) becomes weight 0.",
        'Fill with float("-inf"): wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")).',
        'lesson 1: wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))',
        explains=("future_leak",), ruled_out_by=_LEAKS,
        ways=(way("the future scores are set to 0 instead of -inf before the softmax, so each position "
                  "still gives later positions weight exp(0)",
                  masking=lambda s, blocked, dim: F.softmax(s.masked_fill(blocked, 0.0), dim=dim)),)),
    Mistake("mask_after_softmax",
        "the causal mask is applied after the softmax instead of before it",
        "Each row of weights was normalised over every position, later ones included, and the "
        "mask then zeroes the future: the rows no longer sum to 1 and each position's weights "
        "still depend on the scores of later positions (through the normaliser).",
        'Mask the scores first, then normalise: wei = wei.masked_fill(mask, float("-inf")); '
        "wei = F.softmax(wei, dim=-1).",
        "lesson 1: the masked_fill line comes before wei = F.softmax(wei, dim=-1)",
        explains=("future_leak",), ruled_out_by=_LEAKS,
        ways=(way("the causal mask zeroes the weights after the softmax: each row was normalised over "
                  "the future too and no longer sums to 1",
                  masking=lambda s, blocked, dim: F.softmax(s, dim=dim).masked_fill(blocked, 0.0)),)),
    Mistake("batch_mixing",
        "batch and time are mixed up: sequences of one batch attend to each other",
        "nn.MultiheadAttention (and nn.TransformerEncoderLayer) default to batch_first=False, "
        "reading a (B, T, C) tensor as (T, B, C). Attention then runs across the batch instead "
        "of along each sequence, so one example's output depends on the others'.",
        "Pass batch_first=True to nn.MultiheadAttention / nn.TransformerEncoderLayer (or "
        "transpose to (T, B, C) and back).",
        "lesson 2: nn.MultiheadAttention(d_model, n_heads, batch_first=True)",
        explains=("shape",), ruled_out_by=("batch independence",),
        ways=(way("attention runs along the batch axis: the (B, T, C) input is read as (T, B, C)",
                  time_axis=0),)),
    Mistake("no_scaling", "attention scores are not scaled by 1/sqrt(head_size)",
        "q . k over hs channels has variance ~hs, so unscaled scores saturate the softmax: "
        "attention becomes nearly one-hot at initialisation and its gradients vanish.",
        "Multiply the scores by k.shape[-1] ** -0.5 (the head size), before the mask and softmax.",
        "lesson 1: wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5",
        ways=(way("scores are not scaled (expected a factor hs ** -0.5 = {right:.4g}, hs={hs})",
                  scale=lambda C, hs: 1.0),)),
    Mistake("wrong_scale", "attention scores are scaled by the wrong factor",
        "The scale that keeps the score variance at 1 is 1/sqrt(head_size). A well-known "
        "lecture version scaled by C ** -0.5 (n_embd, the full width) instead, which with nh "
        "heads is sqrt(nh) times too small and flattens attention; 1/head_size or "
        "sqrt(head_size) are the other usual slips.",
        "Scale by k.shape[-1] ** -0.5 (hs = C // n_head), not by C ** -0.5.",
        "lesson 1: wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5",
        ways=tuple(  # a power of C or hs other than hs ** -0.5
            way(f"scores scaled by {b} ** {e} = {{value:.4g}} ({b}={{{b}}}) instead of hs ** -0.5 = "
                "{right:.4g} (hs={hs})", scale=lambda C, hs, b=b, e=e: (C if b == "C" else hs) ** e)
            for b, e in (("C", -0.5), ("hs", -1), ("hs", 0.5), ("C", 0.5))
        )),
    Mistake("softmax_dim", "the softmax runs over the wrong axis",
        "Each query's row of scores must become a distribution over keys (the last axis). "
        "A softmax over the query axis makes each key's column sum to 1 instead, and lets a "
        "position's weights depend on later queries.",
        "Use F.softmax(wei, dim=-1).",
        "lesson 1: wei = F.softmax(wei, dim=-1)",
        explains=("future_leak",), ruled_out_by=_LEAKS,
        ways=(way("softmax over the query axis (dim=-2) instead of over the keys (dim=-1)",
                  softmax_dim=-2),)),
    Mistake("heads_mixed",
        "heads and positions are mixed up when q, k, v are split into heads or merged back",
        "(B, T, C) must become (B, nh, T, hs) by view(B, T, nh, hs).transpose(1, 2), and back by "
        "transpose(1, 2).reshape(B, T, C). A view straight to (B, nh, T, hs) (or from it to "
        "(B, T, C)) without the transpose is legal but regroups the numbers: each 'head' gets "
        "pieces of several positions, which also lets positions see the future. Concatenating "
        "the heads in another order scrambles what the output projection reads.",
        "q = q.view(B, T, nh, hs).transpose(1, 2) and y = y.transpose(1, 2).reshape(B, T, C) "
        "(or torch.cat([h(x) for h in self.heads], dim=-1), as the lesson does).",
        "lesson 1: out = torch.cat([h(x) for h in self.heads], dim=-1)",
        explains=("future_leak", "batch_mixing"),
        ways=(
            *(way(f"{who} reshaped to (B, nh, T, hs) with view(B, nh, T, hs) instead of "
                  "view(B, T, nh, hs).transpose(1, 2): each 'head' holds pieces of several positions",
                  split=lambda t, nh, name, one=one: t.reshape(t.shape[0], nh, t.shape[1], -1)
                  if name in one else CORRECT.split(t, nh, name))  # torchtune's q alone
              for one, who in (("qkv", "q, k and v are"), *((t, f"{t} alone is") for t in "qkv"))),
            way("q, k, v split by view(B, T, hs, nh): head h takes channels h, h + nh, ..., not h * hs "
                "...", split=lambda t, nh, name: t.reshape(*t.shape[:2], -1, nh).permute(0, 3, 1, 2)),
            way("the heads' outputs (B, nh, T, hs) are reshaped to (B, T, C) without transpose(1, 2): "
                "each position's output holds pieces of other positions",
                merge=lambda y: y.reshape(y.shape[0], y.shape[2], -1)),
            way("the heads' outputs, batched head-major as (nh * B, T, hs), are reshaped to (B, T, C) "
                "without splitting the heads off the batch first: each output mixes other sequences' "
                "and heads' values",  # (nh, B, T, hs) in memory, read as (B, T, D)
                merge=lambda y: y.transpose(0, 1).reshape(y.shape[0], y.shape[2], -1)),
            way("the heads' outputs are concatenated in the wrong order: channel d of head h lands at "
                "d * nh + h instead of h * hs + d (a permute(0, 2, 3, 1) instead of transpose(1, 2))",
                merge=lambda y: y.permute(0, 2, 3, 1).reshape(y.shape[0], y.shape[2], -1)),
        )),
    Mistake("post_norm", "post-norm: the LayerNorm is applied after adding the residual",
        "x = ln(x + sublayer(x)) normalises the residual stream itself, so the input no longer "
        "passes through the block unchanged. Deep stacks of post-norm blocks train unstably "
        "without warm-up, and the GPT blocks of both lessons are pre-norm.",
        "Normalise the sub-layer's input and add its output: x = x + self.sa(self.ln1(x)); "
        "x = x + self.ffwd(self.ln2(x)) (norm_first=True for nn.TransformerEncoderLayer).",
        "lesson 1: x = x + self.sa(self.ln1(x))     # residual branch 1: attention",
        ruled_out_by=("residual stream",),
        ways=(
            way("post-norm: x = ln1(x + sa(x)); x = ln2(x + ffwd(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: ln2((x := ln1(x + sa(x))) + ffwd(x))),
            way("the attention branch is post-norm: x = ln1(x + sa(x)); x = x + ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := ln1(x + sa(x))) + ffwd(ln2(x))),
            way("the MLP branch is post-norm: x = x + sa(ln1(x)); x = ln2(x + ffwd(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: ln2((x := x + sa(ln1(x))) + ffwd(x))),
        )),
    Mistake("no_residual", "a sub-layer overwrites the residual stream instead of adding to it",
        "The block must return its input plus each branch's output. Writing x = branch(x) "
        "(or x = ln(x) before adding) throws the stream away: gradients no longer flow "
        "straight through deep stacks and the additive residual stream is gone.",
        "Add each branch to the stream: x = x + self.sa(self.ln1(x)); x = x + self.ffwd(self.ln2(x)).",
        "lesson 1: x = x + self.ffwd(self.ln2(x))   # residual branch 2: MLP",
        ruled_out_by=("residual stream",),
        ways=(
            way("the attention branch overwrites the stream: x = sa(ln1(x)) instead of x = x + sa(ln1(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := sa(ln1(x))) + ffwd(ln2(x))),
            way("the MLP branch overwrites the stream: x = ffwd(ln2(x)) instead of x = x + ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: ffwd(ln2(x + sa(ln1(x))))),
            way("both branches overwrite the stream: x = ffwd(ln2(sa(ln1(x)))), no residual at all",
                wiring=lambda x, sa, ffwd, ln1, ln2: ffwd(ln2(sa(ln1(x))))),
            way("the stream is replaced by its normalised copy: x = ln1(x); x = x + sa(x); "
                "x = ln2(x); x = x + ffwd(x)",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := ln2((x := ln1(x)) + sa(x))) + ffwd(x)),
            way("the attention branch's stream is replaced by its normalised copy: x = ln1(x); "
                "x = x + sa(x); x = x + ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := (x := ln1(x)) + sa(x)) + ffwd(ln2(x))),
            way("the MLP branch's stream is replaced by its normalised copy: x = x + sa(ln1(x)); "
                "x = ln2(x); x = x + ffwd(x)",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := ln2(x + sa(ln1(x)))) + ffwd(x)),
            way("the attention branch's stream is replaced by its normalised copy and the MLP "
                "branch overwrites it: x = ln1(x); x = x + sa(x); x = ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: ffwd(ln2((x := ln1(x)) + sa(x)))),
            way("the attention branch overwrites the stream and the MLP branch's is its "
                "normalised copy: x = sa(ln1(x)); x = ln2(x); x = x + ffwd(x)",
                wiring=lambda x, sa, ffwd, ln1, ln2: (x := ln2(sa(ln1(x)))) + ffwd(x)),
            way("(a parallel block) the branches are added to the normalised stream: h = ln1(x); "
                "x = h + sa(h) + ffwd(ln2(x)) instead of x + sa(h) + ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: (h := ln1(x)) + sa(h) + ffwd(ln2(x))),
            way("(a parallel block) the stream is dropped: x = sa(ln1(x)) + ffwd(ln2(x)) instead "
                "of x + sa(ln1(x)) + ffwd(ln2(x))",
                wiring=lambda x, sa, ffwd, ln1, ln2: sa(ln1(x)) + ffwd(ln2(x))),
        )),
    Mistake("shared_norm", "one LayerNorm is used for both branches",
        "The attention branch and the MLP branch each normalise with their own learned gain and "
        "bias. Reusing ln1 before the MLP ties the two together (and leaves ln2, if it exists, "
        "unused: it gets no gradient).",
        "Give each branch its own norm: self.ln1 = nn.LayerNorm(n_embd); self.ln2 = "
        "nn.LayerNorm(n_embd); x = x + self.ffwd(self.ln2(x)).",
        "lesson 1: x = x + self.ffwd(self.ln2(x))   # residual branch 2: MLP",
        explains=("unused_parameters",),  # ln2
        ways=(way("the MLP branch reuses the attention branch's LayerNorm: ffwd(ln1(x)) instead of "
                  "ffwd(ln2(x))", norms=lambda ln1, ln2: (ln1, ln1)),)),
    Mistake("dropout_in_eval", "dropout is still active in eval mode",
        "Two calls on the same input in eval mode give different outputs, so evaluation and "
        "generation are noisy. Usual causes: F.dropout(x, p) (its training argument defaults "
        "to True), F.dropout(..., training=True), or "
        "F.scaled_dot_product_attention(..., dropout_p=p) without checking self.training.",
        "Use nn.Dropout modules (off after .eval()), or pass training=self.training / "
        "dropout_p=p if self.training else 0.0.",
        "lesson 1: self.dropout = nn.Dropout(dropout)"),
    Mistake("inplace", "an in-place operation breaks the backward pass",
        "x += self.sa(self.ln1(x)) computes the right forward pass, but ln1 saved x to compute "
        "its gradients and += then overwrites it: the block works under torch.no_grad, yet "
        "training fails at loss.backward() with 'one of the variables needed for gradient "
        "computation has been modified by an inplace operation'.",
        "Write the residual out of place: x = x + self.sa(self.ln1(x)); x = x + "
        "self.ffwd(self.ln2(x)) (likewise masked_fill, not masked_fill_, on saved tensors).",
        "lesson 1: x = x + self.sa(self.ln1(x))     # residual branch 1: attention"),
    Mistake("nonfinite", "the block produces inf or NaN for large or constant inputs",
        "A hand-written softmax without subtracting the row maximum overflows for large "
        "scores; a hand-written LayerNorm without eps divides by zero on a constant vector "
        "(e.g. a zero padding embedding); a mask that blocks a whole row (its diagonal too) "
        "leaves the softmax nothing but -inf, 0 / 0; a softmax over the whole row, the future "
        "masked only afterwards (renormalised, or zeros multiplied into exp), lets a large future "
        "score round every allowed weight to 0, 0 / 0 again. One NaN then spreads to every later "
        "position.",
        "Use F.softmax (it subtracts the maximum) and nn.LayerNorm / F.layer_norm (it adds eps "
        "to the variance), keep each position's own score (torch.tril keeps the diagonal), and "
        "mask with -inf before normalising, so that the maximum and the sum see the allowed "
        "positions only.",
        "lesson 1: wei = F.softmax(wei, dim=-1) and self.ln1 = nn.LayerNorm(n_embd)"),
    Mistake("dtype_device", "the output's dtype or device differs from the input's",
        "A block is stacked on itself and on the embeddings: its output must have its input's "
        "dtype and device. A hard-coded .float(), .double(), .cpu() or .to(device) on the way "
        "out breaks float64 checks, mixed precision or a model moved to another device.",
        "Compute in the input's dtype and device: create new tensors with dtype=x.dtype, "
        "device=x.device (or register them as buffers) and return the residual stream x itself.",
        "lesson 1: x = x + self.sa(self.ln1(x)) (the stream keeps its input's dtype and device)"),
    Mistake("unused_parameters",
        "some of the block's parameters never act on its output, or one weight serves where "
        "the lesson has several",
        "Every weight of the block must shape its output, each in its own place: every head its "
        "own key, query and value projection. A head that reads another head's key "
        "projection, one module given to every head, or a layer declared and never called "
        "still computes a valid block, so the outputs look right; but the unused weights get "
        "no gradient (or, frozen with requires_grad=False, are never applied), and the trained "
        "model has fewer weights than its code says.",
        "Call every layer you create, each in its place: in each Head, k = self.key(x) with "
        "that head's own key; delete layers you do not use.",
        "lesson 1: k, q, v = self.key(x), self.query(x), self.value(x) (in each Head, its own)"),
    Mistake("rmsnorm_eps", "RMSNorm adds eps outside the root: x / (sqrt(mean(x^2)) + eps)",
        "RMSNorm (Zhang & Sennrich 2019) divides by sqrt(mean(x^2) + eps): eps keeps the root "
        "away from zero. Added after the root it no longer bounds the gradient of the root at 0 "
        "and changes the scale of every small vector: for inputs of size 1e-3 the outputs are off "
        "by percents, so a checkpoint trained with the other form computes something else.",
        "x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) (or F.rms_norm / nn.RMSNorm).",
        "modern block: rmsnorm(x) = x / sqrt(mean(x^2) + eps) * weight (docs/modern-block.md)",
        forms=("eps_outside",)),
    Mistake("rmsnorm_mean", "RMSNorm divides by the root of a mean of x, not of x squared",
        "The root mean square is sqrt(mean(x^2)). x.mean(-1) alone is negative for half the "
        "positions (the root is NaN there) and mean(x)^2 is the square of the mean, near 0 for "
        "centred vectors (outputs blow up): neither is the vector's size.",
        "variance = x.pow(2).mean(-1, keepdim=True), then x * torch.rsqrt(variance + eps).",
        "modern block: rmsnorm(x) = x / sqrt(mean(x^2) + eps) * weight (docs/modern-block.md)",
        explains=("nonfinite",), forms=("square_of_mean", "mean")),
    Mistake("rmsnorm_dim", "RMSNorm averages over the wrong axis (time or batch, not the channels)",
        "A norm is per position: each C-vector is divided by its own size. mean(dim=1) on "
        "(B, T, C) averages over the sequence, so every position's output depends on every "
        "other one, later ones included (a future leak), and on the sequence's length.",
        "Average over the last axis: x.pow(2).mean(-1, keepdim=True).",
        "modern block: rmsnorm(x) = x / sqrt(mean(x^2) + eps) * weight, the mean over C",
        explains=("future_leak", "batch_mixing"), forms=("time", "batch")),
    Mistake("rope_v", "rotary positions are applied to v as well as to q and k",
        "RoPE rotates q and k so that their product depends only on the distance between two "
        "positions. Rotating v too mixes the values with the absolute position of each key: the "
        "output of a head then changes when the same text is shifted along the sequence.",
        "Rotate q and k only: q, k = apply_rotary(q, pos), apply_rotary(k, pos).",
        "modern block: q, k = rotate(q, pos), rotate(k, pos); v is not rotated",
        ways=(way("rotary positions are applied to v as well as to q and k", rotated="qkv"),)),
    Mistake("rope_q_only", "rotary positions are applied to q but not to k",
        "q_m . k_n depends on m - n only when both are rotated (R_m q . R_n k = q . R_(n-m) k). "
        "Rotating q alone makes the scores depend on the query's absolute position and not on "
        "where the key is: the model has no relative positions.",
        "Rotate both: q, k = apply_rotary(q, pos), apply_rotary(k, pos).",
        "modern block: q, k = rotate(q, pos), rotate(k, pos)",
        ways=(way("rotary positions are applied to q only, not to k", rotated="q"),)),
    Mistake("rope_pairing",
        "the rotary table is laid out for the other pairing of channels than the rotation",
        "RoPE pairs channels one of two ways: adjacent pairs (2i, 2i+1), as RoFormer and Meta's "
        "Llama (complex numbers of adjacent pairs, cos/sin repeated with repeat_interleave), or "
        "halves (i, i + hs/2), as Hugging Face's Llama (rotate_half, cos/sin = "
        "cat((freqs, freqs))). Both are the same model after a fixed permutation of the q/k "
        "weights, which is why checkpoints are converted between them; mixing them (rotate_half "
        "with an interleaved table, or adjacent pairs with a cat table) turns the two channels "
        "of a pair by different angles, which is no rotation at all.",
        "Use the table of the rotation's pairing: rotate_half with cat((freqs, freqs)); adjacent "
        "pairs with repeat_interleave(freqs, 2) (or complex freqs_cis). Load weights written for "
        "the pairing the code uses.",
        "modern block: rope_pairing='halves' | 'adjacent' (docs/modern-block.md)",
        ways=(way("the rotation pairs channels in {pairs[0]}, but the cos/sin table is laid out "
                  "for {other[0]} ({other[1]} instead of {pairs[1]}): each pair is turned by two "
                  "different angles", rope_table="other"),)),
    Mistake("rope_cache_offset",
        "a cached decoding step is rotated as position 0, not at its offset in the sequence",
        "With a KV cache, the tokens of a step sit at positions start_pos ... start_pos + "
        "seqlen - 1, and their q and k must be rotated by those positions' angles; slicing "
        "the table from the start (freqs_cis[:seqlen], cos[:T]) rotates every step as if it "
        "were the first token. Whole sequences are right (start_pos is 0 there), so training "
        "and the loss do not show it: only generation with the cache goes wrong, each new "
        "token attending to the cached keys at the wrong relative distances.",
        "Slice the table at the step's positions: freqs_cis[start_pos : start_pos + seqlen] "
        "(Meta), freqs_cis[input_pos] (gpt-fast), or the position_ids / cache_position of the "
        "step (Hugging Face).",
        "modern block: q, k rotated at positions start_pos ... start_pos + T - 1"),
    Mistake("gqa_order",
        "grouped key/value heads are repeated in the wrong order (repeat instead of "
        "repeat_interleave)",
        "With nkv key/value heads for nh query heads, query heads j*g ... (j+1)*g - 1 share "
        "key/value head j (g = nh / nkv): k.repeat_interleave(g, dim=1), or repeat_kv's expand + "
        "reshape. k.repeat(1, g, 1, 1) tiles them instead (query head i reads head i % nkv): "
        "the same shapes, but every query head reads another head's keys than its weights were "
        "trained with.",
        "k = k.repeat_interleave(nh // nkv, dim=1) (the same for v), or "
        "F.scaled_dot_product_attention(..., enable_gqa=True).",
        "modern block: att = softmax(q @ repeat(k).T / sqrt(hs)); key/value head j // (nh / nkv)",
        ways=(way("each key/value head j serves query heads j, j + nkv, j + 2 nkv, ... "
                  "(k.repeat(1, g, 1, 1)) instead of heads j*g ... (j+1)*g - 1 "
                  "(k.repeat_interleave(g, dim=1), as the weights' grouping is)", kv_order="tile"),)),
    Mistake("swiglu_swapped",
        "SwiGLU's gate and up projections are swapped: SiLU on the up projection",
        "SwiGLU is w2(silu(w1 x) * w3 x): the SiLU goes on the gate projection (gate_proj, w1), "
        "the up projection (up_proj, w3) is the linear branch. As a function of fresh weights "
        "both orders are the same MLP, so only the names tell: with a checkpoint's weights the "
        "swapped block computes another function.",
        "self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x)); Meta: "
        "self.w2(F.silu(self.w1(x)) * self.w3(x)).",
        "modern block: mlp = w2(silu(w1 x) * w3 x)"),
    Mistake("swiglu_silu",
        "SwiGLU's SiLU is on the wrong branch (on the product, on both, or missing)",
        "The gate is silu(w1 x), multiplied by the linear branch w3 x. silu(w1 x * w3 x), "
        "silu(w1 x) * silu(w3 x) or w1 x * w3 x are other MLPs (the last not even gated by a "
        "nonlinearity of one branch).",
        "w2(silu(w1 x) * w3 x).",
        "modern block: mlp = w2(silu(w1 x) * w3 x)"),
)
# fmt: on

MISTAKES: dict[str, Mistake] = {m.id: m for m in _ENTRIES}  # in the order diagnoses are listed

MODERN_GROUPS = ("targets", "table", "order")  # the modern attention's: a rotation, grouped heads
# Every way of making a catalogued mistake that the steps can reproduce, in catalogue order:
# the modern attention's (tried only on a modern block, ``compare.modern``) and the lessons'.
DEVIATIONS = tuple(replace(d, mistake=m.id) for m in MISTAKES.values() for d in m.ways)
MODERN = tuple(d for d in DEVIATIONS if d.group in MODERN_GROUPS)
LESSONS = tuple(d for d in DEVIATIONS if d.group not in MODERN_GROUPS)  # ``search.explain``'s


def searched(passed: Collection[str]) -> tuple[Deviation, ...]:
    """``LESSONS`` but the ways of the mistakes the probes ``passed`` rule out."""
    return tuple(
        d
        for d in LESSONS
        if not (r := MISTAKES[d.mistake].ruled_out_by) or not set(r) <= set(passed)
    )


def compose(deviations: tuple[Deviation, ...] | list[Deviation]) -> Steps:
    """``CORRECT`` with each deviation's change applied in turn."""
    return reduce(lambda steps, deviation: deviation.apply(steps), deviations, CORRECT)
