"""Learner-style blocks that are right only under some of the conditions a learner runs them in.

Each is the first lesson's block (``Head`` / ``MultiHeadAttention`` / ``FeedForward`` /
``Block``) with one thing wrong that the checker's own conditions (float64, eval mode, short
sequences, small batches, the weights it reads) used not to show, written the way people write
it; ``tests/test_check_conditions.py`` checks each, in process and through ``gptblock check``.
The constructor takes ``n_embd, n_head, block_size, dropout`` like the lesson's.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F


class Head(nn.Module):
    def __init__(self, n_embd, head_size, block_size, dropout):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def mask(self, T):
        return self.tril[:T, :T] == 0

    def forward(self, x, k=None):
        B, T, C = x.shape
        k = self.key(x) if k is None else k
        q, v = self.query(x), self.value(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T)
        wei = wei.masked_fill(self.mask(T), float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ v  # (B, T, hs)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_head, n_embd, block_size, dropout, head=Head):
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


class Block(nn.Module):
    """The lesson's block, right everywhere."""

    attention = MultiHeadAttention

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__()
        self.sa = self.attention(n_head, n_embd, block_size, dropout)
        self.ffwd = FeedForward(n_embd, dropout)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        x = x + self.ffwd(self.ln2(x))
        return x


# ----- right only in float64 ---------------------------------------------------------------------


class NaiveLayerNorm(nn.Module):
    """var = E[x^2] - E[x]^2: one pass over the data, and in float32 the two terms cancel."""

    def __init__(self, n_embd, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n_embd))
        self.bias = nn.Parameter(torch.zeros(n_embd))
        self.eps = eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class NaiveVarianceBlock(Block):
    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.ln1, self.ln2 = NaiveLayerNorm(n_embd), NaiveLayerNorm(n_embd)


class HalfHead(Head):
    """A path of its own for float32 (the training dtype), left with the lecture's C ** -0.5
    scale when the other path was fixed."""

    own, longer = torch.float32, 0  # the path's dtype, and the lengths over which it is taken

    def forward(self, x, k=None):
        if x.dtype != self.own or x.shape[1] <= self.longer:
            return super().forward(x, k)
        B, T, C = x.shape
        k, q, v = self.key(x), self.query(x), self.value(x)
        wei = q @ k.transpose(-2, -1) * C**-0.5
        wei = F.softmax(wei.masked_fill(self.mask(T), float("-inf")), dim=-1)
        return self.dropout(wei) @ v


class DoubleHead(HalfHead):
    """The mirror, for sequences over 8 (shorter ones, as the traced input's 7, are right): what
    an explicitly float32 mask does in PyTorch's float64 attention from T = 16 on (2.14)."""

    own, longer = torch.float64, 8


class DtypeBranchBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=HalfHead))


class Float64BranchBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=DoubleHead))


class Float32AttentionBlock(Block):
    """The attention's output cast to float32, a mixed-precision workaround (s97 unseen set): in
    float64 the stream stays float64 (float64 + float32), in bfloat16 it turns float32 and then
    ``ln2``'s bfloat16 weights fail; ``last``: the MLP's output, so a bfloat16 input gives float32."""

    last = False

    def forward(self, x):
        a = self.sa(self.ln1(x))
        x = x + (a if self.last else a.float())
        m = self.ffwd(self.ln2(x))
        return x + (m.float() if self.last else m)


class Float32MlpBlock(Float32AttentionBlock):
    last = True


class OneTokenFloatHead(Head):
    """The softmax on ``wei.float()``, never cast back, on the one-token path only (a learner's
    fast path for generation, s99 unseen set): float64 fails there alone, at T = 1."""

    def forward(self, x, k=None):
        if x.shape[1] > 1:
            return super().forward(x, k)
        q, k, v = self.query(x), self.key(x), self.value(x)
        wei = F.softmax((q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5).float(), dim=-1)
        return wei @ v


class OneTokenFloatBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=OneTokenFloatHead))


