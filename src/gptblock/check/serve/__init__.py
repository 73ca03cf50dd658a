"""Where the block runs: standard library, torch and each other only (``gptblock.early`` copies
it into the runner's process). Order: ``loop``; ``script``; ``subject``; ``calls`` (how the block
is called) and ``cache`` (its KV cache driven); ``runner``."""
