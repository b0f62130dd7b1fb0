"""`python -m pynode ...`: the command line (pynode.cli.main)."""

import sys

if __name__ == "__main__":
    try:
        # a Ctrl-C while the command line loads (its imports, ~0.3 s) or parses its flags
        # ends it as one later does, not with a traceback through the imports
        from pynode.cli.main import main

        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
