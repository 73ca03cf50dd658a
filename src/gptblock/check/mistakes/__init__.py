"""The mistakes the checker can name (``catalogue``), the reference's steps they change (``steps``,
the lessons' and the modern block's; ``variants``), the search for them (``search``) and the
report (``report``).

Order inside: ``steps`` uses nothing of gptblock; ``catalogue`` uses ``steps``; ``variants``
uses both; ``report`` uses ``catalogue`` (and ``serve.loop``); ``search`` uses ``report``,
``steps`` and ``variants``.
"""
