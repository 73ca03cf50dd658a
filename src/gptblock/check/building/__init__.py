"""The learner's block, loaded and built as their file implies.

* ``target`` -- ``load_target`` and ``parse_argument``: the block named by ``FILE.py:NAME`` or
  ``package.module:NAME`` and its ``NAME=VALUE`` arguments. The only module that imports the
  user's code.
* ``build`` -- the block to check from a module or a class / factory and its arguments (with
  ``COMMON_ARGUMENTS`` filled in), and its width C and longest sequence; ``arguments`` -- what a
  class needs beyond them: a config object built from the arguments, or the ``--arg`` line.
* ``sizes`` -- the sizes the file implies (``--arg``, defaults, module settings) and another set,
  and the two reports combined; ``vary`` -- the block's numbers that are sizes, found by value,
  changed to that other set.

Order inside: ``target`` and ``sizes``; ``arguments`` and ``vary`` (``sizes``); ``build``.
"""
