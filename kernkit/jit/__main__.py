"""``python -m kernkit.jit``: the developer tools of ``kernkit.tools.cli`` (``-h`` lists them)."""

import sys

from kernkit.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
