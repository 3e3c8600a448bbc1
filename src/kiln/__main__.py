"""``python -m kiln``: the command line, the same as the ``kiln`` script
(for an environment whose scripts folder is not on PATH)."""

import sys

from kiln.cli import main

sys.exit(main())
