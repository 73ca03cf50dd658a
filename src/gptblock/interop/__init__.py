"""Other tools' files: Hugging Face GPT-2 directories and nanoGPT checkpoints."""