class DefaultMaskHead(Head):
    """The fused kernel with an additive mask in the default dtype, as ``torch.full`` and
    ``nn.Transformer.generate_square_subsequent_mask`` make it: float32 in a float64 run, which
    PyTorch's CPU attention can compute wrongly from T = 16 on (s16 and s18 unseen sets)."""

    def forward(self, x, k=None):
        T = x.shape[1]
        q, k, v = self.query(x), self.key(x), self.value(x)
        mask = torch.triu(torch.full((T, T), float("-inf")), 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0)


class DefaultMaskBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=DefaultMaskHead))


# ----- right only for small batches --------------------------------------------------------------


class ChunkedAttention(MultiHeadAttention):
    """Big batches go through in chunks of 16 "to save memory"; the chunk path forgets the
    output projection's bias."""

    def forward(self, x):
        if x.shape[0] <= 16:
            return super().forward(x)
        outs = []
        for chunk in x.split(16):
            heads = torch.cat([h(chunk) for h in self.heads], dim=-1)
            outs.append(heads @ self.proj.weight.T)
        return self.dropout(torch.cat(outs))


class BatchLimitedBlock(Block):
    attention = ChunkedAttention


class TrainUnscaledHead(Head):
    """Unscaled in train mode only (s102: a fused path in training, ``scale=1.0``)."""

    def forward(self, x, k=None):
        if not self.training:
            return super().forward(x, k)
        T = x.shape[1]
        wei = self.query(x) @ self.key(x).transpose(-2, -1)
        return F.softmax(wei.masked_fill(self.mask(T), float("-inf")), dim=-1) @ self.value(x)


class TrainUnscaledBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=TrainUnscaledHead))


class OneSequenceHead(Head):
    """One sequence alone (generation's batch of 1) attends to every position (s102: reported
    "equal for T <= 17", the longest length held at other batch sizes)."""

    def forward(self, x, k=None):
        self.alone = x.shape[0] == 1
        return super().forward(x, k)

    def mask(self, T):
        return super().mask(T) & (not self.alone)


class OneSequenceBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=OneSequenceHead))


# ----- right only for short sequences ------------------------------------------------------------


class WindowHead(Head):
    """A sliding window of 8 positions: for T <= 8 the same as the causal mask."""

    def mask(self, T):
        window = torch.tril(self.tril[:T, :T], diagonal=-8)
        return (self.tril[:T, :T] - window) == 0


class ShortOnlyBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=WindowHead))


class FullMaskHead(Head):
    """The mask never cut to T: the block runs only on sequences of block_size (s17 unseen set,
    a (1, 1, bs, bs) mask sliced [:T, :T] on its size-1 axes)."""

    def mask(self, T):
        return self.tril == 0


class FullLengthOnlyBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=FullMaskHead))


class SixMaskHead(Head):
    """The mask cut to 6 positions, the checker's probes' T, not to T (s67 unseen set: a rotary
    table sized by n_head, 6, instead of T)."""

    def mask(self, T):
        return self.tril[:6, :6] == 0


class SixOnlyBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=SixMaskHead))


# ----- right only in eval mode -------------------------------------------------------------------


class FlashHead(Head):
    """The fused kernel while training, the lesson's code otherwise; the fused call forgot the
    causal mask."""

    def forward(self, x, k=None):
        if not self.training:
            return super().forward(x, k)
        k, q, v = self.key(x), self.query(x), self.value(x)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout.p)


class EvalOnlyBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=FlashHead))


class HalfFlashHead(Head):
    """The fused kernel in half precision (after ``model.to(torch.bfloat16)``), the lesson's code
    otherwise; the fused call forgot the causal mask (the s77 unseen set's reproduction)."""

    def forward(self, x, k=None):
        if x.dtype not in (torch.float16, torch.bfloat16):
            return super().forward(x, k)
        k, q, v = self.key(x), self.query(x), self.value(x)
        return F.scaled_dot_product_attention(q, k, v)


class HalfOnlyBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=HalfFlashHead))


class RenormalisedHead(Head):
    """Softmax over the whole row, the future zeroed after it and the row renormalised: the
    lessons' weights, bar the normaliser's round-off, an ulp in bfloat16 (s91 unseen set)."""

    def forward(self, x, k=None):
        T = x.shape[1]
        q, k, v = self.query(x), self.key(x), self.value(x)
        w = F.softmax(q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5, -1) * self.tril[:T, :T]
        return w / w.sum(-1, keepdim=True) @ v


class RenormalisedBlock(Block):
    attention = staticmethod(lambda *a: MultiHeadAttention(*a, head=RenormalisedHead))


# ----- parameters that never act -----------------------------------------------------------------


class SharedKeyAttention(MultiHeadAttention):
    """The keys computed once, with head 0's projection, for every head."""

    def forward(self, x):
        k = self.heads[0].key(x)
        return self.dropout(self.proj(torch.cat([h(x, k) for h in self.heads], dim=-1)))


class SharedKeyBlock(Block):
    attention = SharedKeyAttention


class SharedKeyModuleAttention(MultiHeadAttention):
    """One key projection module given to every head: every head's key is the same weight."""

    def __init__(self, n_head, n_embd, block_size, dropout):
        super().__init__(n_head, n_embd, block_size, dropout)
        for h in self.heads:
            h.key = self.heads[0].key


class SharedKeyModuleBlock(Block):
    attention = SharedKeyModuleAttention


class QueryFromValueHead(Head):
    """q made by the value projection (a learner's typo, seen in public code): the query
    projection never acts, and one weight serves as two."""

    def forward(self, x, k=None):
        B, T, C = x.shape
        k, q, v = self.key(x), self.value(x), self.value(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, T, T)
        wei = wei.masked_fill(self.mask(T), float("-inf"))
        return self.dropout(F.softmax(wei, dim=-1)) @ v  # (B, T, hs)


class QueryFromValueAttention(MultiHeadAttention):
    def __init__(self, n_head, n_embd, block_size, dropout):
        super().__init__(n_head, n_embd, block_size, dropout, head=QueryFromValueHead)


class QueryFromValueBlock(Block):
    attention = QueryFromValueAttention


class UnusedLinearBlock(Block):
    """A gate declared for a gated MLP, never called."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.gate = nn.Linear(n_embd, 4 * n_embd)


class FrozenDeadBlock(Block):
    """A fixed (requires_grad=False) output mixing matrix, meant to be applied and forgotten."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.mix = nn.Parameter(
            torch.eye(n_embd) + 0.01 * torch.randn(n_embd, n_embd), requires_grad=False
        )


class AfterManyCalls(Block):
    """Right for its first 20 calls, then the MLP reads the stream without its norm (the s20
    trap set's counters: the checker read it UNVERIFIED or PASS)."""

    calls = 0

    def forward(self, x):
        self.calls += 1
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x) if self.calls <= 20 else x)


