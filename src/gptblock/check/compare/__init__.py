"""Comparing the block with the reference, and deciding.

* ``probes`` -- black-box probes that need nothing but a module mapping (B, T, C) to (B, T, C).
* ``conditions`` -- ``confirm``: a match (the lessons' or the modern block's) held to the
  reference on fresh inputs, its input gradient and, by ``hold``, where a learner runs the block
  (float32, train mode, T up to block_size, B up to 64, a dozen calls in a random order);
  ``accounting`` -- every parameter acts and each head's
  weights are its own (``unused_parameters``).
* ``modern`` -- the modern block explained by its changes.
* ``verdict`` -- ``decide``: from the block's answers alone, run the probes, have its parts read,
  compare with the modern reference or the lessons' (``Compared``, one pipeline after), confirm
  the match, combine the evidence into a diagnosis and a verdict.

Order inside: ``probes``; ``conditions`` and ``accounting``; ``modern``;
``verdict``.
"""
