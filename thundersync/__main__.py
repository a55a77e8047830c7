"""``python -m thundersync ...``: the same command line as the ``thundersync`` script.

Guarded: a worker process started with ``spawn`` imports the parent's main module again (as
``__mp_main__``), and must not run the command a second time."""

import sys

from thundersync.cli import main

if __name__ == "__main__":
    sys.exit(main())
