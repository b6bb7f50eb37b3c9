"""``python -m headwater`` and the ``headwater`` console script."""

import sys

from core import stop_request

if "--follow" in sys.argv[1:]:
    # Before the imports below (a second or more): a stop asked meanwhile is kept, not lost, and
    # the command stops cleanly once it can (core.stop_request).
    stop_request.listen()

from headwater.cli import exit_quietly, main


def run() -> None:
    """Console-script entry point: exit with the CLI's status."""
    exit_quietly()
    sys.exit(main())


if __name__ == "__main__":
    run()
