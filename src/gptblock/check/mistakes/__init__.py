"""The mistakes the checker can name, each row with its ways and their combinations
(``catalogue``), the reference's steps they change (``steps``), the search for them (``search``)
and the report (``report``, which also uses ``serve.loop``). Order inside: ``steps``,
``catalogue``, ``report``, ``search``: each uses only those before it."""
