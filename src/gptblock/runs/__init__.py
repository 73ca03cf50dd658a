"""What a run keeps on disk: run directories and their lock, checkpoints, state dicts, metadata."""
