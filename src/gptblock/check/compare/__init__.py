"""Comparing the block with the reference, and deciding.

* ``probes`` -- black-box probes that need nothing but a module mapping (B, T, C) to (B, T, C).
* ``conditions`` -- ``hold``: a match held to the reference where a learner runs the block
  (float32, train mode, T up to block_size, B up to 64, a dozen calls in a random order);
  ``gradient`` -- the gradients compared; ``accounting`` -- every parameter acts and each head's
  weights are its own (``unused_parameters``).
* ``modern`` -- the modern block explained by its changes.
* ``verdict`` -- ``decide``: from the block's answers alone, run the probes, have its parts read,
  compare with the steps, confirm the match (the lessons' block's or the modern block's, alike)
  on fresh inputs and conditions, combine the evidence into a diagnosis and a verdict.

Order inside: ``probes``, ``gradient``; ``conditions`` and ``accounting``; ``modern``;
``verdict``.
"""
