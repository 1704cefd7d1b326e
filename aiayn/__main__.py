"""`python -m aiayn`: the same as the `aiayn` command."""

import sys

from aiayn.cli import main

sys.exit(main())
