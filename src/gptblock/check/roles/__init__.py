"""Finding the roles (q, k, v, proj, fc1, fc2, the norms) and reading their weights as numbers.

``trace`` records and replays one forward pass; ``dataflow`` follows a tensor to where a role
reads it and finds the roles from what the tensors do; ``weights`` finds the norms and reads each
role's weight by basis-vector interventions. ``parts`` and ``mapping`` are the fallback (the module tree
by shapes and order); ``given`` is ``--map``; ``readings`` picks the reading. ``plain`` sends a
reading as numbers and ``receive`` checks and rebuilds it; ``provenance`` holds the numbers to
the values the checker chose. ``modern_*``: the same for modern blocks.
"""
