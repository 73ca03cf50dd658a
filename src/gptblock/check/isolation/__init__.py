"""The block in child processes that only answer requests.

* ``isolation`` -- ``check_isolated``: every check and reading computed here from the children's
  answers, with a timeout (``ask_isolated``: other requests, ``gptblock exercises --on``'s);
  ``sized`` -- the check at both sizes, one report.
* ``remote`` -- the block's answers, as claims; ``served`` -- ``Served``: the block where it runs,
  answering the checker's requests (its width, outputs, gradients, parameters, its parts read
  into numbers) as plain data.
* ``child`` -- starting them (``gptblock.early``: as soon as ``gptblock check`` starts), asking
  and stopping them, under names and an environment that do not name the checker; ``reaper`` --
  the supervisor that imports torch, forks them and kills their whole process tree (a script:
  the standard library and torch only).
* ``worker`` -- the builder: loads and builds the block (at the file's sizes, then at others),
  tells its width and reads it by names.

Order inside: ``reaper``; ``child``; ``served``; ``remote``; ``worker``; ``sized``; ``isolation``.
"""
