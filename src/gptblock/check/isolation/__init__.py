"""The block in child processes that only answer requests (``check.check_isolated``).
Order: ``reaper``; ``child``; ``worker`` (its ``Remote``: the checker's view); ``check``."""
