"""Text in, tokens out: the built-in corpora, the character and BPE tokenizers, the batches."""
