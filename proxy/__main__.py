"""``python -m proxy serve …`` — the same as the ``radixgate`` console script."""

import sys

from proxy.cli import main

sys.exit(main())
