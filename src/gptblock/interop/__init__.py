"""Other tools' files: Hugging Face's (``hf``: GPT-2, Llama, Mistral, Qwen2) and nanoGPT's
(``nanogpt``), read and written.

``from_hf(source)`` and ``from_nanogpt(path)`` build a GPT from them, ``to_hf(model)`` and
``save_hf(model, directory)`` turn one into theirs. They are functions here, not methods of the
GPT: the model imports no I/O, so the arrow points from interop down to the model.
``gptblock.load`` reads a run, a Hugging Face directory or a nanoGPT checkpoint by one call.
"""

from .hf import from_hf, save_hf, to_hf
from .nanogpt import from_nanogpt

__all__ = ["from_hf", "from_nanogpt", "save_hf", "to_hf"]
