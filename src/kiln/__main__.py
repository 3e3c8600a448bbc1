"""`python -m kiln ...`: the same as the `kiln` command (no entry point needed)."""

import sys

from kiln import cli

if __name__ == "__main__":
    sys.exit(cli.main())
