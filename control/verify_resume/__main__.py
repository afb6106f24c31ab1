"""``python -m andrea.control.verify_resume``."""

import sys

from andrea.control.verify_resume import main

sys.exit(main())
