"""Training: the loop, its config and schedule, optimizers, evaluation, presets, ``train_gpt``."""
