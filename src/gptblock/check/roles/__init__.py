"""Finding the roles: which tensors and parameters of the block are q, k, v, proj, fc1, fc2 and
the norms, and reading their weights into numbers.

* ``trace`` -- one forward pass recorded operator by operator (``serve.loop``'s, read back
  checked: torch's own operators only), replayed with chosen tensors replaced; ``TraceError``.
* ``walks`` -- following a traced tensor through reshapes, slices and scalar factors to where a
  role reads or writes it; ``dataflow`` -- the roles from what the tensors do, and
  the norms from what they compute.
* ``weights`` -- ``read_block``: each role's weight read by basis-vector interventions, in the
  lessons' layout, and checked against the traced activations.
* ``parts`` -- the module tree's weight-holding parts; ``mapping`` -- their roles by shapes and
  order, or by ``--map``: the fallback when the dataflow does not show the roles.
* ``given`` -- ``--map`` parsed (a slice and layout of a parameter too), and refused where it
  cannot be what it claims; ``readings`` -- which reading is used, and a ``--map`` to offer.
* ``plain`` -- a reading's sub-layers (or a modern block's parts) as numbers; ``provenance`` --
  the parameter values the checker gives the block, and the check that the weights read back
  are made of them (and which, and whether a head's are another head's).
* ``modern_read``, ``modern_rotary``, ``modern_parts``, ``modern_scope`` -- the
  same for the modern block (RMSNorm, rotary, grouped heads, gated MLPs) and the parts it has
  that no reference models.
* ``receive`` -- the one check of the numbers ``plain`` sent, and the parts (a lessons' block's
  or a modern one's) built back from them.

Order inside: ``parts`` and ``provenance``; ``trace``; ``walks``; ``dataflow``;
``weights``; ``mapping``, ``given``, ``readings``, ``plain``;
then the modern files; ``receive``.
"""
