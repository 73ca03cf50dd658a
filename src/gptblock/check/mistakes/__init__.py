"""The mistakes the checker can name (``catalogue``), the reference's steps they change (``steps``,
the lessons' and the modern block's; ``variants``), the search for them (``search``) and the
report (``report``). Order inside: ``steps``, ``catalogue``, ``variants``, ``report`` (which
also uses ``serve.loop``), ``search``: each uses only those before it.
"""
