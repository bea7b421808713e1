"""`python -m vitfast ...` is the `vitfast` command (see vitfast/cli/)."""
import sys

from vitfast.cli import main

if __name__ == "__main__":
    sys.exit(main())
