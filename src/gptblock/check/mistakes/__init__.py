"""The mistakes the checker can name (``catalogue``), the reference's steps they change
(``steps``, ``variants``), the search for them (``search``) and the report (``report``, which
also uses ``serve.loop``). Order inside: ``steps``, ``catalogue``, ``variants``, ``report``,
``search``: each uses only those before it."""
