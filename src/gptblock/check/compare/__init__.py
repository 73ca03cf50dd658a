"""Comparing the block with the reference, and deciding (``verdict.decide``).
Order inside: ``probes``; ``conditions``; ``modern``; ``verdict``."""
