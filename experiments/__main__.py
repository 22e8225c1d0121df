"""`python -m experiments`: see experiments.cli."""
import sys

from .cli import main

sys.exit(main())
