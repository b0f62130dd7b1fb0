"""`python -m pynode ...`: the command line (pynode.cli.main)."""

import os
import sys

if __name__ == "__main__":
    try:
        # a Ctrl-C while the command line loads (its imports, ~0.3 s) or parses its flags
        # ends it as one later does, not with a traceback through the imports
        from pynode.cli.main import main

        code = main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    gloo = sys.modules.get("pynode.comm.gloo")
    if gloo is not None and gloo.stranded():  # its C++ thread must not outlive the interpreter
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
