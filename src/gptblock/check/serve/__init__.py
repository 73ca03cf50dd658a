"""Where the block runs: everything here imports only the standard library, torch and each
other (relatively), so that ``gptblock.early`` can copy the folder, as the package ``serve``,
into the runner's process, which imports nothing of gptblock.

* ``runner`` -- builds the block again from the builder's arguments and answers everything that
  decides the verdict; ``frames`` -- the wire format: JSON and raw tensors, never pickle.
* ``subject`` -- ``Subject``, the checker's eval-mode float64 copy of the block: every call gets a
  fresh input and returns a copy of the output; a call in float32 runs a float32 copy, and a
  ``train`` call runs it in train mode with every dropout off.
* ``loop`` -- the recorder of one forward pass (a ``TorchDispatchMode``), ``NoDropout`` and the
  cache driver, as plain data (falls back on its own ``UserValueError`` outside gptblock).
* ``calls`` -- what the block's ``forward`` needs besides the input; ``raised`` -- what the block
  raised when built or first called, at the learner's line.

Order inside: ``loop`` and ``frames``; ``subject``, ``raised`` and ``calls`` (``loop``); ``runner``.
"""
