"""Run the trainer on the stand-in bigram model as a real process (torchrun, kill tests).

Usage: python tests/standin_run.py OUT_DIR MAX_ITERS EVAL_INTERVAL BATCH_SIZE [--resume]
"""

import sys

from gptblock.data import split_tokens
from gptblock.distributed import finish_distributed, init_distributed
from gptblock.recipe import TrainConfig
from gptblock.train import Trainer
from standin import Bigram, pattern_tokens


def main(out_dir, max_iters, eval_interval, batch_size, resume=False):
    import torch

    init_distributed("cpu")
    torch.manual_seed(0)
    model = Bigram(7, n_embd=8)
    cfg = TrainConfig(
        block_size=8,
        batch_size=batch_size,
        max_iters=max_iters,
        lr=0.05,
        warmup=2,
        eval_interval=eval_interval,
        eval_iters=2,
        seed=0,
    )
    data = split_tokens(pattern_tokens(700, 7), block_size=8)
    Trainer(model, data, cfg, out_dir=out_dir, progress=False).fit(resume=resume)
    finish_distributed()


if __name__ == "__main__":
    out, iters, interval, batch = sys.argv[1], *map(int, sys.argv[2:5])
    main(out, iters, interval, batch, resume="--resume" in sys.argv)
