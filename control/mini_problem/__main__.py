"""``python -m andrea.control.mini_problem``."""

import sys

from andrea.control.mini_problem.cli import main

sys.exit(main())
