"""``python -m andrea.control.verify_resume``."""

import sys

from . import main

sys.exit(main())
