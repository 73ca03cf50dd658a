"""``python -m gptblock`` runs the command-line interface."""

from .cli import script

if __name__ == "__main__":
    script()
