"""Other tools' files, read and written: Hugging Face's (``hf``: GPT-2, Llama, Mistral, Qwen2) and
nanoGPT's (``nanogpt``). Functions, not methods of the GPT: the model imports no I/O."""
