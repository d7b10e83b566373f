"""``python -m pipeline`` runs the command-line interface."""

import sys

from pipeline.cli import main

sys.exit(main())
