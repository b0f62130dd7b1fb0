"""`python -m pynode ...`: the command line (pynode.cli.main)."""

import sys

from pynode.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
