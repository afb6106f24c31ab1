"""`python -m andrea.control.export`: the export's command line (control/export/bundle.py)."""

import sys

from .bundle import main

sys.exit(main())
