"""``python -m simgrid`` runs the CLI."""

import sys

from simgrid.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
