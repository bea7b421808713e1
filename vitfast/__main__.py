"""`python -m vitfast ...` is the `vitfast` command (see vitfast/cli.py)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
