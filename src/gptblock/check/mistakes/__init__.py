"""The mistakes the checker can name (``catalogue``), the lessons' steps they change (``steps``,
``modern_steps``, ``variants``), the search for them (``search``) and the report (``report``).

Order inside: ``steps`` uses nothing of gptblock; ``catalogue`` and ``modern_steps`` use
``steps``; ``variants`` uses both; ``report`` uses ``catalogue`` (and ``serve.loop``); ``search``
uses ``report``, ``steps`` and ``variants``.
"""
