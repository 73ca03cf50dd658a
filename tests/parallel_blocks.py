"""The lesson's block with a parallel residual (GPT-J's, PaLM's: both branches read the block's
input), read as the lessons' block is (one attention core per head); shaped like energy_gpt's
``Block_parallel`` (s17 unseen set), and with mistakes in it."""

import torch
from torch.nn import functional as F

from gptblock import lesson
from nanogpt_style import Block as NanoBlock


class Parallel(lesson.Block):
    def forward(self, x):
        return x + self.sa(self.ln1(x)) + self.ffwd(self.ln2(x))


class NanoParallel(NanoBlock):
    """nanoGPT's block (one attention core for all heads) with the residual in parallel."""

    def forward(self, x):
        return x + self.attn(self.ln_1(x)) + self.mlp(self.ln_2(x))


class OneNorm(lesson.Block):
    """GPT-J's one LayerNorm, read by both branches."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.0):
        super().__init__(n_embd, n_head, block_size, dropout)
        del self.ln2

    def forward(self, x):
        h = self.ln1(x)
        return x + self.sa(h) + self.ffwd(h)


class Unscaled(Parallel):
    """The heads written out, the scores never scaled (no_scaling); ``masked``: with the mask."""

    masked = True

    def attend(self, h):
        T, outs = h.shape[1], []
        for head in self.sa.heads:
            k, q, v = head.key(h), head.query(h), head.value(h)
            wei = q @ k.transpose(-2, -1)  # (B, T, T)
            if self.masked:
                wei = wei.masked_fill(head.tril[:T, :T] == 0, float("-inf"))
            outs.append(F.softmax(wei, dim=-1) @ v)
        return self.sa.proj(torch.cat(outs, dim=-1))

    def forward(self, x):
        return x + self.attend(self.ln1(x)) + self.ffwd(self.ln2(x))


class Unmasked(Unscaled):
    """No mask and no scale: future_leak + no_scaling."""

    masked = False


class NormedStream(OneNorm):
    """The branches added to the normalised stream (s19 unseen set, a NeoX mutant): no_residual."""

    def forward(self, x):
        h = self.ln1(x)
        return h + self.sa(h) + self.ffwd(h)


class NoStream(Parallel):
    """The stream dropped: x = sa(ln1(x)) + ffwd(ln2(x)) (no_residual)."""

    def forward(self, x):
        return self.sa(self.ln1(x)) + self.ffwd(self.ln2(x))
