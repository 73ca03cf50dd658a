"""Where the block runs. Everything here imports only the standard library, torch and each other
(relatively): ``gptblock.early`` copies the folder, as the package ``serve``, into the runner's
process, which imports nothing of gptblock.

Order inside: ``loop`` and ``frames``; ``subject`` and ``calls`` (``loop``); ``runner``.
"""
