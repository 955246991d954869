"""``python -m vsbayes``: same as the ``vsbayes`` command."""

import sys

from .cli import main

sys.exit(main())
