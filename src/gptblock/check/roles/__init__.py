"""Finding the roles (q, k, v, proj, fc1, fc2, the norms) and reading their weights as numbers:
``trace``/``cores``/``dataflow``/``weights`` from the forward pass, ``parts``/``mapping`` by the
module tree, ``given`` (``--map``), ``readings`` (which one), ``plain``/``provenance`` (as numbers);
``modern_*`` the same for modern blocks (docs/checker.md, "How it decides")."""
