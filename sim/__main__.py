"""``python -m sim`` runs the ``trellis-sim`` command line."""

import sys

from sim.cli import main

sys.exit(main())
