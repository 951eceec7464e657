"""``python -m kernkit.jit``: the developer tools of ``kernkit.cli.cli`` (``-h`` lists them)."""

import sys

from kernkit.cli.cli import main

if __name__ == "__main__":
    sys.exit(main())
