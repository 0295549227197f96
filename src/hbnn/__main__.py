"""``python -m hbnn``: the same as the ``hbnn`` console script."""

import sys

from hbnn.cli import main

if __name__ == "__main__":
    sys.exit(main())
