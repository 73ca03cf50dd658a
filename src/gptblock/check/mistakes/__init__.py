"""The mistakes the checker can name, and how it says so.

* ``catalogue`` -- each mistake's one home: its title, explanation, fix and lesson line, the
  probe failures it explains, and its ways (the steps it replaces).
* ``steps`` -- the lessons' block computed step by step from its parts, each step replaceable,
  and the mistaken steps beside the correct ones; ``modern_steps`` -- the modern block's steps
  (RMSNorm, rotary, grouped heads, gated MLPs).
* ``variants`` -- the catalogue's ways as deviations of those steps, and their combinations.
* ``search`` -- ``explain``: the smallest set of them that reproduces a block, and its ties.
* ``report`` -- ``CheckReport`` and ``Finding``, what ``check_block`` returns, as text, JSON and HTML,
  and its verdict: ``PASS`` (compared), ``FAIL`` or ``UNVERIFIED``.

Order inside: ``steps`` uses nothing of gptblock; ``catalogue`` and ``modern_steps`` use
``steps``; ``variants`` uses both; ``report`` uses ``catalogue`` (and ``serve.loop``); ``search``
uses ``report``, ``steps`` and ``variants``.
"""
