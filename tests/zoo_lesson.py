"""The zoo's first family: the first lesson's block with each step a method, and its mistakes.

Names as in the lesson (``ln1``, ``sa.heads.{i}.query``, ``sa.proj``, ``ffwd.net``, ``ln2``). A
mistake is a subclass overriding the one line it gets wrong; combinations subclass several.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F

# ----- the lesson's block, one step per method ---------------------------------------------------


class Head(nn.Module):
    def __init__(self, n_embd, head_size, block_size, dropout):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def scores(self, q, k, C):
        return q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5

    def mask(self, wei, T):
        return wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))

    def normalise(self, wei):
        return F.softmax(wei, dim=-1)

    def forward(self, x):
        B, T, C = x.shape
        k, q, v = self.key(x), self.query(x), self.value(x)
        wei = self.normalise(self.mask(self.scores(q, k, C), T))
        return self.dropout(wei) @ v


class MultiHeadAttention(nn.Module):
    def __init__(self, head, n_head, n_embd, block_size, dropout):
        super().__init__()
        hs = n_embd // n_head
        self.heads = nn.ModuleList([head(n_embd, hs, block_size, dropout) for _ in range(n_head)])
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(torch.cat([h(x) for h in self.heads], dim=-1)))


class FeedForward(nn.Module):
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.ReLU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(self, x):
        return self.net(x)


class LessonBlock(nn.Module):
    """Correct: the lesson's block, verbatim in substance."""

    head = Head

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__()
        self.sa = MultiHeadAttention(self.head, n_head, n_embd, block_size, dropout)
        self.ffwd = FeedForward(n_embd, dropout)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


class NoScalingHead(Head):
    def scores(self, q, k, C):
        return q @ k.transpose(-2, -1)


class ScaleByCHead(Head):
    def scores(self, q, k, C):
        return q @ k.transpose(-2, -1) * C**-0.5  # the lecture bug: C is n_embd, not head_size


class DivideByHsHead(Head):
    def scores(self, q, k, C):
        return q @ k.transpose(-2, -1) / k.shape[-1]


class NoMaskHead(Head):
    def mask(self, wei, T):
        return wei


class ReversedMaskHead(Head):
    def mask(self, wei, T):
        return wei.masked_fill(self.tril[:T, :T] == 1, float("-inf"))


class SoftmaxDimHead(Head):
    def normalise(self, wei):
        return F.softmax(wei, dim=1)  # (B, T, T): dim=1 is the query axis


class NaiveSoftmaxHead(Head):
    def normalise(self, wei):
        e = wei.exp()  # no max subtraction: overflows for large scores
        return e / e.sum(dim=-1, keepdim=True)


class DropoutAlwaysHead(Head):
    def forward(self, x):
        B, T, C = x.shape
        k, q, v = self.key(x), self.query(x), self.value(x)
        wei = self.normalise(self.mask(self.scores(q, k, C), T))
        return F.dropout(wei, p=self.dropout.p) @ v  # F.dropout's training defaults to True


class LessonNoScaling(LessonBlock):
    head = NoScalingHead


class LessonScaleByC(LessonBlock):
    head = ScaleByCHead


class LessonDivideByHs(LessonBlock):
    head = DivideByHsHead


class LessonNoMask(LessonBlock):
    head = NoMaskHead


class LessonReversedMask(LessonBlock):
    head = ReversedMaskHead


class LessonSoftmaxDim(LessonBlock):
    head = SoftmaxDimHead


class LessonDropoutInEval(LessonBlock):
    head = DropoutAlwaysHead


class LessonPostNorm(LessonBlock):
    def forward(self, x):
        x = self.ln1(x + self.sa(x))
        x = self.ln2(x + self.ffwd(x))
        return x


class LessonAttnOverwrites(LessonBlock):
    def forward(self, x):
        x = self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


class LessonMlpOverwrites(LessonBlock):
    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return self.ffwd(self.ln2(x))


class LessonNormalisedStream(LessonBlock):
    def forward(self, x):
        x = self.ln1(x)
        x = x + self.sa(x)
        x = self.ln2(x)
        return x + self.ffwd(x)


class LessonPostNormNoScaling(LessonPostNorm):
    head = NoScalingHead


class LessonPostNormSoftmaxDim(LessonPostNorm):
    head = SoftmaxDimHead


class LessonNoResidualScaleByC(LessonAttnOverwrites):
    head = ScaleByCHead


class LessonReversedMaskNoScaling(LessonBlock):
    class head(ReversedMaskHead, NoScalingHead):
        pass


class LessonPostNormNoMaskScaleByC(LessonPostNorm):
    class head(NoMaskHead, ScaleByCHead):
        pass


class LessonPostNormNaiveSoftmax(LessonPostNorm):
    head = NaiveSoftmaxHead


class LessonLastPositionOnly(LessonBlock):
    def forward(self, x):
        return super().forward(x)[:, -1]  # (B, C): drops the time axis


class LessonCatAlongTime(LessonBlock):
    def forward(self, x):
        heads = torch.cat([h(self.ln1(x)) for h in self.sa.heads], dim=1)  # (B, nh*T, hs)
        return x + self.sa.proj(heads)


class LayerNormNoEps(nn.Module):
    """A hand-written LayerNorm without eps: divides by zero on a constant vector."""

    def __init__(self, n_embd):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.bias = nn.Parameter(torch.zeros(n_embd))

    def forward(self, x):
        mu = x.mean(-1, keepdim=True)
        sigma = x.std(-1, keepdim=True, unbiased=False)
        return (x - mu) / sigma * self.weight + self.bias


class LessonNormWithoutEps(LessonBlock):
    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.ln1 = LayerNormNoEps(n_embd)
        self.ln2 = LayerNormNoEps(n_embd)
