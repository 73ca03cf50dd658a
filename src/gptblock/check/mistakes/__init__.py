"""The mistakes the checker can name, and how it says so.

* ``catalogue`` -- each mistake's title, explanation, fix and lesson line.
* ``steps`` -- the lessons' block computed step by step from its parts, each step replaceable;
  ``modern_steps`` -- the modern block's steps (RMSNorm, rotary, grouped heads, gated MLPs).
* ``variants`` -- the catalogued mistakes as changes to those steps, and their combinations.
* ``search`` -- ``explain``: the smallest set of them that reproduces a block, and its ties.
* ``report`` -- ``CheckReport`` and ``Finding``, what ``check_block`` returns, as text and JSON,
  and its verdict: ``PASS`` (compared), ``FAIL`` or ``UNVERIFIED``.

Order inside: ``catalogue`` and ``steps`` use nothing of gptblock; ``variants`` and
``modern_steps`` use ``steps``; ``report`` uses ``catalogue`` (and ``serve.loop``); ``search``
uses ``report``, ``steps`` and ``variants``.
"""
