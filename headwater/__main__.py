"""``python -m headwater`` and the ``headwater`` console script."""

import sys

from headwater.cli import main


def run() -> None:
    """Console-script entry point: exit with the CLI's status."""
    sys.exit(main())


if __name__ == "__main__":
    run()
