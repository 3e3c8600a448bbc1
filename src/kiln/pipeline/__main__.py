"""`python -m kiln.pipeline ...`: the same as `kiln build ...`."""

import sys

from kiln import cli

if __name__ == "__main__":
    sys.exit(cli.main(["build", *sys.argv[1:]]))
