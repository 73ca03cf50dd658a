"""Other tools' files: Hugging Face GPT-2 (``hf``) and nanoGPT (``nanogpt``), read and written.

The functions of ``hf`` and ``nanogpt`` are the implementation. ``GPT.from_hf``, ``GPT.to_hf``,
``GPT.save_hf`` and ``GPT.from_nanogpt``, documented since 0.3, are the same functions, attached
to the class here rather than written in ``gptblock.model``: the model imports no I/O, so the
arrow points from interop down to the model (the class declares them for type checkers).
``import gptblock`` imports this package, so they are there whenever the GPT is.
"""

from ..model.gpt import GPT
from . import hf, nanogpt

GPT.from_hf = staticmethod(hf.from_hf)
GPT.to_hf = hf.to_hf_model
GPT.save_hf = hf.save_hf
GPT.from_nanogpt = staticmethod(nanogpt.from_nanogpt)
