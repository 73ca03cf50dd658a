"""The block in child processes that only answer requests.

* ``check`` -- ``check_isolated``: every check and reading computed here from the children's
  answers, with a timeout, at both sizes (``two_sizes``, for a check in this process too);
  ``ask_isolated``: other requests (``gptblock exercises --on``'s).
* ``remote`` -- the block's answers, as claims.
* ``child`` -- starting them (``gptblock.early``: as soon as ``gptblock check`` starts), asking
  and stopping them, under names and an environment that do not name the checker; ``reaper`` --
  the supervisor that imports torch, forks them and kills their whole process tree (a script:
  the standard library and torch only).
* ``worker`` -- ``Served``: the block where it runs, answering the checker's requests (its
  width, outputs, gradients, parameters, its parts read into numbers) as plain data; and the
  builder process, which loads and builds the block (at the file's sizes, then at others) and
  serves it.

Order inside: ``reaper``; ``child``; ``worker``; ``remote``; ``check``.
"""