class AttentionOnlyUnused(Block):
    """Attention alone, no norm (no reference to compare with), and a parameter never used (the
    s19 unseen set's ARENA block): the gradients check names the mistake."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.mask = nn.Parameter(torch.ones(block_size, block_size))
        del self.ln1, self.ln2, self.ffwd

    def forward(self, x):
        return x + self.sa(x)


class PostNormUnused(Block):
    """Post-norm, and a LayerNorm never used (the s21 unseen set's DeepMind port): both named."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.extra = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = self.ln1(x + self.sa(x))
        return self.ln2(x + self.ffwd(x))


class HaltingBlock(Block):
    """Right, returning (x, a halting probability) as adaptive-depth blocks do: the head's
    weights act only on that second item (the s21 unseen set's was a false FAIL)."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.halt = nn.Sequential(
            nn.Linear(n_embd, n_embd // 4), nn.GELU(), nn.Linear(n_embd // 4, 1)
        )

    def forward(self, x):
        x = super().forward(x)
        return x, torch.sigmoid(self.halt(x))


# ----- a backward pass that fails only in float32 ------------------------------------------------


class UpcastLayerNorm(nn.LayerNorm):
    """Normalise in float32 whatever the input's dtype, as mixed-precision code does."""

    def forward(self, x):
        normed = F.layer_norm(x.float(), self.normalized_shape, eps=self.eps).type_as(x)
        return normed * self.weight + self.bias


class InplaceResidualBlock(Block):
    """``x += ...``: in float32 ``x.float()`` is x itself, which ln2 saved for its backward."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.ln1, self.ln2 = UpcastLayerNorm(n_embd), UpcastLayerNorm(n_embd)

    def forward(self, x):
        h = x + self.sa(self.ln1(x))
        h += self.ffwd(self.ln2(h))
        return h


class Float32GradientBlock(Block):
    """Right forward everywhere; in float32 its gradient is scaled (a hook a learner left in)."""

    def forward(self, x):
        if x.dtype == torch.float32 and x.requires_grad:
            x.register_hook(lambda g: g * 1.05)
        return super().forward(x)


# ----- a modern block (Hugging Face's Llama layer) with the same kinds of faults -----------------

from zoo_modern.blocks.hf_llama import LlamaDecoderLayer, LlamaMLP  # noqa: E402  (tests/ on sys.path)


class LlamaWithUnusedBias(LlamaDecoderLayer):
    """A learned output bias, registered and never added."""

    def __init__(self, hidden_size=32, num_attention_heads=4, num_key_value_heads=2):
        super().__init__(hidden_size, num_attention_heads, num_key_value_heads)
        self.out_bias = nn.Parameter(torch.zeros(hidden_size))


class LlamaKeyIsValue(LlamaDecoderLayer):
    """One module serves as the key and the value projection."""

    def __init__(self, hidden_size=32, num_attention_heads=4, num_key_value_heads=2):
        super().__init__(hidden_size, num_attention_heads, num_key_value_heads)
        self.self_attn.k_proj = self.self_attn.v_proj


class UngatedWhileTraining(LlamaMLP):
    """Training skips the gate ("it is only there for inference")."""

    def forward(self, x):
        if self.training:
            return self.down_proj(self.up_proj(x))
        return super().forward(x)


class LlamaTrainPath(LlamaDecoderLayer):
    def __init__(self, hidden_size=32, num_attention_heads=4, num_key_value_heads=2):
        super().__init__(hidden_size, num_attention_heads, num_key_value_heads)
        self.mlp = UngatedWhileTraining(hidden_size, 64)


class DropPathBlock(Block):
    """Correct: stochastic depth (timm's ``drop_path``, p = 0.1) on each branch, the identity in
    eval mode. In train mode two calls on one sequence often drop alike (s100): random all the
    same, not a block that is wrong in train mode."""

    def forward(self, x):
        x = x + self.drop_path(self.sa(self.ln1(x)))
        return x + self.drop_path(self.ffwd(self.ln2(x)))

    def drop_path(self, x, p=0.1):
        if not self.training:
            return x
        keep = (1 - p + torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype)).floor()
        return x / (1 - p) * keep


class ScriptableAttention(nn.Module):
    def __init__(self, n_head: int, n_embd: int, block_size: int, dropout: float):
        super().__init__()
        self.nh = n_head
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.nh, -1).transpose(1, 2) for t in self.qkv(x).split(C, 2))
        wei = (q @ k.transpose(-2, -1)) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf")).softmax(-1)
        return self.proj((wei @ v).transpose(1, 2).reshape(B, T, C))


class ScriptedAttentionBlock(Block):
    """Correct: the attention under ``torch.jit.script``, which takes no hooks (s100: a crash)."""

    def __init__(self, n_embd, n_head, block_size, dropout=0.2):
        super().__init__(n_embd, n_head, block_size, dropout)
        self.sa = torch.jit.script(ScriptableAttention(n_head, n_embd, block_size, dropout))
