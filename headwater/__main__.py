"""``python -m headwater`` and the ``headwater`` console script."""

import os
import sys

# Headwater does no linear algebra, but numpy (which pyarrow, pandas and pyspark import) starts
# OpenBLAS with a thread per core, and each spins about 0.1 CPU s before it sleeps: in this process
# and in every Python process Spark starts for it, which inherit this environment. One thread: none
# spin (measured: 0.46 -> 0.35 CPU s for `headwater --help`). A user's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

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
