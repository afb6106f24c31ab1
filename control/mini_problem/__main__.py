"""``python -m andrea.control.mini_problem``."""

import sys

from .cli import main

sys.exit(main())
