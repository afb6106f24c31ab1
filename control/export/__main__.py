"""`python -m andrea.control.export`: the export's command line (control/export/bundle.py)."""

import sys

from andrea.control.export.bundle import main

sys.exit(main())
