"""The learner's block, loaded (``target``, the only module that imports the user's code) and
built at the sizes its file implies (``build``, ``arguments``, ``sizes``). Order inside:
``target`` and ``sizes``; ``arguments`` (``sizes``); ``build``."""
