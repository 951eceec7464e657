"""``python -m kernkit.jit``: see ``kernkit.jit.cli`` (``-h`` lists the subcommands)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
