"""A tiny stand-in language model for the trainer's tests: the trainer must not need GPT.

A bigram model (each token's logits depend on that token alone) with dropout and a biased
output layer, so it has matrices and vectors (weight-decay groups) and uses the RNG in training
mode (exact resume). Because its logits ignore the context, its loss over a text is a plain
mean over consecutive pairs: an independent oracle for the whole-split validation loss.
"""

import torch
import torch.nn as nn
from torch.nn import functional as F


class Bigram(nn.Module):
    def __init__(self, vocab_size, n_embd=8, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx, targets=None):
        logits = self.head(self.drop(self.wte(idx)))  # (B, T, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over B * T
        return logits, loss


def pattern_tokens(n, vocab_size=7, seed=0):
    """A learnable but not trivial text: a noisy cycle through the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    step = torch.randint(1, 3, (n,), generator=g)  # advance by 1 or 2
    return torch.cumsum(step, 0) % vocab_size
